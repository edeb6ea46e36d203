//! Waiting for a process that is not our child (a shim, after a daemon restart) to exit,
//! with a pidfd: no polling, and no race with pid reuse once the fd is open.

use std::os::fd::{FromRawFd as _, OwnedFd};
use tokio::io::unix::AsyncFd;

/// Resolves when process `pid` has exited (immediately if it is already gone).
pub async fn wait_for_exit(pid: u32) -> std::io::Result<()> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ESRCH) {
            Ok(())
        } else {
            Err(e)
        };
    }
    // SAFETY: the syscall returned a fresh fd that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: `owned` is a pidfd we own; it stays open (inside the AsyncFd) for as long as
    // it is registered.
    let afd = unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE)? };
    // A pidfd becomes readable when the process exits.
    let _guard = afd.readable().await?;
    Ok(())
}

/// Whether `pid` is alive (not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resolves_when_a_process_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(alive(pid));
        let waiter = tokio::spawn(wait_for_exit(pid));
        let _ = tokio::task::spawn_blocking(move || child.wait()).await;
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("pidfd fired")
            .unwrap()
            .unwrap();
        wait_for_exit(pid).await.unwrap();
    }
}
