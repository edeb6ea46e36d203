//! The node's kubeconfigs pointed at its API server load balancer
//! ([`nodus_serving::loadbalancer`]), which forwards to whichever of several API servers
//! answers.

use anyhow::Context as _;

/// Writes a copy of the kubeconfig at `src` whose clusters point at `url`, to `dst` (0600):
/// paths in it are made absolute, as they were relative to `src`'s directory.
pub fn rewrite_kubeconfig(
    src: &std::path::Path,
    dst: &std::path::Path,
    url: &str,
) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(src).with_context(|| format!("reading {}", src.display()))?;
    let mut kc: serde_yaml::Value =
        serde_yaml::from_str(&text).with_context(|| format!("parsing {}", src.display()))?;
    let base = src.parent().unwrap_or(std::path::Path::new("."));
    let absolute = |v: &mut serde_yaml::Value| {
        if let Some(p) = v.as_str()
            && !std::path::Path::new(p).is_absolute()
        {
            *v = serde_yaml::Value::String(base.join(p).display().to_string());
        }
    };
    for list in ["clusters", "users"] {
        let Some(items) = kc.get_mut(list).and_then(|v| v.as_sequence_mut()) else {
            continue;
        };
        for item in items {
            let inner = if list == "clusters" {
                "cluster"
            } else {
                "user"
            };
            let Some(m) = item.get_mut(inner).and_then(|v| v.as_mapping_mut()) else {
                continue;
            };
            if list == "clusters" {
                m.insert("server".into(), url.into());
            }
            for key in [
                "certificate-authority",
                "client-certificate",
                "client-key",
                "tokenFile",
            ] {
                if let Some(v) = m.get_mut(key) {
                    absolute(v);
                }
            }
        }
    }
    let out = serde_yaml::to_string(&kc)?;
    nodus_serving::private::write(dst, out.as_bytes())
        .with_context(|| format!("writing {}", dst.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rewritten_kubeconfig_points_at_the_balancer_with_absolute_paths() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("kubelet.kubeconfig");
        std::fs::write(
            &src,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority: pki/ca.crt\nusers:\n- name: u\n  user:\n    client-certificate: /abs/client.pem\n    client-key: client.key\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
        )
        .unwrap();
        let dst = d.path().join("out").join("lb.kubeconfig");
        std::fs::create_dir(d.path().join("out")).unwrap();
        rewrite_kubeconfig(&src, &dst, "https://127.0.0.1:6444").unwrap();
        let kc = kube::config::Kubeconfig::read_from(&dst).unwrap();
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6444"));
        let ca = d.path().join("pki/ca.crt").display().to_string();
        assert_eq!(cluster.certificate_authority.as_deref(), Some(ca.as_str()));
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(user.client_certificate.as_deref(), Some("/abs/client.pem"));
        let key = d.path().join("client.key").display().to_string();
        assert_eq!(user.client_key.as_deref(), Some(key.as_str()));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dst).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
