//! v2 freezing: `cgroup.freeze`, then `frozen 1`/`frozen 0` awaited in `cgroup.events`
//! (the core interface has no controller to enable).

use crate::common::{FREEZE_POLLS, Files, POLL, read};
use crate::error::CgroupError;
use std::path::Path;

/// Freezes (or thaws) cgroup directory `dir`, waiting for the kernel to report it.
pub(crate) fn set_frozen(f: &Files, dir: &Path, frozen: bool) -> Result<(), CgroupError> {
    f.write(&dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })?;
    let events = dir.join("cgroup.events");
    let want = if frozen { "frozen 1" } else { "frozen 0" };
    let mut state = String::new();
    for _ in 0..FREEZE_POLLS {
        let text = read(&events)?;
        state = format!(
            "frozen {}",
            text.lines()
                .find_map(|l| l.strip_prefix("frozen "))
                .unwrap_or("0")
                .trim()
        );
        if state == want {
            return Ok(());
        }
        std::thread::sleep(POLL);
    }
    Err(CgroupError::Freeze {
        path: events,
        state,
        want,
    })
}
