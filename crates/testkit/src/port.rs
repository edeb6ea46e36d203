//! Free TCP ports on 127.0.0.1.

use std::net::{Ipv4Addr, TcpListener};

/// Returns a TCP port on 127.0.0.1 that was free a moment ago.
///
/// The port is found by binding `127.0.0.1:0` and releasing the socket, so another process
/// may grab it before the caller binds it: callers that start a daemon on it should retry
/// with a new port when the daemon reports "address already in use" (as
/// [`Registry`](crate::Registry) does).
pub fn free_port() -> u16 {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0 to find a free port");
    listener
        .local_addr()
        .expect("local_addr of a bound socket")
        .port()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_port_can_be_bound() {
        let port = free_port();
        assert_ne!(port, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("port is free");
    }
}
