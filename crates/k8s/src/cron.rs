//! CronJob schedules as upstream parses them (robfig/cron v3 `ParseStandard`): five fields
//! (minute, hour, day of month, month, day of week) with `*`, `?`, ranges, steps, lists and
//! the names JAN–DEC / SUN–SAT, or a descriptor (`@yearly` … `@hourly`, `@every <duration>`),
//! and the next activation time after an instant in a time zone. Error texts are robfig's,
//! which the API server returns verbatim in its 422s.

use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// Set for a field written as `*` or `?` (robfig's starBit): day-of-month and day-of-week
/// are ANDed when either is a star, ORed otherwise.
const STAR: u64 = 1 << 63;

#[derive(Clone, Copy)]
struct Bounds {
    min: u32,
    max: u32,
    names: &'static [(&'static str, u32)],
}

const MINUTES: Bounds = Bounds {
    min: 0,
    max: 59,
    names: &[],
};
const HOURS: Bounds = Bounds {
    min: 0,
    max: 23,
    names: &[],
};
const DOM: Bounds = Bounds {
    min: 1,
    max: 31,
    names: &[],
};
const MONTHS: Bounds = Bounds {
    min: 1,
    max: 12,
    names: &[
        ("jan", 1),
        ("feb", 2),
        ("mar", 3),
        ("apr", 4),
        ("may", 5),
        ("jun", 6),
        ("jul", 7),
        ("aug", 8),
        ("sep", 9),
        ("oct", 10),
        ("nov", 11),
        ("dec", 12),
    ],
};
const DOW: Bounds = Bounds {
    min: 0,
    max: 6,
    names: &[
        ("sun", 0),
        ("mon", 1),
        ("tue", 2),
        ("wed", 3),
        ("thu", 4),
        ("fri", 5),
        ("sat", 6),
    ],
};

/// A parsed schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Bit sets per field (bit n = value n), [`STAR`] marking `*`.
    Spec {
        minute: u64,
        hour: u64,
        dom: u64,
        month: u64,
        dow: u64,
    },
    /// `@every <duration>`: activations at a fixed interval, rounded to whole seconds.
    Every(std::time::Duration),
}

fn parse_int(expr: &str) -> Result<u32, String> {
    let n: i64 = expr.parse().map_err(|_| {
        format!("failed to parse int from {expr}: strconv.Atoi: parsing {expr:?}: invalid syntax")
    })?;
    if n < 0 {
        return Err(format!("negative number ({n}) not allowed: {expr}"));
    }
    u32::try_from(n).map_err(|_| {
        format!(
            "failed to parse int from {expr}: strconv.Atoi: parsing {expr:?}: value out of range"
        )
    })
}

fn int_or_name(expr: &str, b: Bounds) -> Result<u32, String> {
    let lower = expr.to_ascii_lowercase();
    if let Some((_, v)) = b.names.iter().find(|(n, _)| *n == lower) {
        return Ok(*v);
    }
    parse_int(expr)
}

fn bits(start: u32, end: u32, step: u32) -> u64 {
    (start..=end)
        .step_by(step as usize)
        .fold(0, |acc, i| acc | (1u64 << i))
}

