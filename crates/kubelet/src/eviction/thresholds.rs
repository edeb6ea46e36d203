//! Eviction thresholds (upstream's eviction/api and the parsing half of helpers.go): the
//! signals, `signal<quantity|percentage` statements, soft grace periods, minimum reclaim,
//! and the comparison of a threshold with an observation.

use nodus_k8s::quantity::{Format, ParsedQuantity, parse_quantity};
use std::collections::BTreeMap;
use std::time::Duration;

/// An eviction signal (upstream's evictionapi.Signal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    MemoryAvailable,
    AllocatableMemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    PidAvailable,
}

impl Signal {
    pub const ALL: [Signal; 7] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    pub fn parse(s: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// The resource reclaimed when the signal crosses its threshold (upstream's
    /// signalToResource): what eviction messages and the `EvictionThresholdMet` event name.
    pub fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => "memory",
            Signal::NodeFsAvailable | Signal::ImageFsAvailable => "ephemeral-storage",
            Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => "inodes",
            Signal::PidAvailable => "pids",
        }
    }

    /// The node condition a met threshold of this signal raises (upstream's
    /// signalToNodeCondition).
    pub fn node_condition(self) -> &'static str {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => MEMORY_PRESSURE,
            Signal::PidAvailable => PID_PRESSURE,
            _ => DISK_PRESSURE,
        }
    }

    /// How observed amounts print: bytes in binary SI, counts in decimal SI.
    pub fn format(self) -> Format {
        match self {
            Signal::NodeFsInodesFree | Signal::ImageFsInodesFree | Signal::PidAvailable => {
                Format::DecimalSI
            }
            _ => Format::BinarySI,
        }
    }
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

pub const MEMORY_PRESSURE: &str = "MemoryPressure";
pub const DISK_PRESSURE: &str = "DiskPressure";
pub const PID_PRESSURE: &str = "PIDPressure";

/// A threshold's value: an absolute quantity, or a fraction of the signal's capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Quantity(ParsedQuantity),
    /// 0 < fraction < 1.
    Percentage(f64),
}

impl Value {
    /// The value in absolute units against `capacity` (upstream's GetThresholdQuantity:
    /// a percentage becomes a binary SI quantity, truncated).
    pub fn resolve(&self, capacity: i64) -> ParsedQuantity {
        match self {
            Value::Quantity(q) => *q,
            Value::Percentage(p) => {
                let v = (capacity as f64 * p) as i64;
                ParsedQuantity::from_nanos(i128::from(v) * 1_000_000_000, Format::BinarySI)
            }
        }
    }
}

/// One eviction threshold (upstream's evictionapi.Threshold; the operator is always `<`).
#[derive(Clone, Debug, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: Value,
    /// Zero for a hard threshold.
    pub grace_period: Duration,
    pub min_reclaim: Option<Value>,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }
}

/// What the kubelet saw for one signal: how much is left, out of how much.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    pub available: i64,
    pub capacity: i64,
}

pub type Observations = BTreeMap<Signal, Observation>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ThresholdError(pub String);

fn err<T>(s: String) -> Result<T, ThresholdError> {
    Err(ThresholdError(s))
}

fn signal(s: &str) -> Result<Signal, ThresholdError> {
    Signal::parse(s).ok_or_else(|| ThresholdError(format!("unsupported eviction signal {s}")))
}

/// Splits `--eviction-hard`/`--eviction-soft` text (`memory.available<100Mi,…`) into a map;
/// any other comparison is refused by name, since every signal is "less than".
pub fn parse_statements(
    flag: &str,
    text: &str,
) -> Result<BTreeMap<String, String>, ThresholdError> {
    let mut m = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once('<') else {
            let op = [">=", "<=", ">", "=", "!="]
                .into_iter()
                .find(|op| part.contains(op));
            return match op {
                Some(op) => err(format!(
                    "--{flag}: unsupported operator {op:?} in {part:?}: eviction thresholds are written SIGNAL<VALUE"
                )),
                None => err(format!(
                    "--{flag}: malformed pair {part:?}, expect string<string"
                )),
            };
        };
        if v.starts_with('=') {
            return err(format!(
                "--{flag}: unsupported operator \"<=\" in {part:?}: eviction thresholds are written SIGNAL<VALUE"
            ));
        }
        m.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(m)
}

fn percentage(signal: Signal, val: &str) -> Result<f64, ThresholdError> {
    let p: f64 = val
        .trim_end_matches('%')
        .parse()
        .map_err(|_| ThresholdError(format!("invalid percentage {val:?} for {signal}")))?;
    Ok(p / 100.0)
}

