//! Readiness for systemd's `Type=notify` units (sd_notify(3)): `READY=1` once every
//! component the process runs is serving.
//!
//! One process may run several roles (`nodus up` is the control plane, the runtime and the
//! kubelet), and the unit is ready only when the last of them is: `main` declares which
//! components this process must wait for with [`expect`], each component reports with
//! [`ready`] wherever it starts serving, and the notification goes out when the set is
//! complete. Without [`expect`] (a role embedded in a test or another program) reports are
//! no-ops.
//!
//! The socket is taken out of the environment at start ([`take_socket_from_env`]): every
//! process the node starts would inherit it, and runc treats an inherited `NOTIFY_SOCKET`
//! as the container's own and waits for the container to send `READY=1`.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::net::UnixDatagram;
use std::sync::{Mutex, OnceLock};

/// The parts of a nodus process that must be serving before the unit is ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Component {
    /// The CRI server: its socket is bound and its state recovered.
    Runtime,
    /// The kubelet: connected to its runtime, pod sources and sync loop running.
    Kubelet,
    /// The API server (and the controllers and scheduler beside it) answering.
    ControlPlane,
}

struct State {
    socket: Option<OsString>,
    waiting: Option<BTreeSet<Component>>,
}

fn state() -> &'static Mutex<State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE.get_or_init(|| {
        Mutex::new(State {
            socket: None,
            waiting: None,
        })
    })
}

/// Removes `NOTIFY_SOCKET` from the environment and keeps it for this process's own
/// notifications. Call first thing in `main`, before any thread exists.
pub fn take_socket_from_env() {
    let socket = std::env::var_os("NOTIFY_SOCKET");
    if socket.is_some() {
        // SAFETY: called at the start of main, while the process has a single thread, so
        // nothing reads the environment concurrently.
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
    }
    state().lock().unwrap_or_else(|e| e.into_inner()).socket = socket;
}

/// Declares the components whose readiness makes this process ready.
pub fn expect(components: &[Component]) {
    let mut s = state().lock().unwrap_or_else(|e| e.into_inner());
    s.waiting = Some(components.iter().copied().collect());
}

/// Reports that `component` is serving; sends `READY=1` when it was the last awaited.
pub fn ready(component: Component) {
    let mut s = state().lock().unwrap_or_else(|e| e.into_inner());
    let Some(waiting) = s.waiting.as_mut() else {
        return;
    };
    if !waiting.remove(&component) || !waiting.is_empty() {
        return;
    }
    tracing::debug!(component = ?component, "every component is serving");
    if let Some(socket) = &s.socket
        && let Err(e) = send(socket, "READY=1")
    {
        tracing::warn!(socket = ?socket, error = %e, "cannot notify systemd of readiness");
    }
}

/// One datagram to the notify socket: a path, or an abstract name written with a leading `@`.
fn send(socket: &OsString, message: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = socket.as_bytes();
    let sock = UnixDatagram::unbound()?;
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(message.as_bytes(), &addr)?
    } else {
        sock.send_to(message.as_bytes(), std::path::Path::new(socket))?
    };
    if sent != message.len() {
        return Err(std::io::Error::other("short write to the notify socket"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_reaches_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        send(&path.clone().into_os_string(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }

    #[test]
    fn a_datagram_reaches_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("nodus-sd-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let server = UnixDatagram::bind_addr(&addr).unwrap();
        send(&OsString::from(format!("@{name}")), "STOPPING=1").unwrap();
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }

    #[test]
    fn a_missing_socket_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent").into_os_string();
        assert!(send(&missing, "READY=1").is_err());
    }
}