fn range(expr: &str, b: Bounds) -> Result<u64, String> {
    let range_and_step: Vec<&str> = expr.split('/').collect();
    let low_high: Vec<&str> = range_and_step[0].split('-').collect();
    let single = low_high.len() == 1;
    let (start, mut end, mut extra) = if low_high[0] == "*" || low_high[0] == "?" {
        (b.min, b.max, STAR)
    } else {
        let start = int_or_name(low_high[0], b)?;
        let end = match low_high.len() {
            1 => start,
            2 => int_or_name(low_high[1], b)?,
            _ => return Err(format!("too many hyphens: {expr}")),
        };
        (start, end, 0)
    };
    let step = match range_and_step.len() {
        1 => 1,
        2 => {
            let step = parse_int(range_and_step[1])?;
            // "N/step" means "N-max/step".
            if single {
                end = b.max;
            }
            if step > 1 {
                extra = 0;
            }
            step
        }
        _ => return Err(format!("too many slashes: {expr}")),
    };
    if start < b.min {
        return Err(format!(
            "beginning of range ({start}) below minimum ({}): {expr}",
            b.min
        ));
    }
    if end > b.max {
        return Err(format!(
            "end of range ({end}) above maximum ({}): {expr}",
            b.max
        ));
    }
    if start > end {
        return Err(format!(
            "beginning of range ({start}) beyond end of range ({end}): {expr}"
        ));
    }
    if step == 0 {
        return Err(format!("step of range should be a positive number: {expr}"));
    }
    Ok(bits(start, end, step) | extra)
}

fn field(expr: &str, b: Bounds) -> Result<u64, String> {
    expr.split(',').try_fold(0, |acc, r| Ok(acc | range(r, b)?))
}

fn all(b: Bounds) -> u64 {
    bits(b.min, b.max, 1) | STAR
}

fn descriptor(spec: &str) -> Result<Schedule, String> {
    let spec_of = |minute, hour, dom, month, dow| Schedule::Spec {
        minute,
        hour,
        dom,
        month,
        dow,
    };
    Ok(match spec {
        "@yearly" | "@annually" => spec_of(1, 1, 1 << 1, 1 << 1, all(DOW)),
        "@monthly" => spec_of(1, 1, 1 << 1, all(MONTHS), all(DOW)),
        "@weekly" => spec_of(1, 1, all(DOM), all(MONTHS), 1),
        "@daily" | "@midnight" => spec_of(1, 1, all(DOM), all(MONTHS), all(DOW)),
        "@hourly" => spec_of(1, all(HOURS), all(DOM), all(MONTHS), all(DOW)),
        _ => {
            if let Some(d) = spec.strip_prefix("@every ") {
                let dur = crate::duration::parse_duration(d)
                    .map_err(|e| format!("failed to parse duration {spec}: {e}"))?;
                // robfig rounds to a second, with at least one second.
                let secs = dur.as_secs().max(1);
                return Ok(Schedule::Every(std::time::Duration::from_secs(secs)));
            }
            return Err(format!("unrecognized descriptor: {spec}"));
        }
    })
}

/// Parses a standard cron spec. A `TZ=`/`CRON_TZ=` prefix is accepted here as robfig does;
/// the API server's validation refuses it separately ([`mentions_tz`]).
pub fn parse(spec: &str) -> Result<Schedule, String> {
    if spec.is_empty() {
        return Err("empty spec string".into());
    }
    let mut spec = spec;
    if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
        let eq = spec.find('=').unwrap_or(0);
        let sp = spec.find(' ').unwrap_or(spec.len());
        let name = &spec[eq + 1..sp.max(eq + 1)];
        if TimeZone::get(name).is_err() {
            return Err(format!(
                "provided bad location {name}: unknown time zone {name}"
            ));
        }
        spec = spec[sp..].trim();
    }
    if spec.starts_with('@') {
        return descriptor(spec);
    }
    let fields: Vec<&str> = spec.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "expected exactly 5 fields, found {}: [{}]",
            fields.len(),
            fields.join(" ")
        ));
    }
    Ok(Schedule::Spec {
        minute: field(fields[0], MINUTES)?,
        hour: field(fields[1], HOURS)?,
        dom: field(fields[2], DOM)?,
        month: field(fields[3], MONTHS)?,
        dow: field(fields[4], DOW)?,
    })
}

/// Whether the schedule names a time zone inline, which batch/v1 validation refuses.
pub fn mentions_tz(spec: &str) -> bool {
    spec.contains("TZ")
}

fn has(set: u64, v: i8) -> bool {
    set & (1u64 << (v as u32)) != 0
}

