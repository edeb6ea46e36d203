//! The pod back-off of a Job (upstream's `getBackoff` / `getRemainingTimeForFailuresCount`):
//! after the n-th counted failure a replacement pod waits 10 s · 2^(n−1), at most 6 min,
//! measured from the last failure.

use std::time::Duration;

/// Upstream's `DefaultJobPodFailureBackOff`.
const BASE: Duration = Duration::from_secs(10);
/// Upstream's `MaxJobPodFailureBackOff`.
const MAX: Duration = Duration::from_secs(360);

/// The back-off after `failures` counted failures (none before the first).
pub(crate) fn delay(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let exp = (failures - 1).min(16);
    BASE.saturating_mul(1 << exp).min(MAX)
}

/// How long a replacement must still wait, `since_last_failure` after the last failure.
pub(crate) fn remaining(failures: u32, since_last_failure: Duration) -> Duration {
    delay(failures).saturating_sub(since_last_failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_ten_seconds_up_to_six_minutes() {
        let cases = [
            (0, 0),
            (1, 10),
            (2, 20),
            (3, 40),
            (4, 80),
            (5, 160),
            (6, 320),
            (7, 360),
            (40, 360),
        ];
        for (failures, secs) in cases {
            assert_eq!(
                delay(failures),
                Duration::from_secs(secs),
                "{failures} failures"
            );
        }
        assert_eq!(
            remaining(2, Duration::from_secs(5)),
            Duration::from_secs(15)
        );
        assert_eq!(remaining(2, Duration::from_secs(25)), Duration::ZERO);
        assert_eq!(remaining(0, Duration::ZERO), Duration::ZERO);
    }
}
