//! The local terminal side of `exec -it` / `attach -it`: raw mode (restored on drop), the
//! window size and its changes, and stdin read on a thread of its own (a blocking read
//! that must not keep the process from exiting).

use super::remotecommand::TerminalSize;
use bytes::Bytes;
use std::io::Read;
use std::os::fd::RawFd;
use tokio::sync::mpsc;

const STDIN: RawFd = 0;

/// Whether `fd` is a terminal.
pub fn is_terminal(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

/// The size of the terminal on `fd`, if it is one.
pub fn size(fd: RawFd) -> Option<TerminalSize> {
    // SAFETY: TIOCGWINSZ fills a winsize structure, which `ws` is.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } != 0 || ws.ws_col == 0 {
        return None;
    }
    Some(TerminalSize {
        width: ws.ws_col,
        height: ws.ws_row,
    })
}

/// Puts stdin's terminal in raw mode until dropped.
pub struct RawMode {
    saved: libc::termios,
}

impl RawMode {
    pub fn enable() -> std::io::Result<RawMode> {
        // SAFETY: termios is plain data, filled by tcgetattr on stdin.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(STDIN, &mut t) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let saved = t;
            libc::cfmakeraw(&mut t);
            if libc::tcsetattr(STDIN, libc::TCSANOW, &t) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(RawMode { saved })
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the settings read in `enable`.
        unsafe {
            libc::tcsetattr(STDIN, libc::TCSANOW, &self.saved);
        }
    }
}

/// Sends the terminal's size now and after every SIGWINCH, until the receiver goes away.
pub fn watch_size(fd: RawFd, tx: mpsc::Sender<TerminalSize>) {
    tokio::spawn(async move {
        if let Some(s) = size(fd)
            && tx.send(s).await.is_err()
        {
            return;
        }
        let Ok(mut winch) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        else {
            return;
        };
        while winch.recv().await.is_some() {
            if let Some(s) = size(fd)
                && tx.send(s).await.is_err()
            {
                return;
            }
        }
    });
}

/// Reads this process's stdin on a detached thread; the channel ends at end of input.
pub fn stdin_chunks() -> mpsc::Receiver<Bytes> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(Bytes::copy_from_slice(&buf[..n])).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}