impl Schedule {
    /// The first activation strictly after `after`, in `tz`; `None` when there is none in
    /// the next five years (an impossible date such as 30 February).
    pub fn next(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let (minute, hour, dom, month, dow) = match self {
            Schedule::Every(d) => {
                // robfig: the next whole second after `after` plus the interval.
                let secs = after.as_second() + d.as_secs() as i64;
                return Timestamp::from_second(secs).ok();
            }
            Schedule::Spec {
                minute,
                hour,
                dom,
                month,
                dow,
            } => (*minute, *hour, *dom, *month, *dow),
        };
        let day_matches = |t: DateTime| {
            let d = has(dom, t.day());
            let w = has(dow, t.weekday().to_sunday_zero_offset());
            if dom & STAR != 0 || dow & STAR != 0 {
                d && w
            } else {
                d || w
            }
        };
        // Work in civil time of the zone, starting at the next whole minute.
        let local = tz.to_datetime(after);
        let mut t = local
            .with()
            .second(0)
            .subsec_nanosecond(0)
            .build()
            .ok()?
            .checked_add(1.minute())
            .ok()?;
        let limit = t.year() + 5;
        'wrap: while t.year() <= limit {
            while !has(month, t.month()) {
                t = t.first_of_month().checked_add(1.month()).ok()?;
                t = t.with().hour(0).minute(0).build().ok()?;
                if t.month() == 1 {
                    continue 'wrap;
                }
            }
            while !day_matches(t) {
                t = t
                    .with()
                    .hour(0)
                    .minute(0)
                    .build()
                    .ok()?
                    .checked_add(1.day())
                    .ok()?;
                if t.day() == 1 {
                    continue 'wrap;
                }
            }
            while !has(hour, t.hour()) {
                t = t
                    .with()
                    .minute(0)
                    .build()
                    .ok()?
                    .checked_add(1.hour())
                    .ok()?;
                if t.hour() == 0 {
                    continue 'wrap;
                }
            }
            while !has(minute, t.minute()) {
                t = t.checked_add(1.minute()).ok()?;
                if t.minute() == 0 {
                    continue 'wrap;
                }
            }
            let ts = tz.to_ambiguous_zoned(t).compatible().ok()?.timestamp();
            if ts <= after {
                // A DST fold mapped the civil time before `after`: keep looking.
                t = t.checked_add(1.minute()).ok()?;
                continue;
            }
            return Some(ts);
        }
        None
    }
}

