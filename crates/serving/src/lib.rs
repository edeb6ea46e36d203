//! What the nodus servers (API server, kubelet API) share: the connection loop with its
//! timeouts and limits ([`conn`]), files only root may read ([`private`]) and the open
//! files limit ([`rlimit`]).

pub mod conn;
pub mod private;
pub mod rlimit;
