//! Time presentation as crictl (Go) prints it, on top of chrono: go-units' human
//! durations, Go's RFC 3339 and `time.Time.String()` layouts, Go's zero time, and Docker's
//! `--since` values.

use chrono::{DateTime, FixedOffset, Local, NaiveDateTime, Offset, TimeZone, Timelike, Utc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch, now.
pub fn now_ns() -> i128 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

/// go-units' `HumanDuration`: "Less than a second", "1 second", "About a minute", …
pub fn human_duration(d: Duration) -> String {
    let seconds = d.as_secs();
    if seconds < 1 {
        return "Less than a second".into();
    }
    if seconds == 1 {
        return "1 second".into();
    }
    if seconds < 60 {
        return format!("{seconds} seconds");
    }
    let minutes = seconds / 60;
    if minutes == 1 {
        return "About a minute".into();
    }
    if minutes < 60 {
        return format!("{minutes} minutes");
    }
    let hours_f = d.as_secs_f64() / 3600.0;
    let hours = (hours_f + 0.5) as u64;
    if hours == 1 {
        return "About an hour".into();
    }
    if hours < 48 {
        return format!("{hours} hours");
    }
    if hours < 24 * 7 * 2 {
        return format!("{} days", hours / 24);
    }
    if hours < 24 * 30 * 2 {
        return format!("{} weeks", hours / 24 / 7);
    }
    if hours < 24 * 365 * 2 {
        return format!("{} months", hours / 24 / 30);
    }
    format!("{} years", (hours_f as u64) / 24 / 365)
}

/// `HumanDuration(now - t) + " ago"` for a CRI nanosecond timestamp.
pub fn ago(ns: i64, now_ns: i128) -> String {
    let diff = now_ns - ns as i128;
    let d = if diff <= 0 {
        Duration::ZERO
    } else {
        Duration::from_nanos(diff.min(u64::MAX as i128) as u64)
    };
    format!("{} ago", human_duration(d))
}

/// Go's zero `time.Time` in RFC 3339 (what crictl prints for unset times).
pub const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// Go's `.999999999` layout element: the fraction with trailing zeros removed.
fn go_fraction(nanos: u32) -> String {
    if nanos == 0 {
        return String::new();
    }
    format!(".{nanos:09}").trim_end_matches('0').to_string()
}

/// Go's `time.RFC3339Nano` layout (`Z` for a zero offset, trailing zeros cut).
fn rfc3339_nano<Tz: TimeZone>(t: &DateTime<Tz>) -> String
where
    Tz::Offset: std::fmt::Display,
{
    let offset = t.offset().fix();
    let zone = if offset.local_minus_utc() == 0 {
        "Z".to_string()
    } else {
        offset.to_string()
    };
    format!(
        "{}{}{zone}",
        t.format("%Y-%m-%dT%H:%M:%S"),
        go_fraction(t.nanosecond())
    )
}

/// A CRI nanosecond timestamp in RFC 3339 in the local zone, as crictl's inspect prints it.
pub fn rfc3339_local(ns: i64) -> String {
    rfc3339_nano(&Local.timestamp_nanos(ns))
}

/// Go's `time.Time.String()` of `time.Unix(0, ns)`: `2006-01-02 15:04:05.999999999 -0700 MST`.
pub fn go_time_string(ns: i64) -> String {
    let t = Local.timestamp_nanos(ns);
    let offset = t.format("%z").to_string();
    let abbrev = zone_abbreviation(ns.div_euclid(1_000_000_000)).unwrap_or_else(|| offset.clone());
    format!(
        "{}{} {offset} {abbrev}",
        t.format("%Y-%m-%d %H:%M:%S"),
        go_fraction(t.nanosecond())
    )
}

/// The local zone's abbreviation ("UTC", "CET", …) at `unix_secs`, from the C library
/// (chrono's `Local` knows offsets only).
fn zone_abbreviation(unix_secs: i64) -> Option<String> {
    let t = libc::time_t::try_from(unix_secs).ok()?;
    // SAFETY: `localtime_r` writes only into `tm`; `tm_zone` then points at a
    // NUL-terminated string owned by the C library (static zone data).
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() || tm.tm_zone.is_null() {
            return None;
        }
        let name = std::ffi::CStr::from_ptr(tm.tm_zone).to_string_lossy();
        (!name.is_empty()).then(|| name.into_owned())
    }
}