/// An IANA time zone by name (`spec.timeZone`), from the system's zoneinfo; `None` means UTC
/// (the controller manager's local zone is UTC here).
pub fn time_zone(name: Option<&str>) -> Result<TimeZone, String> {
    match name {
        None => Ok(TimeZone::UTC),
        Some(n) => TimeZone::get(n).map_err(|_| format!("unknown time zone {n}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn parse_errors_are_robfigs() {
        let cases = [
            ("", "empty spec string"),
            ("* * * *", "expected exactly 5 fields, found 4: [* * * *]"),
            (
                "x * * * *",
                "failed to parse int from x: strconv.Atoi: parsing \"x\": invalid syntax",
            ),
            ("0-70 * * * *", "end of range (70) above maximum (59): 0-70"),
            (
                "5-2 * * * *",
                "beginning of range (5) beyond end of range (2): 5-2",
            ),
            ("* * 0 * *", "beginning of range (0) below minimum (1): 0"),
            ("* * * * 7", "end of range (7) above maximum (6): 7"),
            (
                "*/0 * * * *",
                "step of range should be a positive number: */0",
            ),
            ("1-2-3 * * * *", "too many hyphens: 1-2-3"),
            ("1/2/3 * * * *", "too many slashes: 1/2/3"),
            ("@fortnightly", "unrecognized descriptor: @fortnightly"),
        ];
        for (spec, want) in cases {
            assert_eq!(parse(spec), Err(want.to_string()), "{spec}");
        }
    }

    #[test]
    fn next_activation_times() {
        let cases = [
            // (spec, after, expected next)
            ("* * * * *", "2024-01-01T00:00:30Z", "2024-01-01T00:01:00Z"),
            ("* * * * *", "2024-01-01T00:01:00Z", "2024-01-01T00:02:00Z"),
            (
                "*/15 * * * *",
                "2024-01-01T00:16:00Z",
                "2024-01-01T00:30:00Z",
            ),
            (
                "5,10 3 * * *",
                "2024-01-01T03:07:00Z",
                "2024-01-01T03:10:00Z",
            ),
            (
                "5,10 3 * * *",
                "2024-01-01T03:10:00Z",
                "2024-01-02T03:05:00Z",
            ),
            (
                "0 0 1 JAN *",
                "2024-03-01T00:00:00Z",
                "2025-01-01T00:00:00Z",
            ),
            (
                "30 9 * * MON-FRI",
                "2024-01-06T10:00:00Z",
                "2024-01-08T09:30:00Z",
            ),
            ("@hourly", "2024-01-01T10:00:00Z", "2024-01-01T11:00:00Z"),
            ("@daily", "2024-01-01T10:00:00Z", "2024-01-02T00:00:00Z"),
            ("@midnight", "2024-01-01T10:00:00Z", "2024-01-02T00:00:00Z"),
            ("@weekly", "2024-01-01T10:00:00Z", "2024-01-07T00:00:00Z"),
            ("@monthly", "2024-01-15T10:00:00Z", "2024-02-01T00:00:00Z"),
            ("@yearly", "2024-01-15T10:00:00Z", "2025-01-01T00:00:00Z"),
            ("@annually", "2024-01-15T10:00:00Z", "2025-01-01T00:00:00Z"),
            ("@every 90s", "2024-01-01T00:00:00Z", "2024-01-01T00:01:30Z"),
            // Day of month OR day of week when neither is a star.
            (
                "0 0 13 * FRI",
                "2024-01-01T00:00:00Z",
                "2024-01-05T00:00:00Z",
            ),
            // ... AND when one is a star.
            (
                "0 0 29 FEB *",
                "2024-03-01T00:00:00Z",
                "2028-02-29T00:00:00Z",
            ),
            ("0 12 * * 0", "2024-01-01T00:00:00Z", "2024-01-07T12:00:00Z"),
            (
                "0 0 1-31/10 * *",
                "2024-01-02T00:00:00Z",
                "2024-01-11T00:00:00Z",
            ),
        ];
        for (spec, after, want) in cases {
            let s = parse(spec).expect(spec);
            assert_eq!(
                s.next(ts(after), &TimeZone::UTC),
                Some(ts(want)),
                "{spec} after {after}"
            );
        }
        assert_eq!(
            parse("0 0 30 FEB *")
                .expect("parses")
                .next(ts("2024-01-01T00:00:00Z"), &TimeZone::UTC),
            None
        );
    }

    #[test]
    fn time_zones_shift_the_wall_clock() {
        let Ok(tz) = time_zone(Some("America/New_York")) else {
            panic!("zoneinfo for America/New_York is missing");
        };
        let s = parse("0 9 * * *").expect("parses");
        // 09:00 EST is 14:00 UTC in winter, 13:00 UTC in summer.
        assert_eq!(
            s.next(ts("2024-01-10T00:00:00Z"), &tz),
            Some(ts("2024-01-10T14:00:00Z"))
        );
        assert_eq!(
            s.next(ts("2024-07-10T00:00:00Z"), &tz),
            Some(ts("2024-07-10T13:00:00Z"))
        );
        assert_eq!(
            time_zone(Some("Mars/Olympus")).err(),
            Some("unknown time zone Mars/Olympus".to_string())
        );
        assert!(parse("CRON_TZ=UTC * * * * *").is_ok());
        assert!(mentions_tz("TZ=UTC * * * * *"));
    }
}
