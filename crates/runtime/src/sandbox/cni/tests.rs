//! The plugin protocol against fake plugins (shell scripts recording their environment and
//! stdin): no root, no network changes.

use super::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;

const FAKE: &str = r#"#!/bin/sh
d=$(dirname "$0")/..
n=$(basename "$0")
cat > "$d/stdin-$n-$CNI_COMMAND"
echo "$CNI_COMMAND $n $CNI_IFNAME netns=$CNI_NETNS id=$CNI_CONTAINERID args=$CNI_ARGS path=$CNI_PATH" >> "$d/log"
if [ -f "$d/sleep-$n-$CNI_COMMAND" ]; then exec sleep 5; fi
if [ -f "$d/fail-$n-$CNI_COMMAND" ]; then cat "$d/fail-$n-$CNI_COMMAND"; exit 1; fi
if [ "$CNI_COMMAND" = ADD ]; then
  if [ -f "$d/result-$n" ]; then cat "$d/result-$n"; else echo '{"cniVersion":"1.0.0"}'; fi
fi
"#;

const IP_RESULT: &str = r#"{"cniVersion":"1.0.0","interfaces":[{"name":"br0"},{"name":"eth0","sandbox":"/x"}],"ips":[{"address":"10.9.0.7/24","gateway":"10.9.0.1","interface":1}]}"#;

struct Fake {
    dir: tempfile::TempDir,
    cni: Cni,
}

impl Fake {
    fn new() -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        fs::create_dir(&bin).unwrap();
        for name in ["loopback", "fakeip", "fakemeta", "fakeother"] {
            let p = bin.join(name);
            fs::write(&p, FAKE).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        }
        // Chained plugins pass the result on; the fakes print it from files.
        fs::write(dir.path().join("result-fakeip"), IP_RESULT).unwrap();
        fs::write(dir.path().join("result-fakemeta"), IP_RESULT).unwrap();
        let cni = Cni::new(CniConfig::new(
            vec![dir.path().join("nobin"), bin],
            dir.path().join("net.d"),
            dir.path().join("cache"),
        ));
        Fake { dir, cni }
    }

    fn p(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write_conf(&self, file: &str, json: &str) {
        fs::create_dir_all(self.p("net.d")).unwrap();
        fs::write(self.p("net.d").join(file), json).unwrap();
    }

    fn log(&self) -> Vec<String> {
        let log = fs::read_to_string(self.p("log")).unwrap_or_default();
        let _ = fs::remove_file(self.p("log"));
        log.lines().map(String::from).collect()
    }

    /// "COMMAND plugin ifname" of each logged call.
    fn calls(&self) -> Vec<String> {
        self.log()
            .iter()
            .map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" "))
            .collect()
    }

    fn stdin(&self, plugin: &str, cmd: &str) -> Value {
        serde_json::from_slice(&fs::read(self.p(&format!("stdin-{plugin}-{cmd}"))).unwrap())
            .unwrap()
    }
}

const CHAIN: &str = r#"{"cniVersion":"1.0.0","name":"fake","plugins":[
    {"type":"fakeip","ipam":{"type":"x"}},
    {"type":"fakemeta","capabilities":{"portMappings":true}}]}"#;

fn pod() -> PodNetworkInfo {
    let mut pod = PodNetworkInfo::new("web", "default", "uid-1");
    pod.port_mappings = vec![
        PortMapping {
            protocol: Protocol::Tcp,
            container_port: 8080,
            host_port: 18080,
            host_ip: String::new(),
        },
        // No host port: not passed to plugins.
        PortMapping {
            protocol: Protocol::Udp,
            container_port: 53,
            host_port: 0,
            host_ip: String::new(),
        },
    ];
    pod
}

