//! What the nodus servers (API server, kubelet API, CRI runtime) share: the connection loop
//! with its timeouts and limits ([`conn`]), the host's own address ([`hostaddr`]), the node's
//! API server load balancer ([`loadbalancer`]), files only
//! root may read ([`private`]), the Prometheus text format ([`prometheus`]), query strings ([`query`]), the open files limit ([`rlimit`]), readiness for systemd
//! ([`sd_notify`]) and client-certificate identities ([`x509`]).

pub mod conn;
pub mod hostaddr;
pub mod loadbalancer;
pub mod private;
pub mod prometheus;
pub mod query;
pub mod rlimit;
pub mod sd_notify;
pub mod x509;
