//! The Prometheus text exposition format (version 0.0.4), the one copy every nodus endpoint
//! that is not a `prometheus_client` registry writes and reads: family headers, samples with
//! escaped labels and optional millisecond timestamps, fixed-bucket histograms, and the
//! parser the API server reads the kubelets' `/metrics/resource` with.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// The content type of the text format, as upstream's handlers send it.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metric family's type, as the `# TYPE` line names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Writes the `# HELP` and `# TYPE` lines of a family.
pub fn family(out: &mut String, name: &str, help: &str, kind: Kind) {
    let help = help.replace('\\', r"\\").replace('\n', r"\n");
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {}", kind.as_str());
}

/// Go's `strconv.FormatFloat(v, 'g', -1, 64)` for the values a metric takes: integers
/// without a fraction, `+Inf`, `NaN`.
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Writes one sample line: `name{labels} value [timestamp_ms]`, the labels sorted by name
/// as Go's client writes them.
pub fn sample(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    value: f64,
    timestamp_ms: Option<i64>,
) {
    let mut sorted = labels.to_vec();
    sorted.sort_by_key(|(k, _)| *k);
    write_sample(out, name, &sorted, None, value, timestamp_ms);
}

/// A sample with `labels` in the given order and then `extra` (a histogram's `le`).
fn write_sample(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    extra: Option<(&str, &str)>,
    value: f64,
    timestamp_ms: Option<i64>,
) {
    out.push_str(name);
    if !labels.is_empty() || extra.is_some() {
        out.push('{');
        for (i, (k, v)) in labels.iter().chain(extra.as_ref()).enumerate() {
            if i > 0 {
                out.push(',');
            }
            let v = v
                .replace('\\', r"\\")
                .replace('"', "\\\"")
                .replace('\n', r"\n");
            let _ = write!(out, "{k}=\"{v}\"");
        }
        out.push('}');
    }
    let _ = write!(out, " {}", format_value(value));
    if let Some(ts) = timestamp_ms {
        let _ = write!(out, " {ts}");
    }
    out.push('\n');
}

/// A histogram over fixed upper bounds, updated without locks.
pub struct Histogram {
    bounds: &'static [f64],
    /// Per-bucket (not cumulative) counts; the last is `+Inf`.
    counts: Vec<AtomicU64>,
    /// The sum's f64 bits.
    sum: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    pub fn observe(&self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some((f64::from_bits(s) + v).to_bits())
            });
    }

    /// Writes the `_bucket` (cumulative, with `le` last), `_sum` and `_count` lines.
    pub fn encode(&self, out: &mut String, name: &str, labels: &[(&str, &str)]) {
        let mut labels = labels.to_vec();
        labels.sort_by_key(|(k, _)| *k);
        let mut cumulative = 0u64;
        let bucket = format!("{name}_bucket");
        for (i, c) in self.counts.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            let le = self
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| format_value(*b));
            write_sample(
                out,
                &bucket,
                &labels,
                Some(("le", &le)),
                cumulative as f64,
                None,
            );
        }
        let sum = f64::from_bits(self.sum.load(Ordering::Relaxed));
        write_sample(out, &format!("{name}_sum"), &labels, None, sum, None);
        let count = format!("{name}_count");
        write_sample(out, &count, &labels, None, cumulative as f64, None);
    }
}

/// One parsed sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a line of the text format could not be read.
#[derive(Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "text format parsing error in line {}: {}",
            self.line, self.message
        )
    }
}

impl std::error::Error for ParseError {}

/// Reads every sample of a text-format document (comments skipped).
pub fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |message: &str| ParseError {
            line: i + 1,
            message: message.to_string(),
        };
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .ok_or_else(|| err("expected a value after the metric name"))?;
        let name = &line[..name_end];
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices();
            let mut key = String::new();
            let mut end = None;
            while let Some((at, c)) = chars.next() {
                match c {
                    '}' => {
                        end = Some(at + 1);
                        break;
                    }
                    ',' | ' ' => {}
                    '=' => {
                        if chars.next().map(|(_, c)| c) != Some('"') {
                            return Err(err("expected '\"' after '='"));
                        }
                        let mut value = String::new();
                        loop {
                            match chars.next() {
                                Some((_, '"')) => break,
                                Some((_, '\\')) => match chars.next() {
                                    Some((_, 'n')) => value.push('\n'),
                                    Some((_, c)) => value.push(c),
                                    None => return Err(err("unterminated label value")),
                                },
                                Some((_, c)) => value.push(c),
                                None => return Err(err("unterminated label value")),
                            }
                        }
                        labels.push((std::mem::take(&mut key), value));
                    }
                    c => key.push(c),
                }
            }
            let end = end.ok_or_else(|| err("unterminated label set"))?;
            rest = &body[end..];
        }
        let mut fields = rest.split_whitespace();
        let value = fields
            .next()
            .ok_or_else(|| err("expected a value"))
            .and_then(|v| match v {
                "+Inf" => Ok(f64::INFINITY),
                "-Inf" => Ok(f64::NEG_INFINITY),
                "NaN" => Ok(f64::NAN),
                v => v.parse().map_err(|_| err(&format!("invalid value {v:?}"))),
            })?;
        let timestamp_ms = match fields.next() {
            Some(t) => Some(
                t.parse()
                    .map_err(|_| err(&format!("invalid timestamp {t:?}")))?,
            ),
            None => None,
        };
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
            timestamp_ms,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_round_trip_with_escaped_labels_and_timestamps() {
        let mut out = String::new();
        family(
            &mut out,
            "node_cpu_usage_seconds_total",
            "Cumulative cpu time",
            Kind::Counter,
        );
        sample(
            &mut out,
            "container_memory_working_set_bytes",
            &[("container", "a\"b"), ("pod", "p\\q")],
            4096.0,
            Some(1_700_000_000_123),
        );
        sample(&mut out, "scrape_error", &[], 0.0, None);
        assert!(out.contains("# TYPE node_cpu_usage_seconds_total counter\n"));
        assert!(out.contains(
            "container_memory_working_set_bytes{container=\"a\\\"b\",pod=\"p\\\\q\"} 4096 1700000000123\n"
        ));
        let parsed = parse(&out).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0].label("container"), Some("a\"b"));
        assert_eq!(parsed[0].label("pod"), Some("p\\q"));
        assert_eq!(parsed[0].value, 4096.0);
        assert_eq!(parsed[0].timestamp_ms, Some(1_700_000_000_123));
        assert_eq!(parsed[1].name, "scrape_error");
        assert_eq!(parsed[1].timestamp_ms, None);
    }

    #[test]
    fn values_print_as_go_does() {
        assert_eq!(format_value(2.5), "2.5");
        assert_eq!(format_value(3.0), "3");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        static B: &[f64] = &[0.1, 1.0];
        let h = Histogram::new(B);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(5.0);
        let mut out = String::new();
        h.encode(&mut out, "d", &[("verb", "GET")]);
        assert!(
            out.contains("d_bucket{verb=\"GET\",le=\"0.1\"} 1\n"),
            "{out}"
        );
        assert!(out.contains("d_bucket{verb=\"GET\",le=\"1\"} 2\n"), "{out}");
        assert!(
            out.contains("d_bucket{verb=\"GET\",le=\"+Inf\"} 3\n"),
            "{out}"
        );
        assert!(out.contains("d_count{verb=\"GET\"} 3\n"), "{out}");
        assert!(out.contains("d_sum{verb=\"GET\"} 5.55\n"), "{out}");
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let e = parse("a 1\nb{x=\"1\" 2\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(parse("a notanumber").is_err());
    }
}