#[tokio::test]
async fn sandbox_cni_status_and_default_config() {
    let f = Fake::new();
    let s = f.cni.status();
    assert!(!s.ready);
    assert_eq!(s.reason, "NetworkPluginNotReady");
    assert_eq!(
        s.message,
        format!(
            "Network plugin returns error: cni plugin not initialized: no network config found in {}",
            f.p("net.d").display()
        )
    );
    assert_eq!(s.condition().r#type, "NetworkReady");

    assert!(f.cni.ensure_default_config(Some("10.244.3.0/24")).unwrap());
    assert!(
        !f.cni.ensure_default_config(None).unwrap(),
        "second call writes nothing"
    );
    let list = f.cni.network().unwrap();
    assert_eq!(
        list.source.as_deref(),
        Some(f.p("net.d/10-nodus.conflist").as_path())
    );
    assert_eq!(list.name, "nodus");
    // The fake bin dir has no bridge plugin.
    let s = f.cni.status();
    assert!(!s.ready);
    assert!(
        s.message
            .contains("failed to find plugin \"bridge\" in path"),
        "{}",
        s.message
    );

    f.write_conf("00-fake.conflist", CHAIN);
    let s = f.cni.status();
    assert!(s.ready, "{}", s.message);
    assert_eq!(f.cni.network().unwrap().name, "fake");
}

#[tokio::test]
async fn sandbox_cni_add_check_del_follow_the_protocol() {
    let f = Fake::new();
    f.write_conf("10-fake.conflist", CHAIN);
    let netns = Path::new("/proc/self/ns/net");
    let r = f.cni.setup("sb1", netns, &pod()).await.unwrap();
    assert_eq!(r.primary_ip(), Some("10.9.0.7".parse().unwrap()));
    assert_eq!(r.network, "fake");

    let log = f.log();
    let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=sb1;K8S_POD_UID=uid-1";
    let cni_path = format!("{}:{}", f.p("nobin").display(), f.p("bin").display());
    assert_eq!(
        log,
        vec![
            format!("ADD loopback lo netns=/proc/self/ns/net id=sb1 args={args} path={cni_path}"),
            format!("ADD fakeip eth0 netns=/proc/self/ns/net id=sb1 args={args} path={cni_path}"),
            format!("ADD fakemeta eth0 netns=/proc/self/ns/net id=sb1 args={args} path={cni_path}"),
        ]
    );
    let first = f.stdin("fakeip", "ADD");
    assert_eq!(first["name"], "fake");
    assert_eq!(first["cniVersion"], "1.0.0");
    assert_eq!(first["ipam"]["type"], "x");
    assert!(first.get("prevResult").is_none());
    assert!(
        first.get("runtimeConfig").is_none(),
        "fakeip declares no capability"
    );
    let second = f.stdin("fakemeta", "ADD");
    assert_eq!(
        second["prevResult"],
        serde_json::from_str::<Value>(IP_RESULT).unwrap()
    );
    assert_eq!(
        second["runtimeConfig"],
        json!({"portMappings":[{"hostPort":18080,"containerPort":8080,"protocol":"tcp"}]})
    );
    let lo = f.stdin("loopback", "ADD");
    assert_eq!(lo["name"], "cni-loopback");

    // Cached in libcni's layout.
    let cached = cache::read(&f.p("cache/results/fake-sb1-eth0"))
        .unwrap()
        .unwrap();
    assert_eq!(cached.network_name, "fake");
    assert_eq!(cached.if_name, "eth0");
    assert_eq!(
        cached.cni_args[1],
        ["K8S_POD_NAMESPACE".to_string(), "default".to_string()]
    );
    assert!(f.p("cache/results/cni-loopback-sb1-lo").exists());

    f.cni.check("sb1", netns, &pod()).await.unwrap();
    assert_eq!(
        f.calls(),
        [
            "CHECK loopback lo",
            "CHECK fakeip eth0",
            "CHECK fakemeta eth0"
        ]
    );
    assert_eq!(
        f.stdin("fakeip", "CHECK")["prevResult"],
        serde_json::from_str::<Value>(IP_RESULT).unwrap()
    );

    // The conf file changes: DEL still uses what ADD used.
    fs::remove_file(f.p("net.d/10-fake.conflist")).unwrap();
    f.write_conf(
        "10-other.conflist",
        r#"{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"fakeother"}]}"#,
    );
    f.cni
        .teardown(
            "sb1",
            Some(netns),
            &PodNetworkInfo::new("web", "default", "uid-1"),
        )
        .await
        .unwrap();
    assert_eq!(
        f.calls(),
        ["DEL fakemeta eth0", "DEL fakeip eth0", "DEL loopback lo"]
    );
    let del = f.stdin("fakemeta", "DEL");
    assert_eq!(del["name"], "fake");
    assert_eq!(
        del["prevResult"],
        serde_json::from_str::<Value>(IP_RESULT).unwrap()
    );
    // The cached port mappings, not the (empty) ones of this call.
    assert_eq!(del["runtimeConfig"]["portMappings"][0]["hostPort"], 18080);
    assert!(!f.p("cache/results/fake-sb1-eth0").exists());
    assert!(!f.p("cache/results/cni-loopback-sb1-lo").exists());

    // Again: nothing cached, DEL with the current network, without prevResult; the netns is
    // given as a plain file, which is no namespace: CNI_NETNS is empty.
    let not_ns = f.p("not-a-netns");
    fs::write(&not_ns, "").unwrap();
    f.cni.teardown("sb1", Some(&not_ns), &pod()).await.unwrap();
    let log = f.log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(
        log[0].starts_with("DEL fakeother eth0 netns= id=sb1"),
        "{log:?}"
    );
    assert!(f.stdin("fakeother", "DEL").get("prevResult").is_none());

    let err = f.cni.check("sb1", netns, &pod()).await.unwrap_err();
    assert!(matches!(err, CniError::NoCachedResult { .. }), "{err}");
}

#[tokio::test]
async fn sandbox_cni_failures_name_the_plugin_and_clean_up() {
    let f = Fake::new();
    f.write_conf("10-fake.conflist", CHAIN);
    let netns = Path::new("/proc/self/ns/net");

    fs::write(
        f.p("fail-fakemeta-ADD"),
        r#"{"cniVersion":"1.0.0","code":999,"msg":"cannot map port","details":"port 18080 taken"}"#,
    )
    .unwrap();
    let err = f.cni.setup("sb2", netns, &pod()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "plugin type=\"fakemeta\" name=\"fake\" failed (add): cannot map port; port 18080 taken (CNI error code 999)"
    );
    // Setup deleted what it had added, and left no cache behind.
    assert_eq!(
        f.calls(),
        [
            "ADD loopback lo",
            "ADD fakeip eth0",
            "ADD fakemeta eth0",
            "DEL fakemeta eth0",
            "DEL fakeip eth0",
            "DEL loopback lo"
        ]
    );
    assert!(cache::entries_for(&f.p("cache"), "sb2").is_empty());
    fs::remove_file(f.p("fail-fakemeta-ADD")).unwrap();

    // A result that is not JSON.
    fs::write(f.p("result-fakeip"), "hello").unwrap();
    let err = f.cni.setup("sb2", netns, &pod()).await.unwrap_err();
    assert!(
        err.to_string().starts_with(
            "plugin type=\"fakeip\" name=\"fake\" (add) returned an invalid result: not JSON"
        ),
        "{err}"
    );
    // No IP on eth0.
    fs::write(f.p("result-fakeip"), r#"{"cniVersion":"1.0.0"}"#).unwrap();
    fs::write(f.p("result-fakemeta"), r#"{"cniVersion":"1.0.0"}"#).unwrap();
    let err = f.cni.setup("sb2", netns, &pod()).await.unwrap_err();
    assert!(
        err.to_string().contains("no IP address for interface eth0"),
        "{err}"
    );
    fs::write(f.p("result-fakeip"), IP_RESULT).unwrap();
    fs::write(f.p("result-fakemeta"), IP_RESULT).unwrap();
    let _ = f.log();

    // DEL: "not found" is success; anything else fails the teardown and keeps the cache.
    f.cni.setup("sb3", netns, &pod()).await.unwrap();
    fs::write(
        f.p("fail-fakemeta-DEL"),
        r#"{"code":11,"msg":"chain CNI-DN-1 not found"}"#,
    )
    .unwrap();
    fs::write(f.p("fail-fakeip-DEL"), "plain failure text").unwrap();
    let err = f
        .cni
        .teardown("sb3", Some(netns), &pod())
        .await
        .unwrap_err();
    assert!(
        err.to_string().starts_with(
            "plugin type=\"fakeip\" name=\"fake\" failed (delete): plain failure text"
        ),
        "{err}"
    );
    assert!(f.p("cache/results/fake-sb3-eth0").exists());
    assert!(!f.p("cache/results/cni-loopback-sb3-lo").exists());
    fs::remove_file(f.p("fail-fakeip-DEL")).unwrap();
    f.cni.teardown("sb3", Some(netns), &pod()).await.unwrap();
    assert!(!f.p("cache/results/fake-sb3-eth0").exists());

    // A plugin that hangs is killed.
    let mut cfg = f.cni.config().clone();
    cfg.exec_timeout = Duration::from_millis(300);
    let cni = Cni::new(cfg);
    fs::write(f.p("sleep-fakeip-ADD"), "").unwrap();
    let err = cni.setup("sb4", netns, &pod()).await.unwrap_err();
    assert!(matches!(err, CniError::Timeout { .. }), "{err}");
    assert!(
        err.to_string().contains("did not finish within 300ms"),
        "{err}"
    );

    // Bad requests.
    let err = f.cni.setup("../x", netns, &pod()).await.unwrap_err();
    assert!(matches!(err, CniError::InvalidRequest(_)), "{err}");
    fs::remove_file(f.p("net.d/10-fake.conflist")).unwrap();
    let err = f.cni.setup("sb5", netns, &pod()).await.unwrap_err();
    assert!(matches!(err, CniError::NotInitialized { .. }), "{err}");
    // Nothing cached, nothing configured: nothing to delete, not an error.
    f.cni.teardown("sb5", None, &pod()).await.unwrap();
}

#[test]
fn sandbox_cni_capability_args() {
    let mut p = pod();
    p.port_mappings[0].host_ip = "192.0.2.1".into();
    p.bandwidth = Some(Bandwidth {
        ingress_rate: 1000,
        ingress_burst: 10,
        egress_rate: 2000,
        egress_burst: 20,
    });
    p.dns = Some(cri::runtime::v1::DnsConfig {
        servers: vec!["10.96.0.10".into()],
        searches: vec!["svc.cluster.local".into()],
        options: vec![],
    });
    p.cgroup_path = Some("/kubepods/pod1".into());
    p.annotations.insert("a".into(), "b".into());
    let caps = Value::Object(p.capability_args());
    assert_eq!(
        caps,
        json!({
            "portMappings": [{"hostPort":18080,"containerPort":8080,"protocol":"tcp","hostIP":"192.0.2.1"}],
            "bandwidth": {"ingressRate":1000,"ingressBurst":10,"egressRate":2000,"egressBurst":20},
            "dns": {"servers":["10.96.0.10"],"searches":["svc.cluster.local"],"options":[]},
            "cgroupPath": "/kubepods/pod1",
            "io.kubernetes.cri.pod-annotations": {"a":"b"},
        })
    );

    let cri_cfg = cri::runtime::v1::PodSandboxConfig {
        metadata: Some(cri::runtime::v1::PodSandboxMetadata {
            name: "web".into(),
            uid: "u".into(),
            namespace: "ns".into(),
            attempt: 0,
        }),
        port_mappings: vec![cri::runtime::v1::PortMapping {
            protocol: cri::runtime::v1::Protocol::Udp as i32,
            container_port: 53,
            host_port: 5353,
            host_ip: String::new(),
        }],
        ..Default::default()
    };
    let info = PodNetworkInfo::from_cri(&cri_cfg);
    assert_eq!(
        (
            info.name.as_str(),
            info.namespace.as_str(),
            info.uid.as_str()
        ),
        ("web", "ns", "u")
    );
    assert_eq!(info.port_mappings[0].protocol, Protocol::Udp);
    assert_eq!(info.port_mappings[0].host_port, 5353);
}

#[test]
fn sandbox_cni_default_network_settings_apply_to_the_pod_cidr_network_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = CniConfig::new(vec![], dir.path().join("net.d"), dir.path().join("cache"));
    cfg.default_ip_masq = false;
    cfg.default_ipam_data_dir = Some(dir.path().join("ipam"));
    let cni = Cni::new(cfg);
    let read = || -> serde_json::Value {
        serde_json::from_slice(&fs::read(dir.path().join("net.d/10-nodus.conflist")).unwrap())
            .unwrap()
    };
    // The fallback subnet (no pod CIDR yet) keeps masquerading: no agent routes it.
    assert!(cni.ensure_default_config(None).unwrap());
    let v = read();
    assert_eq!(v["plugins"][0]["ipMasq"], true);
    assert_eq!(
        v["plugins"][0]["ipam"]["dataDir"],
        dir.path().join("ipam").to_string_lossy().as_ref()
    );
    fs::remove_file(dir.path().join("net.d/10-nodus.conflist")).unwrap();
    assert!(cni.ensure_default_config(Some("10.42.1.0/24")).unwrap());
    let v = read();
    assert_eq!(v["plugins"][0]["ipMasq"], false);
    assert_eq!(
        v["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
        "10.42.1.0/24"
    );
}
