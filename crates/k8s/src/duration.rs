//! Go's duration syntax (`20s`, `1m30s`, `500ms`, `1h`), as Kubernetes flags and config
//! files write durations.

use std::time::Duration;

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
