//! When a CronJob is due (upstream's `mostRecentScheduleTime` / `nextScheduleTime`): the most
//! recent activation not yet run, counted from the last schedule time (or creation, or
//! `now − startingDeadlineSeconds` when later), with upstream's estimate of how many were
//! missed (more than 100 is reported as too many); and the deterministic Job name
//! `<cronjob>-<scheduled time in minutes since the epoch>`.

use jiff::Timestamp;
use jiff::tz::TimeZone;
use k8s_openapi::jiff;
use nodus_k8s::cron::Schedule;

/// How many activations were missed, as upstream classifies them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Missed {
    None,
    Few,
    /// More than 100: the controller warns `TooManyMissedTimes`.
    Many,
}

/// The most recent unmet activation at `now`, if any.
pub(crate) fn most_recent(
    schedule: &Schedule,
    tz: &TimeZone,
    earliest: Timestamp,
    starting_deadline: Option<i64>,
    now: Timestamp,
) -> Result<(Option<Timestamp>, Missed), String> {
    let mut earliest = earliest;
    if let Some(d) = starting_deadline {
        let deadline = now - jiff::SignedDuration::from_secs(d);
        if deadline > earliest {
            earliest = deadline;
        }
    }
    let next = |t: Timestamp| {
        schedule.next(t, tz).ok_or_else(|| {
            "time difference between two schedules is less than 1 second".to_string()
        })
    };
    let Some(t1) = schedule.next(earliest, tz) else {
        return Ok((None, Missed::None));
    };
    if now < t1 {
        return Ok((None, Missed::None));
    }
    let t2 = next(t1)?;
    if now < t2 {
        return Ok((Some(t1), Missed::None));
    }
    let between = t2.duration_since(t1).as_secs();
    if between < 1 {
        return Err("time difference between two schedules is less than 1 second".into());
    }
    let elapsed = now.duration_since(t1).as_secs();
    let missed = elapsed / between + 1;
    // Start two intervals before the estimate, then walk forward to the last one ≤ now.
    let from = t1 + jiff::SignedDuration::from_secs((missed - 2) * between);
    let mut recent = None;
    let mut t = next(from)?;
    while t <= now {
        recent = Some(t);
        t = next(t)?;
    }
    let class = if missed > 100 {
        Missed::Many
    } else {
        Missed::Few
    };
    Ok((recent, class))
}

/// `<cronjob>-<minutes since the epoch>`, upstream's `getJobName`.
pub(crate) fn job_name(cronjob: &str, scheduled: Timestamp) -> String {
    format!("{cronjob}-{}", scheduled.as_second() / 60)
}

/// The `batch.kubernetes.io/cronjob-scheduled-timestamp` value: RFC 3339 in the zone.
pub(crate) fn scheduled_annotation(scheduled: Timestamp, tz: &TimeZone) -> String {
    let z = scheduled.to_zoned(tz.clone());
    let offset = z.offset();
    let dt = z.datetime();
    let base = dt.strftime("%Y-%m-%dT%H:%M:%S").to_string();
    if offset.seconds() == 0 {
        format!("{base}Z")
    } else {
        let secs = offset.seconds();
        let sign = if secs < 0 { '-' } else { '+' };
        let a = secs.abs();
        format!("{base}{sign}{:02}:{:02}", a / 3600, (a % 3600) / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_k8s::cron::parse;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn most_recent_unmet_activation() {
        let every_min = parse("* * * * *").expect("parses");
        let hourly = parse("0 * * * *").expect("parses");
        let utc = TimeZone::UTC;
        let cases = [
            // (schedule, earliest, deadline, now, want, missed)
            (
                &every_min,
                "2024-01-01T00:00:10Z",
                None,
                "2024-01-01T00:00:50Z",
                None,
                Missed::None,
            ),
            (
                &every_min,
                "2024-01-01T00:00:10Z",
                None,
                "2024-01-01T00:01:00Z",
                Some("2024-01-01T00:01:00Z"),
                Missed::None,
            ),
            (
                &every_min,
                "2024-01-01T00:00:10Z",
                None,
                "2024-01-01T00:01:30Z",
                Some("2024-01-01T00:01:00Z"),
                Missed::None,
            ),
            (
                &every_min,
                "2024-01-01T00:00:10Z",
                None,
                "2024-01-01T00:05:30Z",
                Some("2024-01-01T00:05:00Z"),
                Missed::Few,
            ),
            // Already run at 00:01: nothing until 00:02.
            (
                &every_min,
                "2024-01-01T00:01:00Z",
                None,
                "2024-01-01T00:01:40Z",
                None,
                Missed::None,
            ),
            (
                &hourly,
                "2024-01-01T00:00:00Z",
                None,
                "2024-01-10T00:30:00Z",
                Some("2024-01-10T00:00:00Z"),
                Missed::Many,
            ),
            // A starting deadline bounds how far back the controller looks.
            (
                &hourly,
                "2024-01-01T00:00:00Z",
                Some(3600),
                "2024-01-10T00:30:00Z",
                Some("2024-01-10T00:00:00Z"),
                Missed::None,
            ),
            (
                &hourly,
                "2024-01-01T00:00:00Z",
                Some(600),
                "2024-01-10T00:30:00Z",
                None,
                Missed::None,
            ),
        ];
        for (sched, earliest, deadline, now, want, missed) in cases {
            assert_eq!(
                most_recent(sched, &utc, ts(earliest), deadline, ts(now)),
                Ok((want.map(ts), missed)),
                "{earliest} {deadline:?} {now}"
            );
        }
    }

    #[test]
    fn names_and_annotations() {
        assert_eq!(
            job_name("hello", ts("2024-01-01T00:01:00Z")),
            "hello-28401121"
        );
        assert_eq!(
            scheduled_annotation(ts("2024-01-01T14:00:00Z"), &TimeZone::UTC),
            "2024-01-01T14:00:00Z"
        );
        let ny = TimeZone::get("America/New_York").expect("zoneinfo for America/New_York");
        assert_eq!(
            scheduled_annotation(ts("2024-01-01T14:00:00Z"), &ny),
            "2024-01-01T09:00:00-05:00"
        );
    }
}
