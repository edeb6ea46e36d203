//! kube-proxy: Service and EndpointSlice change tracking rendered to nftables or iptables.
//!
//! Owns only its own kernel tables. Built by the kube-proxy issue.
