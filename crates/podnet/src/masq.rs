//! The nftables table `ip nodus-podnet`: pod traffic keeps its source IP inside the pod
//! network and is masqueraded when it leaves it (flannel's `--ip-masq` rules, the bridge
//! plugin's ipMasq being off). The set `pod-cidrs` holds every node's pod CIDR and is
//! rewritten in the same transaction as the rule, so an update is atomic.

use crate::kernel::{Kernel, KernelError};
use ipnet::Ipv4Net;

pub const TABLE: &str = "nodus-podnet";

/// The nft script making the table match `pod_cidrs`.
pub fn script(pod_cidrs: &[Ipv4Net]) -> String {
    let mut s = format!(
        "add table ip {TABLE}\n\
         add set ip {TABLE} pod-cidrs {{ type ipv4_addr; flags interval; auto-merge; }}\n\
         flush set ip {TABLE} pod-cidrs\n"
    );
    if !pod_cidrs.is_empty() {
        let elems: Vec<String> = pod_cidrs.iter().map(|c| c.to_string()).collect();
        s.push_str(&format!(
            "add element ip {TABLE} pod-cidrs {{ {} }}\n",
            elems.join(", ")
        ));
    }
    s.push_str(&format!(
        "add chain ip {TABLE} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n\
         flush chain ip {TABLE} postrouting\n\
         add rule ip {TABLE} postrouting ip saddr @pod-cidrs ip daddr != @pod-cidrs ip daddr != 224.0.0.0/4 counter masquerade fully-random\n"
    ));
    s
}

/// Applies [`script`] with `nft -f -`.
pub fn sync(k: &mut Kernel, pod_cidrs: &[Ipv4Net]) -> Result<(), KernelError> {
    k.run("nft", &["-f", "-"], Some(&script(pod_cidrs)))
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_rewrites_the_set_and_the_rule_in_one_transaction() {
        let cidrs: Vec<Ipv4Net> = ["10.42.0.0/23", "10.42.1.0/24", "10.42.2.0/24"]
            .iter()
            .map(|c| c.parse().unwrap())
            .collect();
        assert_eq!(
            script(&cidrs),
            "add table ip nodus-podnet\n\
             add set ip nodus-podnet pod-cidrs { type ipv4_addr; flags interval; auto-merge; }\n\
             flush set ip nodus-podnet pod-cidrs\n\
             add element ip nodus-podnet pod-cidrs { 10.42.0.0/23, 10.42.1.0/24, 10.42.2.0/24 }\n\
             add chain ip nodus-podnet postrouting { type nat hook postrouting priority srcnat; policy accept; }\n\
             flush chain ip nodus-podnet postrouting\n\
             add rule ip nodus-podnet postrouting ip saddr @pod-cidrs ip daddr != @pod-cidrs ip daddr != 224.0.0.0/4 counter masquerade fully-random\n"
        );
        assert!(!script(&[]).contains("add element"));
    }
}
