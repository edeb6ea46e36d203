//! flannel's vxlan backend device: `nodus.1` (flannel's `flannel.<VNI>`), VNI 1 and UDP
//! port 8472 by default, its local VTEP on the node's InternalIP over the interface holding
//! it, address `<own podCIDR>.0/32`, MTU the uplink's minus 50 (the VXLAN header and outer
//! IPv4/UDP/Ethernet). Learning is off: the agent programs every peer's FDB entry itself.

use crate::kernel::{Kernel, KernelError};
use crate::plan::{Mac, VXLAN_DEVICE};
use std::net::Ipv4Addr;

/// flannel's defaults.
pub(crate) const DEFAULT_VNI: u32 = 1;
pub(crate) const DEFAULT_PORT: u16 = 8472;
/// Outer IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14).
const OVERHEAD: u32 = 50;

/// The device wanted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Device {
    pub vni: u32,
    pub port: u16,
    pub local: Ipv4Addr,
    /// `<own podCIDR>.0`.
    pub address: Ipv4Addr,
}

/// The interface holding `ip` and its MTU.
fn uplink(k: &mut Kernel, ip: Ipv4Addr) -> Result<(String, u32), KernelError> {
    let cmd = "ip -4 -json addr show";
    let out = k.run("ip", &["-4", "-json", "addr", "show"], None)?;
    let links: Vec<serde_json::Value> =
        serde_json::from_str(&out).map_err(|e| KernelError::Parse {
            cmd: cmd.into(),
            err: e.to_string(),
        })?;
    let want = ip.to_string();
    links
        .iter()
        .find(|l| {
            l["addr_info"]
                .as_array()
                .is_some_and(|a| a.iter().any(|i| i["local"] == want.as_str()))
        })
        .and_then(|l| Some((l["ifname"].as_str()?.to_string(), l["mtu"].as_u64()? as u32)))
        .ok_or_else(|| KernelError::Parse {
            cmd: cmd.into(),
            err: format!("no interface holds the node's InternalIP {ip}"),
        })
}

fn link(k: &mut Kernel) -> Option<serde_json::Value> {
    let out = k
        .run(
            "ip",
            &["-json", "-details", "link", "show", "dev", VXLAN_DEVICE],
            None,
        )
        .ok()?;
    serde_json::from_str::<Vec<serde_json::Value>>(&out)
        .ok()?
        .into_iter()
        .next()
}

/// Creates or fixes the device and returns its MAC (the VTEP MAC peers program). A device
/// with another VNI, port, local address or uplink is recreated, as flannel does.
pub(crate) fn ensure(k: &mut Kernel, want: &Device) -> Result<Mac, KernelError> {
    let (uplink, uplink_mtu) = uplink(k, want.local)?;
    if let Some(l) = link(k) {
        let d = &l["linkinfo"]["info_data"];
        let same = l["linkinfo"]["info_kind"] == "vxlan"
            && d["id"].as_u64() == Some(u64::from(want.vni))
            && d["port"].as_u64() == Some(u64::from(want.port))
            && d["local"].as_str() == Some(want.local.to_string().as_str())
            && d["link"].as_str() == Some(uplink.as_str());
        if !same {
            tracing::info!(
                device = VXLAN_DEVICE,
                "VXLAN device has other attributes; recreating it"
            );
            k.run("ip", &["link", "del", VXLAN_DEVICE], None)?;
        }
    }
    if link(k).is_none() {
        let (vni, local, port) = (
            want.vni.to_string(),
            want.local.to_string(),
            want.port.to_string(),
        );
        k.run(
            "ip",
            &[
                "link",
                "add",
                VXLAN_DEVICE,
                "type",
                "vxlan",
                "id",
                &vni,
                "local",
                &local,
                "dev",
                &uplink,
                "dstport",
                &port,
                "nolearning",
            ],
            None,
        )?;
        tracing::info!(device = VXLAN_DEVICE, vni = want.vni, local = %want.local, dev = %uplink, port = want.port, "created the VXLAN device");
    }
    let mtu = uplink_mtu.saturating_sub(OVERHEAD).to_string();
    k.run(
        "ip",
        &["link", "set", VXLAN_DEVICE, "mtu", &mtu, "up"],
        None,
    )?;
    // Exactly one address: <podCIDR>.0/32 (a changed pod CIDR leaves no stale one).
    let addr = format!("{}/32", want.address);
    let out = k.run(
        "ip",
        &["-4", "-json", "addr", "show", "dev", VXLAN_DEVICE],
        None,
    )?;
    let have: Vec<String> = serde_json::from_str::<Vec<serde_json::Value>>(&out)
        .unwrap_or_default()
        .iter()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter_map(|i| {
            Some(format!(
                "{}/{}",
                i["local"].as_str()?,
                i["prefixlen"].as_u64()?
            ))
        })
        .collect();
    for a in have.iter().filter(|a| **a != addr) {
        k.run("ip", &["addr", "del", a, "dev", VXLAN_DEVICE], None)?;
    }
    if !have.contains(&addr) {
        k.run("ip", &["addr", "add", &addr, "dev", VXLAN_DEVICE], None)?;
    }
    link(k)
        .and_then(|l| l["address"].as_str().and_then(Mac::parse))
        .ok_or_else(|| KernelError::Parse {
            cmd: format!("ip -json link show dev {VXLAN_DEVICE}"),
            err: "no MAC address".into(),
        })
}

/// Removes the device (the backend is no longer vxlan); its routes, neighbours and FDB
/// entries go with it.
pub(crate) fn remove(k: &mut Kernel) -> Result<bool, KernelError> {
    if link(k).is_none() {
        return Ok(false);
    }
    k.run("ip", &["link", "del", VXLAN_DEVICE], None)?;
    Ok(true)
}
