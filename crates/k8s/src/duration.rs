//! Go's duration syntax (`20s`, `1m30s`, `500ms`, `1h`), as Kubernetes flags and config
//! files write durations, and Go's way of printing one.

use std::time::Duration;

/// Go's time.Duration.String, to the millisecond: `3m0s`, `3m2.5s`, `1.2s` (how
/// metav1.Duration fields and upstream's messages print a duration).
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    let (m, rest) = (ms / 60_000, ms % 60_000);
    let secs = if rest % 1000 == 0 {
        format!("{}s", rest / 1000)
    } else {
        let s = format!("{}.{:03}", rest / 1000, rest % 1000);
        format!("{}s", s.trim_end_matches('0'))
    };
    if m > 0 { format!("{m}m{secs}") } else { secs }
}

/// Parses a Go duration (`20s`, `1m30s`, `500ms`, `1h`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("invalid duration {s:?}: use Go's form, e.g. 20s, 1m, 500ms");
    if s.is_empty() {
        return Err(err());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let value: f64 = rest[..n].parse().map_err(|_| err())?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        rest = &rest[u..];
        total += Duration::from_secs_f64(value * unit);
    }
    Ok(total)
}
