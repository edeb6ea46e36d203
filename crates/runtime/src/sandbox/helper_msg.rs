//! The pipe protocol between the runtime and the processes it forks to make namespaces
//! (the PID-namespace helper, the user-namespace helper): fixed 8-byte messages, a step tag
//! and a value (an errno, a pid), written with async-signal-safe calls only, since the
//! writer is a forked child of a multi-threaded process.

use super::SandboxError;
use nix::errno::Errno;
use std::os::fd::{FromRawFd, OwnedFd};

/// A close-on-exec pipe: (read end, write end).
pub(super) fn pipe() -> Result<(OwnedFd, OwnedFd), SandboxError> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: plain syscall with a valid two-int array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(SandboxError::sys("pipe2", Errno::last()));
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Writes one message; async-signal-safe (for forked children).
pub(super) fn write_msg(fd: libc::c_int, tag: i32, value: i32) {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&tag.to_ne_bytes());
    b[4..].copy_from_slice(&value.to_ne_bytes());
    // SAFETY: writing a live 8-byte buffer; async-signal-safe.
    unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
}

/// Fills `buf` from `fd`, retrying on EINTR; false at end of file or on an error.
pub(super) fn read_exact(fd: libc::c_int, buf: &mut [u8]) -> bool {
    let mut got = 0usize;
    while got < buf.len() {
        // SAFETY: reading into the unfilled tail of a live buffer.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if n > 0 {
            got += n as usize;
        } else if n == 0 || Errno::last() != Errno::EINTR {
            return false;
        }
    }
    true
}

/// Reads one message: `None` when the writer went away first.
pub(super) fn read_msg(fd: libc::c_int) -> Option<(i32, i32)> {
    let mut b = [0u8; 8];
    read_exact(fd, &mut b).then(|| {
        (
            i32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
            i32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
        )
    })
}
