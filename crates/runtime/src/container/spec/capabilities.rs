//! Process capabilities: containerd's default set, CRI add/drop (with `ALL`), privileged
//! containers getting every capability the runtime itself holds. Ambient and inheritable sets
//! stay empty, as in containerd (`WithoutAmbientCaps`).

use oci_spec::runtime::{Capabilities, Capability, LinuxCapabilities};

use super::SpecError;
use cri::runtime::v1::LinuxContainerSecurityContext;

/// containerd's (and Docker's) default capability set, in its order.
pub(crate) const DEFAULT_CAPS: [Capability; 14] = [
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fsetid,
    Capability::Fowner,
    Capability::Mknod,
    Capability::NetRaw,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setfcap,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Kill,
    Capability::AuditWrite,
];

/// A CRI capability name (`SYS_ADMIN`, also accepted as `CAP_SYS_ADMIN`, any case).
fn parse_cap(name: &str, field: &str) -> Result<Capability, SpecError> {
    serde_json::from_value::<Capability>(serde_json::Value::String(name.to_string())).map_err(
        |_| {
            SpecError::InvalidArgument(format!(
                "linux.security_context.capabilities.{field}: unknown capability {name:?}"
            ))
        },
    )
}

/// The capability set (bounding = effective = permitted) of the container process.
pub(crate) fn effective_set(
    sc: Option<&LinuxContainerSecurityContext>,
    privileged: bool,
    current: &[Capability],
) -> Result<Vec<Capability>, SpecError> {
    let mut set: Vec<Capability> = DEFAULT_CAPS.to_vec();
    if let Some(caps) = sc.and_then(|s| s.capabilities.as_ref()) {
        let is_all = |c: &String| c.eq_ignore_ascii_case("ALL");
        if caps.add_capabilities.iter().any(is_all) {
            set = current.to_vec();
        }
        if caps.drop_capabilities.iter().any(is_all) {
            set.clear();
        }
        for name in caps.add_capabilities.iter().filter(|c| !is_all(c)) {
            let cap = parse_cap(name, "add_capabilities")?;
            if !set.contains(&cap) {
                set.push(cap);
            }
        }
        for name in caps.drop_capabilities.iter().filter(|c| !is_all(c)) {
            let cap = parse_cap(name, "drop_capabilities")?;
            set.retain(|c| *c != cap);
        }
        // Ambient capabilities are cleared like containerd does; still reject typos.
        for name in &caps.add_ambient_capabilities {
            if !is_all(name) {
                parse_cap(name, "add_ambient_capabilities")?;
            }
        }
    }
    if privileged {
        set = current.to_vec();
    }
    Ok(set)
}

/// The OCI capabilities object for a set: empty sets are omitted, as containerd's JSON does.
pub(crate) fn to_oci(set: &[Capability]) -> LinuxCapabilities {
    let caps: Option<Capabilities> = (!set.is_empty()).then(|| set.iter().copied().collect());
    let mut oci = LinuxCapabilities::default();
    oci.set_bounding(caps.clone());
    oci.set_effective(caps.clone());
    oci.set_permitted(caps);
    oci.set_inheritable(None);
    oci.set_ambient(None);
    oci
}

#[cfg(test)]
mod tests {
    use super::*;
    use cri::runtime::v1::Capability as CriCaps;

    fn sc(add: &[&str], drop: &[&str]) -> LinuxContainerSecurityContext {
        LinuxContainerSecurityContext {
            capabilities: Some(CriCaps {
                add_capabilities: add.iter().map(|s| s.to_string()).collect(),
                drop_capabilities: drop.iter().map(|s| s.to_string()).collect(),
                add_ambient_capabilities: vec![],
            }),
            ..Default::default()
        }
    }

    fn sorted(mut v: Vec<Capability>) -> Vec<String> {
        let mut s: Vec<String> = v.drain(..).map(|c| c.to_string()).collect();
        s.sort();
        s
    }

    #[test]
    fn add_drop_all_privileged() {
        let current = vec![
            Capability::Chown,
            Capability::SysAdmin,
            Capability::NetAdmin,
        ];
        let default = sorted(DEFAULT_CAPS.to_vec());
        let with = |extra: &[Capability], without: &[Capability]| {
            let mut v: Vec<Capability> = DEFAULT_CAPS
                .iter()
                .copied()
                .filter(|c| !without.contains(c))
                .collect();
            v.extend_from_slice(extra);
            sorted(v)
        };
        let cases: Vec<(Option<LinuxContainerSecurityContext>, bool, Vec<String>)> = vec![
            (None, false, default.clone()),
            (Some(sc(&[], &[])), false, default.clone()),
            (
                Some(sc(&["SYS_ADMIN"], &["NET_RAW"])),
                false,
                with(&[Capability::SysAdmin], &[Capability::NetRaw]),
            ),
            (
                Some(sc(&["cap_net_admin"], &["mknod", "CAP_KILL"])),
                false,
                with(
                    &[Capability::NetAdmin],
                    &[Capability::Mknod, Capability::Kill],
                ),
            ),
            (Some(sc(&["ALL"], &[])), false, sorted(current.clone())),
            (
                Some(sc(&["all"], &["CHOWN"])),
                false,
                sorted(vec![Capability::SysAdmin, Capability::NetAdmin]),
            ),
            (Some(sc(&[], &["ALL"])), false, vec![]),
            (
                Some(sc(&["NET_BIND_SERVICE"], &["ALL"])),
                false,
                sorted(vec![Capability::NetBindService]),
            ),
            (Some(sc(&[], &["ALL"])), true, sorted(current.clone())),
            (None, true, sorted(current.clone())),
        ];
        for (i, (sc, privileged, want)) in cases.into_iter().enumerate() {
            let got = effective_set(sc.as_ref(), privileged, &current).unwrap();
            assert_eq!(sorted(got), want, "case {i}");
        }
    }

    #[test]
    fn unknown_capability_is_invalid() {
        let err = effective_set(Some(&sc(&["SYS_WIZARD"], &[])), false, &[]).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.to_string()
                .contains("add_capabilities: unknown capability \"SYS_WIZARD\""),
            "{err}"
        );
    }

    #[test]
    fn oci_shape() {
        let oci = to_oci(&[Capability::Kill]);
        assert_eq!(oci.bounding().as_ref().map(|b| b.len()), Some(1));
        assert_eq!(oci.effective(), oci.permitted());
        assert!(oci.inheritable().is_none() && oci.ambient().is_none());
        let empty = to_oci(&[]);
        assert!(empty.bounding().is_none());
    }
}