/// One `signal<value` statement; `None` for the values upstream treats as "no threshold"
/// (0% and 100%).
fn parse_statement(key: &str, val: &str) -> Result<Option<Threshold>, ThresholdError> {
    let signal = signal(key)?;
    let value = if val.ends_with('%') {
        if val == "0%" || val == "100%" {
            return Ok(None);
        }
        let p = percentage(signal, val)?;
        if p < 0.0 {
            return err(format!(
                "eviction percentage threshold {signal} must be >= 0%: {val}"
            ));
        }
        if p > 1.0 {
            return err(format!(
                "eviction percentage threshold {signal} must be <= 100%: {val}"
            ));
        }
        Value::Percentage(p)
    } else {
        let q = parse_quantity(val).map_err(|e| {
            ThresholdError(format!(
                "invalid eviction threshold {val:?} for {signal}: {e}"
            ))
        })?;
        if q.nano_value() <= 0 {
            return err(format!(
                "eviction threshold {signal} must be positive: {val}"
            ));
        }
        Value::Quantity(q)
    };
    Ok(Some(Threshold {
        signal,
        value,
        grace_period: Duration::ZERO,
        min_reclaim: None,
    }))
}

fn parse_min_reclaim(key: &str, val: &str) -> Result<(Signal, Value), ThresholdError> {
    let signal = signal(key)?;
    if val.ends_with('%') {
        let p = percentage(signal, val)?;
        if p <= 0.0 {
            return err(format!(
                "eviction percentage minimum reclaim {signal} must be positive: {val}"
            ));
        }
        if p > 1.0 {
            return err(format!(
                "eviction percentage minimum reclaim {signal} must be <= 100%: {val}"
            ));
        }
        return Ok((signal, Value::Percentage(p)));
    }
    let q = parse_quantity(val).map_err(|e| {
        ThresholdError(format!(
            "invalid eviction minimum reclaim {val:?} for {signal}: {e}"
        ))
    })?;
    if q.nano_value() < 0 {
        return err(format!(
            "negative eviction minimum reclaim specified for {signal}"
        ));
    }
    Ok((signal, Value::Quantity(q)))
}

/// The thresholds from the four settings, as upstream's ParseThresholdConfig: every soft
/// threshold needs a grace period; minimum reclaim applies to hard and soft alike; with
/// `enforce_pods` (enforceNodeAllocatable has `pods`) a hard memory.available threshold is
/// mirrored as allocatableMemory.available.
pub fn parse_config(
    hard: &BTreeMap<String, String>,
    soft: &BTreeMap<String, String>,
    soft_grace: &BTreeMap<String, String>,
    min_reclaim: &BTreeMap<String, String>,
    enforce_pods: bool,
) -> Result<Vec<Threshold>, ThresholdError> {
    let mut out = Vec::new();
    for (k, v) in hard {
        out.extend(parse_statement(k, v)?);
    }
    let mut graces = BTreeMap::new();
    for (k, v) in soft_grace {
        let s = signal(k)?;
        let d = nodus_k8s::duration::parse_duration(v).map_err(|e| {
            ThresholdError(format!(
                "invalid eviction grace period specified: {v}, must be a positive value ({e})"
            ))
        })?;
        graces.insert(s, d);
    }
    for (k, v) in soft {
        if let Some(mut t) = parse_statement(k, v)? {
            let Some(g) = graces.get(&t.signal) else {
                return err(format!(
                    "grace period must be specified for the soft eviction threshold {}",
                    t.signal
                ));
            };
            // A zero grace period would make it hard; upstream keeps it soft only when > 0.
            t.grace_period = (*g).max(Duration::from_nanos(1));
            out.push(t);
        }
    }
    let mut reclaims = BTreeMap::new();
    for (k, v) in min_reclaim {
        let (s, val) = parse_min_reclaim(k, v)?;
        reclaims.insert(s, val);
    }
    for t in &mut out {
        if let Some(r) = reclaims.get(&t.signal) {
            t.min_reclaim = Some(*r);
        }
    }
    if enforce_pods {
        let extra: Vec<Threshold> = out
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
            .map(|t| Threshold {
                signal: Signal::AllocatableMemoryAvailable,
                ..t.clone()
            })
            .collect();
        out.extend(extra);
    }
    Ok(out)
}

/// The thresholds whose signal is below them now; with `enforce_min_reclaim`, below them
/// plus their minimum reclaim (upstream's thresholdsMet).
pub fn thresholds_met(
    thresholds: &[Threshold],
    obs: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = obs.get(&t.signal) else {
                return false;
            };
            let mut q = i128::from(t.value.resolve(o.capacity).value());
            if enforce_min_reclaim && let Some(r) = &t.min_reclaim {
                q += i128::from(r.resolve(o.capacity).value());
            }
            q > i128::from(o.available)
        })
        .cloned()
        .collect()
}

