//! The host's own address (upstream's utilnet.ChooseHostInterface): what the kubelet
//! reports as the node's InternalIP and the API server advertises when bound to the
//! unspecified address.

use std::net::IpAddr;

/// The IPv4 address of the interface the default route leaves through, in the caller's
/// network namespace; else the first non-loopback IPv4 address.
pub fn choose_host_ip() -> Option<IpAddr> {
    let route = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let iface = route.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 2 && f[1] == "00000000").then(|| f[0].to_string())
    });
    let addrs: Vec<(String, IpAddr)> = nix::ifaddrs::getifaddrs()
        .map(|it| {
            it.filter_map(|a| {
                let ip = a.address?.as_sockaddr_in()?.ip();
                Some((a.interface_name, IpAddr::V4(ip)))
            })
            .collect()
        })
        .unwrap_or_default();
    if let Some(iface) = iface
        && let Some((_, ip)) = addrs.iter().find(|(n, _)| *n == iface)
    {
        return Some(*ip);
    }
    addrs
        .into_iter()
        .map(|(_, ip)| ip)
        .find(|ip| !ip.is_loopback())
}
