//! Service environment variables (upstream's pkg/kubelet/envvars and getServiceEnvVarMap):
//! every container sees the `kubernetes` Service of the `default` namespace as
//! `KUBERNETES_SERVICE_HOST/PORT` and, with `enableServiceLinks` (the default), every
//! Service of its own namespace, in both the Kubernetes form (`<NAME>_SERVICE_HOST`,
//! `<NAME>_SERVICE_PORT[_<PORTNAME>]`) and Docker's links form (`<NAME>_PORT`,
//! `<NAME>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]`). Services without a cluster IP
//! (headless, ExternalName) get none.

use k8s_openapi::api::core::v1::Service;
use std::collections::BTreeMap;

/// upstream's masterServices: the services every pod gets, from `default`.
const MASTER_SERVICES: &[&str] = &["kubernetes"];

/// The variables of the services a pod in `namespace` sees.
pub fn service_env_map<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    namespace: &str,
    enable_service_links: bool,
) -> BTreeMap<String, String> {
    let mut chosen: BTreeMap<String, &Service> = BTreeMap::new();
    for svc in services {
        if cluster_ip(svc).is_none() {
            continue;
        }
        let name = svc.metadata.name.clone().unwrap_or_default();
        let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
        if ns == "default" && MASTER_SERVICES.contains(&name.as_str()) {
            chosen.entry(name).or_insert(svc);
        } else if ns == namespace && enable_service_links {
            chosen.insert(name, svc);
        }
    }
    from_services(chosen.into_values()).into_iter().collect()
}

/// The cluster IP, unless the service has none (upstream's IsServiceIPSet).
fn cluster_ip(svc: &Service) -> Option<&str> {
    let ip = svc.spec.as_ref()?.cluster_ip.as_deref()?;
    (!ip.is_empty() && ip != "None").then_some(ip)
}

/// upstream's makeEnvVariableName.
fn env_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

/// upstream's FromServices, in its order.
pub fn from_services<'a>(services: impl IntoIterator<Item = &'a Service>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for svc in services {
        let Some(ip) = cluster_ip(svc) else {
            continue;
        };
        let ports = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_deref())
            .unwrap_or_default();
        let Some(first) = ports.first() else {
            continue;
        };
        let prefix = env_name(svc.metadata.name.as_deref().unwrap_or_default());
        out.push((format!("{prefix}_SERVICE_HOST"), ip.to_string()));
        let port_var = format!("{prefix}_SERVICE_PORT");
        out.push((port_var.clone(), first.port.to_string()));
        for p in ports {
            if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((format!("{port_var}_{}", env_name(n)), p.port.to_string()));
            }
        }
        // Docker's link variables.
        let host_port = match ip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(_)) => |ip: &str, port: i32| format!("[{ip}]:{port}"),
            _ => |ip: &str, port: i32| format!("{ip}:{port}"),
        };
        for (i, p) in ports.iter().enumerate() {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let lower = proto.to_lowercase();
            let url = format!("{lower}://{}", host_port(ip, p.port));
            if i == 0 {
                out.push((format!("{prefix}_PORT"), url.clone()));
            }
            let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
            out.push((pp.clone(), url));
            out.push((format!("{pp}_PROTO"), lower));
            out.push((format!("{pp}_PORT"), p.port.to_string()));
            out.push((format!("{pp}_ADDR"), ip.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str, ip: &str, ports: &[(&str, i32, &str)]) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": ip, "ports": ports.iter().map(|(n, p, proto)| {
                let mut v = serde_json::json!({"port": p, "protocol": proto});
                if !n.is_empty() { v["name"] = serde_json::json!(n); }
                v
            }).collect::<Vec<_>>()}
        }))
        .unwrap()
    }

    #[test]
    fn variables_as_upstream_names_them() {
        let s = svc(
            "shop",
            "web-front",
            "10.96.0.20",
            &[("", 80, "TCP"), ("dns-udp", 53, "UDP")],
        );
        let got = from_services([&s]);
        let want: Vec<(&str, &str)> = vec![
            ("WEB_FRONT_SERVICE_HOST", "10.96.0.20"),
            ("WEB_FRONT_SERVICE_PORT", "80"),
            ("WEB_FRONT_SERVICE_PORT_DNS_UDP", "53"),
            ("WEB_FRONT_PORT", "tcp://10.96.0.20:80"),
            ("WEB_FRONT_PORT_80_TCP", "tcp://10.96.0.20:80"),
            ("WEB_FRONT_PORT_80_TCP_PROTO", "tcp"),
            ("WEB_FRONT_PORT_80_TCP_PORT", "80"),
            ("WEB_FRONT_PORT_80_TCP_ADDR", "10.96.0.20"),
            ("WEB_FRONT_PORT_53_UDP", "udp://10.96.0.20:53"),
            ("WEB_FRONT_PORT_53_UDP_PROTO", "udp"),
            ("WEB_FRONT_PORT_53_UDP_PORT", "53"),
            ("WEB_FRONT_PORT_53_UDP_ADDR", "10.96.0.20"),
        ];
        let got: Vec<(&str, &str)> = got.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn which_services_a_pod_sees() {
        let all = [
            svc(
                "default",
                "kubernetes",
                "10.96.0.1",
                &[("https", 443, "TCP")],
            ),
            svc("default", "other", "10.96.0.5", &[("", 80, "TCP")]),
            svc("shop", "web", "10.96.0.20", &[("", 80, "TCP")]),
            svc("shop", "headless", "None", &[("", 80, "TCP")]),
            svc("shop", "kubernetes", "10.96.0.30", &[("", 8443, "TCP")]),
        ];
        /// (namespace, enableServiceLinks, variables present, variables absent)
        type Case<'a> = (&'a str, bool, &'a [(&'a str, &'a str)], &'a [&'a str]);
        let cases: &[Case] = &[
            (
                "shop",
                true,
                // The namespace's own `kubernetes` Service shadows default's, as upstream.
                &[
                    ("KUBERNETES_SERVICE_HOST", "10.96.0.30"),
                    ("KUBERNETES_SERVICE_PORT", "8443"),
                    ("WEB_SERVICE_HOST", "10.96.0.20"),
                ],
                &["OTHER_SERVICE_HOST", "HEADLESS_SERVICE_HOST"],
            ),
            (
                "shop",
                false,
                &[
                    ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                    ("KUBERNETES_SERVICE_PORT", "443"),
                    ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
                ],
                &["WEB_SERVICE_HOST", "OTHER_SERVICE_HOST"],
            ),
            (
                "default",
                true,
                &[
                    ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                    ("OTHER_SERVICE_HOST", "10.96.0.5"),
                ],
                &["WEB_SERVICE_HOST"],
            ),
        ];
        for (ns, links, present, absent) in cases {
            let m = service_env_map(&all, ns, *links);
            for (k, v) in *present {
                assert_eq!(m.get(*k).map(String::as_str), Some(*v), "{ns} {links}: {k}");
            }
            for k in *absent {
                assert!(!m.contains_key(*k), "{ns} {links}: {k} should be absent");
            }
        }
    }
}
