//! CNI results: the final result of an ADD chain, reduced to what a sandbox needs (its IPs on
//! the pod interface), with the raw JSON kept for the cache and for `PodSandboxStatus`.

use serde::Serialize;
use serde_json::Value;
use std::net::IpAddr;

/// An interface a result names; `sandbox` is set for interfaces inside the pod's netns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interface {
    pub name: String,
    pub mac: Option<String>,
    pub sandbox: Option<String>,
}

/// One IP configuration of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IpConfig {
    pub address: IpAddr,
    pub prefix_len: u8,
    pub gateway: Option<IpAddr>,
    /// The interface it is on, when the result says.
    pub interface: Option<String>,
}

/// The outcome of setting up a sandbox's network.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NetworkResult {
    /// The network's name.
    pub network: String,
    /// The pod interface (`eth0`).
    pub ifname: String,
    /// The pod's IPs on `ifname`, IPv4 first (containerd's and CRI-O's primary-IP choice).
    pub ips: Vec<IpConfig>,
    /// Every interface of the result.
    pub interfaces: Vec<Interface>,
    /// The final result as the last plugin printed it.
    pub raw: Value,
}

impl NetworkResult {
    /// The pod's primary IP (`PodSandboxNetworkStatus.ip`).
    pub fn primary_ip(&self) -> Option<IpAddr> {
        self.ips.first().map(|c| c.address)
    }

    /// The other IPs (`additional_ips`: the other family of a dual-stack pod).
    pub fn additional_ips(&self) -> Vec<IpAddr> {
        self.ips.iter().skip(1).map(|c| c.address).collect()
    }

    /// Parses a result of any spec version (0.1/0.2 `ip4`/`ip6`, 0.3+ `interfaces`/`ips`) and
    /// picks the IPs of `ifname`: those whose `interface` index names an interface called
    /// `ifname`; when the result gives no interface indexes, all of its IPs.
    pub fn parse(network: &str, ifname: &str, raw: Value) -> Result<NetworkResult, String> {
        let obj = raw.as_object().ok_or("the result is not a JSON object")?;
        let mut interfaces = Vec::new();
        if let Some(list) = obj.get("interfaces") {
            let list = list.as_array().ok_or("\"interfaces\" is not an array")?;
            for i in list {
                let name = i
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or("an interface has no \"name\"")?;
                let opt = |k: &str| {
                    i.get(k)
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                };
                interfaces.push(Interface {
                    name: name.to_string(),
                    mac: opt("mac"),
                    sandbox: opt("sandbox"),
                });
            }
        }
        let mut all = Vec::new();
        if let Some(ips) = obj.get("ips") {
            for ip in ips.as_array().ok_or("\"ips\" is not an array")? {
                let interface = match ip.get("interface") {
                    None | Some(Value::Null) => None,
                    Some(v) => {
                        let idx = v.as_u64().ok_or("an IP's \"interface\" is not an index")?;
                        let iface = interfaces.get(idx as usize).ok_or_else(|| {
                            format!("an IP names interface #{idx}, which the result does not list")
                        })?;
                        Some(iface.name.clone())
                    }
                };
                all.push(parse_ip_config(ip, interface)?);
            }
        }
        for legacy in ["ip4", "ip6"] {
            if let Some(ip) = obj.get(legacy).filter(|v| !v.is_null()) {
                let ip_field = ip.get("ip").cloned().unwrap_or(Value::Null);
                let as_new = serde_json::json!({"address": ip_field, "gateway": ip.get("gateway")});
                all.push(parse_ip_config(&as_new, None)?);
            }
        }
        let on_if: Vec<IpConfig> = all
            .iter()
            .filter(|c| c.interface.as_deref() == Some(ifname))
            .cloned()
            .collect();
        let mut ips = if on_if.is_empty() && all.iter().all(|c| c.interface.is_none()) {
            all
        } else {
            on_if
        };
        ips.sort_by_key(|c| c.address.is_ipv6());
        Ok(NetworkResult {
            network: network.to_string(),
            ifname: ifname.to_string(),
            ips,
            interfaces,
            raw,
        })
    }
}

