//! v1 `freezer`: `freezer.state` FROZEN/THAWED, polled until the kernel gets there.

use crate::common::{FREEZE_POLLS, Files, POLL, read};
use crate::controller::{Controller, ControllerKind};
use crate::error::CgroupError;
use std::path::Path;

pub(crate) struct Freezer;

impl Controller for Freezer {
    const KIND: ControllerKind = ControllerKind::Freezer;
}

/// Freezes (or thaws) cgroup directory `dir`, waiting for the state to settle.
pub(crate) fn set_frozen(f: &Files, dir: &Path, frozen: bool) -> Result<(), CgroupError> {
    let file = dir.join("freezer.state");
    let want = if frozen { "FROZEN" } else { "THAWED" };
    let mut state = String::new();
    for i in 0..FREEZE_POLLS {
        // A freeze can stall in FREEZING while a task is in an uninterruptible state;
        // writing again retries it, as runc does.
        if i % 10 == 0 {
            f.write(&file, want)?;
        }
        state = read(&file)?.trim().to_string();
        if state == want {
            return Ok(());
        }
        std::thread::sleep(POLL);
    }
    if frozen {
        let _ = f.write(&file, "THAWED");
    }
    Err(CgroupError::Freeze {
        path: file,
        state,
        want,
    })
}