/// Go's `time.ParseDuration`: `300ms`, `-1.5h`, `2h45m`. Nanoseconds.
pub fn parse_go_duration(s: &str) -> Option<i128> {
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let n_end = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        if n_end == 0 {
            return None;
        }
        let n: f64 = rest[..n_end].parse().ok()?;
        rest = &rest[n_end..];
        let u_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..u_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[u_end..];
        total += n * unit;
    }
    let v = total as i128;
    Some(if neg { -v } else { v })
}

/// Docker's `GetTimestamp` + `ParseTimestamps`, as `crictl logs --since` reads its value: a
/// Go duration before `now`, an RFC 3339-like time (in `now`'s zone when none is given), or
/// a Unix timestamp `SECONDS[.NANOS]`.
pub fn parse_since<Tz: TimeZone>(value: &str, now: &DateTime<Tz>) -> Result<DateTime<Utc>, String> {
    let invalid = || format!("failed to parse value as time or duration: {value:?}");
    if value != "0"
        && let Some(d) = parse_go_duration(value)
    {
        // Docker truncates the reference to whole seconds.
        let secs = (now.timestamp() as i128 * 1_000_000_000 + now.timestamp_subsec_nanos() as i128
            - d)
            .div_euclid(1_000_000_000);
        return i64::try_from(secs)
            .ok()
            .and_then(|s| DateTime::from_timestamp(s, 0))
            .ok_or_else(invalid);
    }
    if let Some(t) = parse_loose_time(value, now.offset().fix()) {
        return Ok(t.to_utc());
    }
    if value.contains('-') {
        return Err(format!(
            "parsing time {value:?}: cannot parse as a timestamp"
        ));
    }
    let (secs, frac) = value.split_once('.').unwrap_or((value, ""));
    let secs: i64 = secs.parse().map_err(|_| invalid())?;
    let mut nanos = 0;
    if !frac.is_empty() {
        if !frac.bytes().all(|c| c.is_ascii_digit()) {
            return Err(invalid());
        }
        nanos = format!("{:0<9}", &frac[..frac.len().min(9)])
            .parse()
            .map_err(|_| invalid())?;
    }
    DateTime::from_timestamp(secs, nanos).ok_or_else(invalid)
}

