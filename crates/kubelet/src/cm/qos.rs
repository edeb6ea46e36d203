//! Where a pod's cgroup lives: Guaranteed pods directly under `kubepods`, Burstable and
//! BestEffort pods under their tier, exactly as upstream's cgroupfs layout.

use nodus_k8s::qos::QosClass;

/// The cgroup layout under the kubelet's cgroup root.
#[derive(Clone, Debug)]
pub struct Layout {
    /// `cgroupRoot` (default `/`).
    pub root: String,
    /// `cgroupsPerQOS` (default true): without it pods go straight under the root.
    pub per_qos: bool,
}

fn join(a: &str, b: &str) -> String {
    let a = a.trim_end_matches('/');
    if a.is_empty() {
        format!("/{b}")
    } else {
        format!("{a}/{b}")
    }
}

impl Layout {
    /// The node allocatable cgroup (`<root>/kubepods`), or the root without QoS cgroups.
    pub fn kubepods(&self) -> String {
        if self.per_qos {
            join(&self.root, "kubepods")
        } else {
            let r = self.root.trim_end_matches('/');
            if r.is_empty() { "/".into() } else { r.into() }
        }
    }

    /// The tier cgroup of a QoS class (Guaranteed's is `kubepods` itself).
    pub fn tier(&self, qos: QosClass) -> String {
        if !self.per_qos {
            return self.kubepods();
        }
        match qos {
            QosClass::Guaranteed => self.kubepods(),
            QosClass::Burstable => join(&self.kubepods(), "burstable"),
            QosClass::BestEffort => join(&self.kubepods(), "besteffort"),
        }
    }

    /// `…/pod<uid>` under the pod's tier.
    pub fn pod(&self, qos: QosClass, uid: &str) -> String {
        join(&self.tier(qos), &format!("pod{uid}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_layout() {
        let l = Layout {
            root: "/".into(),
            per_qos: true,
        };
        assert_eq!(l.kubepods(), "/kubepods");
        assert_eq!(l.pod(QosClass::Guaranteed, "u1"), "/kubepods/podu1");
        assert_eq!(
            l.pod(QosClass::Burstable, "u1"),
            "/kubepods/burstable/podu1"
        );
        assert_eq!(
            l.pod(QosClass::BestEffort, "u1"),
            "/kubepods/besteffort/podu1"
        );
        let t = Layout {
            root: "/test-root".into(),
            per_qos: true,
        };
        assert_eq!(t.tier(QosClass::Burstable), "/test-root/kubepods/burstable");
        let flat = Layout {
            root: "/flat".into(),
            per_qos: false,
        };
        assert_eq!(flat.pod(QosClass::BestEffort, "u"), "/flat/podu");
    }
}