/// Prints an amount the way upstream's resource.Quantity does (`50Mi`, `1234567`, `12k`).
pub fn format_amount(v: i64, format: Format) -> String {
    ParsedQuantity::from_nanos(i128::from(v) * 1_000_000_000, format).canonical()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_quantities_and_percentages() {
        let t = parse_config(
            &map(&[("memory.available", "100Mi"), ("nodefs.available", "10%")]),
            &map(&[("imagefs.available", "20%")]),
            &map(&[("imagefs.available", "1m30s")]),
            &map(&[("memory.available", "50Mi")]),
            false,
        )
        .unwrap();
        assert_eq!(t.len(), 3);
        let mem = t
            .iter()
            .find(|t| t.signal == Signal::MemoryAvailable)
            .unwrap();
        assert!(mem.is_hard());
        assert_eq!(mem.value.resolve(0).value(), 100 << 20);
        assert_eq!(mem.min_reclaim.unwrap().resolve(0).value(), 50 << 20);
        let nodefs = t
            .iter()
            .find(|t| t.signal == Signal::NodeFsAvailable)
            .unwrap();
        assert_eq!(nodefs.value.resolve(1000).value(), 100);
        let img = t
            .iter()
            .find(|t| t.signal == Signal::ImageFsAvailable)
            .unwrap();
        assert_eq!(img.grace_period, Duration::from_secs(90));
        assert!(!img.is_hard());
    }

    #[test]
    fn allocatable_memory_mirrors_hard_memory_when_pods_are_enforced() {
        let t = parse_config(
            &map(&[("memory.available", "100Mi")]),
            &map(&[]),
            &map(&[]),
            &map(&[]),
            true,
        )
        .unwrap();
        assert!(
            t.iter()
                .any(|t| t.signal == Signal::AllocatableMemoryAvailable)
        );
    }

    #[test]
    fn zero_and_full_percentages_mean_no_threshold() {
        let t = parse_config(
            &map(&[("nodefs.available", "0%"), ("imagefs.available", "100%")]),
            &map(&[]),
            &map(&[]),
            &map(&[]),
            false,
        )
        .unwrap();
        assert!(t.is_empty());
    }

    #[test]
    fn errors_name_the_signal_or_operator() {
        let e = |hard: &[(&str, &str)]| {
            parse_config(&map(hard), &map(&[]), &map(&[]), &map(&[]), false)
                .unwrap_err()
                .0
        };
        assert_eq!(
            e(&[("memory.avail", "1Mi")]),
            "unsupported eviction signal memory.avail"
        );
        assert_eq!(
            e(&[("memory.available", "-1Mi")]),
            "eviction threshold memory.available must be positive: -1Mi"
        );
        assert_eq!(
            e(&[("nodefs.available", "120%")]),
            "eviction percentage threshold nodefs.available must be <= 100%: 120%"
        );
        assert!(e(&[("nodefs.available", "1Gx")]).contains("nodefs.available"));
        let soft = parse_config(
            &map(&[]),
            &map(&[("memory.available", "1Gi")]),
            &map(&[]),
            &map(&[]),
            false,
        )
        .unwrap_err();
        assert_eq!(
            soft.0,
            "grace period must be specified for the soft eviction threshold memory.available"
        );
        let op = parse_statements("eviction-hard", "memory.available>100Mi").unwrap_err();
        assert!(op.0.contains("unsupported operator \">\""), "{op}");
        let op = parse_statements("eviction-hard", "memory.available<=100Mi").unwrap_err();
        assert!(op.0.contains("\"<=\""), "{op}");
        let ok =
            parse_statements("eviction-hard", "memory.available<1Gi, nodefs.available<5%").unwrap();
        assert_eq!(ok["nodefs.available"], "5%");
        let r = parse_config(
            &map(&[]),
            &map(&[]),
            &map(&[]),
            &map(&[("pid.available", "-5")]),
            false,
        )
        .unwrap_err();
        assert_eq!(
            r.0,
            "negative eviction minimum reclaim specified for pid.available"
        );
    }

    #[test]
    fn met_when_available_is_below_the_threshold_plus_reclaim() {
        let t = parse_config(
            &map(&[("memory.available", "100Mi")]),
            &map(&[]),
            &map(&[]),
            &map(&[("memory.available", "50Mi")]),
            false,
        )
        .unwrap();
        let obs = |avail: i64| {
            Observations::from([(
                Signal::MemoryAvailable,
                Observation {
                    available: avail,
                    capacity: 1 << 30,
                },
            )])
        };
        assert_eq!(thresholds_met(&t, &obs(99 << 20), false).len(), 1);
        assert!(thresholds_met(&t, &obs(100 << 20), false).is_empty());
        assert_eq!(thresholds_met(&t, &obs(120 << 20), true).len(), 1);
        assert!(thresholds_met(&t, &obs(150 << 20), true).is_empty());
        assert!(thresholds_met(&t, &Observations::new(), false).is_empty());
    }

    #[test]
    fn amounts_print_like_quantities() {
        assert_eq!(format_amount(50 << 20, Format::BinarySI), "50Mi");
        assert_eq!(format_amount(1_234_567, Format::BinarySI), "1234567");
        assert_eq!(format_amount(12_000, Format::DecimalSI), "12k");
    }
}