/// `2006-01-02`, `2006-01-02T15`, `2006-01-02T15:04`, `2006-01-02T15:04:05[.999]`, each with
/// an optional `Z`/`±07:00` zone (`local` otherwise).
fn parse_loose_time(v: &str, local: FixedOffset) -> Option<DateTime<FixedOffset>> {
    let (body, zone) = match v.get(10..)?.find(['Z', 'z', '+', '-']) {
        Some(i) => v.split_at(10 + i),
        None => (v, ""),
    };
    let offset = match zone {
        "" => local,
        "Z" | "z" => Utc.fix(),
        z if z.len() == 6 => z.parse().ok()?,
        _ => return None,
    };
    // Fill in what the shorter forms leave out.
    let full = match body.len() {
        10 => format!("{body}T00:00:00"),
        13 => format!("{body}:00:00"),
        16 => format!("{body}:00"),
        _ => body.to_string(),
    };
    let naive = NaiveDateTime::parse_from_str(&full, "%Y-%m-%dT%H:%M:%S%.f").ok()?;
    offset.from_local_datetime(&naive).single()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NANOS: i128 = 1_000_000_000;

    #[test]
    fn human_durations_follow_go_units() {
        let s = Duration::from_secs;
        assert_eq!(
            human_duration(Duration::from_millis(300)),
            "Less than a second"
        );
        assert_eq!(human_duration(s(1)), "1 second");
        assert_eq!(human_duration(s(59)), "59 seconds");
        assert_eq!(human_duration(s(60)), "About a minute");
        assert_eq!(human_duration(s(119)), "About a minute");
        assert_eq!(human_duration(s(120)), "2 minutes");
        assert_eq!(human_duration(s(59 * 60 + 59)), "59 minutes");
        assert_eq!(human_duration(s(3600)), "About an hour");
        // 1.5 h rounds to 2 hours.
        assert_eq!(human_duration(s(5400)), "2 hours");
        assert_eq!(human_duration(s(47 * 3600)), "47 hours");
        assert_eq!(human_duration(s(48 * 3600)), "2 days");
        assert_eq!(human_duration(s(14 * 86400)), "2 weeks");
        assert_eq!(human_duration(s(60 * 86400)), "2 months");
        assert_eq!(human_duration(s(800 * 86400)), "2 years");
        assert_eq!(ago(0, 5 * NANOS), "5 seconds ago");
        // Clock skew: a creation time in the future.
        assert_eq!(ago(10_000_000_000, 0), "Less than a second ago");
    }

    #[test]
    fn rfc3339_formats_like_go() {
        let t = |ns: i64, off: i32| FixedOffset::east_opt(off).unwrap().timestamp_nanos(ns);
        let ns = 1_700_000_000_123_400_000;
        assert_eq!(rfc3339_nano(&t(ns, 0)), "2023-11-14T22:13:20.1234Z");
        assert_eq!(rfc3339_nano(&t(ns, 3600)), "2023-11-14T23:13:20.1234+01:00");
        assert_eq!(
            rfc3339_nano(&t(1_700_000_000_000_000_000, 0)),
            "2023-11-14T22:13:20Z"
        );
        assert_eq!(rfc3339_nano(&t(0, -5 * 3600)), "1969-12-31T19:00:00-05:00");
        assert_eq!(
            rfc3339_nano(&Utc.timestamp_nanos(1)),
            "1970-01-01T00:00:00.000000001Z"
        );
    }

    #[test]
    fn go_time_string_layout() {
        let s = go_time_string(1_700_000_000_500_000_000);
        // `2023-11-14 22:13:20.5 +0000 UTC` in UTC; the zone part depends on the machine.
        let (clock, zone) = s.split_at(21);
        assert!(clock.ends_with(":20.5"), "{s}");
        let parts: Vec<&str> = zone.trim().split(' ').collect();
        assert_eq!(parts.len(), 2, "{s}");
        assert!(
            parts[0].len() == 5 && parts[0].starts_with(['+', '-']),
            "{s}"
        );
        assert!(!parts[1].is_empty(), "{s}");
    }

    #[test]
    fn since_accepts_durations_times_and_unix_seconds() {
        let now = Utc.timestamp_nanos(1_700_000_000 * NANOS as i64 + 500);
        let at = |s: i64, n: u32| DateTime::from_timestamp(s, n).unwrap();
        assert_eq!(parse_since("42m", &now), Ok(at(1_700_000_000 - 42 * 60, 0)));
        assert_eq!(parse_since("1h30m", &now), Ok(at(1_700_000_000 - 5400, 0)));
        assert_eq!(
            parse_since("2023-11-14T22:13:20Z", &now),
            Ok(at(1_700_000_000, 0))
        );
        assert_eq!(
            parse_since("2023-11-14T22:13:20.5+00:00", &now),
            Ok(at(1_700_000_000, 500_000_000))
        );
        assert_eq!(
            parse_since("2023-11-14T23:13:20+01:00", &now),
            Ok(at(1_700_000_000, 0))
        );
        // Without a zone: `now`'s zone.
        assert_eq!(parse_since("2023-11-14", &now), Ok(at(1_699_920_000, 0)));
        assert_eq!(parse_since("2023-11-14T22", &now), Ok(at(1_699_999_200, 0)));
        assert_eq!(
            parse_since("2023-11-14T22:13", &now),
            Ok(at(1_699_999_980, 0))
        );
        let plus_one = FixedOffset::east_opt(3600).unwrap().timestamp_nanos(0);
        assert_eq!(
            parse_since("2023-11-14T23:13:20", &plus_one),
            Ok(at(1_700_000_000, 0))
        );
        assert_eq!(parse_since("1136073600", &now), Ok(at(1_136_073_600, 0)));
        assert_eq!(
            parse_since("1136073600.000000001", &now),
            Ok(at(1_136_073_600, 1))
        );
        assert!(parse_since("yesterday", &now).is_err());
        assert!(parse_since("2023-13-14", &now).is_err());
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("300ms"), Some(300_000_000));
        assert_eq!(parse_go_duration("-1.5h"), Some(-5_400_000_000_000));
        assert_eq!(parse_go_duration("2h45m"), Some(9_900_000_000_000));
        assert_eq!(parse_go_duration("5"), None);
        assert_eq!(parse_go_duration("0"), Some(0));
    }
}