fn parse_ip_config(v: &Value, interface: Option<String>) -> Result<IpConfig, String> {
    let address = v
        .get("address")
        .and_then(Value::as_str)
        .ok_or("an IP has no \"address\"")?;
    let (ip, prefix) = address
        .split_once('/')
        .ok_or_else(|| format!("IP address {address:?} has no /prefix"))?;
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| format!("bad IP address {address:?}"))?;
    let prefix_len: u8 = prefix
        .parse()
        .ok()
        .filter(|p| *p <= if ip.is_ipv4() { 32 } else { 128 })
        .ok_or_else(|| format!("bad prefix length in {address:?}"))?;
    let gateway = match v.get("gateway").and_then(Value::as_str) {
        None | Some("") => None,
        Some(g) => Some(g.parse().map_err(|_| format!("bad gateway {g:?}"))?),
    };
    Ok(IpConfig {
        address: ip,
        prefix_len,
        gateway,
        interface,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sandbox_cni_result_1_0_picks_the_pod_interface_ipv4_first() {
        // What the bridge plugin prints.
        let raw = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "aa:aa:aa:aa:aa:aa"},
                {"name": "veth1234", "mac": "bb:bb:bb:bb:bb:bb"},
                {"name": "eth0", "mac": "cc:cc:cc:cc:cc:cc", "sandbox": "/run/nodus/sandboxes/x/ns/net"}
            ],
            "ips": [
                {"address": "fd00:7::5/64", "gateway": "fd00:7::1", "interface": 2},
                {"address": "10.244.7.5/24", "gateway": "10.244.7.1", "interface": 2},
                {"address": "10.244.7.1/24", "interface": 0}
            ],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        });
        let r = NetworkResult::parse("nodus", "eth0", raw.clone()).unwrap();
        assert_eq!(r.primary_ip(), Some("10.244.7.5".parse().unwrap()));
        assert_eq!(
            r.additional_ips(),
            vec!["fd00:7::5".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(r.ips[0].prefix_len, 24);
        assert_eq!(r.ips[0].gateway, Some("10.244.7.1".parse().unwrap()));
        assert_eq!(r.ips[0].interface.as_deref(), Some("eth0"));
        assert_eq!(
            r.interfaces[2].sandbox.as_deref(),
            Some("/run/nodus/sandboxes/x/ns/net")
        );
        assert_eq!(r.interfaces[0].sandbox, None);
        assert_eq!(r.raw, raw);
    }

    #[test]
    fn sandbox_cni_result_older_versions() {
        // 0.3.1 has "version" per IP and may omit interface indexes.
        let r = NetworkResult::parse(
            "n",
            "eth0",
            json!({"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.1.0.5/16","gateway":"10.1.0.1"}]}),
        )
        .unwrap();
        assert_eq!(r.primary_ip(), Some("10.1.0.5".parse().unwrap()));
        // 0.2.0's ip4/ip6.
        let r = NetworkResult::parse(
            "n",
            "eth0",
            json!({"cniVersion":"0.2.0","ip4":{"ip":"10.2.0.5/16","gateway":"10.2.0.1"},"ip6":{"ip":"fd00::5/64"}}),
        )
        .unwrap();
        assert_eq!(r.primary_ip(), Some("10.2.0.5".parse().unwrap()));
        assert_eq!(r.additional_ips().len(), 1);
        // An IPAM-style result with nothing on eth0 gives no IP.
        let r = NetworkResult::parse(
            "n",
            "eth0",
            json!({"interfaces":[{"name":"cni0"}],"ips":[{"address":"10.3.0.1/24","interface":0}]}),
        )
        .unwrap();
        assert!(r.ips.is_empty());
    }

    #[test]
    fn sandbox_cni_result_errors() {
        for (raw, want) in [
            (json!([]), "not a JSON object"),
            (json!({"ips":[{"address":"10.0.0.1"}]}), "no /prefix"),
            (json!({"ips":[{"address":"10.0.0.1/40"}]}), "bad prefix"),
            (json!({"ips":[{"address":"x/24"}]}), "bad IP address"),
            (
                json!({"ips":[{"address":"10.0.0.1/24","interface":3}]}),
                "interface #3",
            ),
            (json!({"interfaces":[{"mac":"x"}]}), "no \"name\""),
        ] {
            let err = NetworkResult::parse("n", "eth0", raw.clone()).unwrap_err();
            assert!(err.contains(want), "{raw}: {err}");
        }
    }
}
