//! The kubelet API on :10250 end to end: a `nodus kubelet` joined to `nodus control-plane`
//! (both in the test node's network namespace) serves logs, exec, attach and port-forward
//! to the real kubectl through the API server, refuses unauthenticated callers, asks the
//! API server who a token is and what it may do, and answers /stats/summary.
//!
//! Pods come from the static pod directory; the Node object is made by hand here (as the
//! kubelet's registration will), and the pod's API copy too unless the kubelet publishes
//! a mirror pod itself, so the API server can find the kubelet and the pod.

mod common;

use common::BareNode;
use common::kubelet::{Kubelet, NODE_NAME, container_status, is_running};
use common::kubelet_api::{ALLOWED_TOKEN, ControlPlane, DENIED_TOKEN, KUBELET_PORT};
use serde_json::Value;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(90);

const CONTAINERS: &str = r#"
  - name: main
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "echo one; echo two; echo three; exec sleep 3600"]
  - name: ticker
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "i=0; while [ $i -lt 30 ]; do echo tick $i; i=$((i+1)); sleep 0.3; done"]
  - name: chatter
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "while true; do echo chat; sleep 0.5; done"]
  - name: server
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "mkdir -p /www && echo hello-pf > /www/index.html && exec httpd -f -p 8080 -h /www"]
"#;

fn static_manifest() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: default\nspec:\n  containers:{CONTAINERS}"
    )
}

fn out(o: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn lines(s: &str) -> Vec<&str> {
    s.lines().filter(|l| !l.is_empty()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_reaches_the_kubelet_api_and_the_kubelet_guards_it() {
    if !common::have_root() {
        return;
    }
    let node = BareNode::new("10.89.7.0/24");
    node.cgroup.create();
    let cp = ControlPlane::start(node.netns.clone());
    let k = cp.join_kubelet(&node, &[]);
    k.write_manifest("web.yaml", &static_manifest());
    let name = format!("web-{NODE_NAME}");
    k.wait_pod(&name, T, "all containers running", |p| {
        is_running(p, "main") && is_running(p, "server")
    });
    cp.wait_mirror_running(&name, T);
    let url = |path: &str| format!("https://127.0.0.1:{KUBELET_PORT}{path}");
    let (crt, key) = cp.admin_cert();
    let (crt, key) = (crt.display().to_string(), key.display().to_string());

    // --- authentication and authorization on the kubelet itself ---
    let (code, body) = cp.curl(&[&url("/pods")]);
    assert_eq!((code, body.trim()), (401, "Unauthorized"), "anonymous");
    let (code, body) = cp.curl(&["--cert", &crt, "--key", &key, &url("/pods")]);
    assert_eq!(code, 200, "{body}");
    let pods: Value = serde_json::from_str(&body).expect("PodList");
    assert!(
        pods["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["metadata"]["name"] == name.as_str()),
        "{body}"
    );
    let bearer = |t: &str| format!("Authorization: Bearer {t}");
    let (code, body) = cp.curl(&["-H", &bearer(ALLOWED_TOKEN), &url("/healthz")]);
    assert_eq!(
        (code, body.trim()),
        (200, "ok"),
        "a token the API server knows"
    );
    let (code, body) = cp.curl(&["-H", &bearer("no-such-token"), &url("/healthz")]);
    assert_eq!(
        (code, body.trim()),
        (401, "Unauthorized"),
        "an unknown token"
    );
    let (code, body) = cp.curl(&["-H", &bearer(DENIED_TOKEN), &url("/stats/summary")]);
    assert_eq!(
        (code, body.trim()),
        (
            403,
            "Forbidden (user=system:node:other, verb=get, resource=nodes, subresource=stats)"
        ),
        "another node's identity, refused by the API server's Node authorizer"
    );

    let (code, body) = cp.curl(&["-H", &bearer(DENIED_TOKEN), &url("/logs/")]);
    assert_eq!(
        (code, body.trim()),
        (
            403,
            "Forbidden (user=system:node:other, verb=get, resource=nodes, subresource=log)"
        )
    );
    let (code, body) = cp.curl(&["--cert", &crt, "--key", &key, &url("/logs/")]);
    assert_eq!(code, 200, "{body}");
    assert!(body.starts_with("<pre>"), "{body}");

    // The same SubjectAccessReview machinery answers kubectl (protobuf request body).
    let said = cp.kubectl_ok(
        &["auth", "can-i", "get", "nodes", "--subresource=proxy"],
        None,
    );
    assert_eq!(said.trim(), "yes");

    // --- /stats/summary, /runningpods/, /run ---
    let (code, body) = cp.curl(&["--cert", &crt, "--key", &key, &url("/stats/summary")]);
    assert_eq!(code, 200, "{body}");
    let summary: Value = serde_json::from_str(&body).expect("Summary JSON");
    assert_eq!(summary["node"]["nodeName"], NODE_NAME);
    assert!(
        summary["node"]["memory"]["workingSetBytes"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(summary["node"]["fs"]["capacityBytes"].as_u64().unwrap() > 0);
    let pod = summary["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["podRef"]["name"] == name.as_str())
        .unwrap_or_else(|| panic!("no stats for {name}: {body}"));
    assert_eq!(pod["podRef"]["namespace"], "default");
    let names: Vec<&str> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert!(
        names.contains(&"main") && names.contains(&"server"),
        "{names:?}"
    );
    assert!(pod["memory"]["workingSetBytes"].as_u64().is_some(), "{pod}");
    assert!(
        pod["cpu"]["usageCoreNanoSeconds"].as_u64().is_some(),
        "{pod}"
    );
    let main = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "main")
        .unwrap();
    assert!(main["logs"]["usedBytes"].as_u64().unwrap() > 0, "{main}");
    assert!(
        main["logs"]["capacityBytes"].as_u64().unwrap() > 0,
        "{main}"
    );
    assert!(
        pod["ephemeral-storage"]["usedBytes"].as_u64().unwrap() > 0,
        "{pod}"
    );
    assert!(
        summary["node"]["network"]["interfaces"].is_array(),
        "{body}"
    );
    let pods_sc = &summary["node"]["systemContainers"][0];
    assert_eq!(pods_sc["name"], "pods", "{body}");
    assert!(
        pods_sc["memory"]["workingSetBytes"].as_u64().unwrap() > 0,
        "{body}"
    );
    // KubeletPSI (on by default): pressure as upstream's statsapi, where the kernel has it
    // (the node from /proc/pressure; pods from their cgroup in the cgroup2 hierarchy, the
    // hybrid `unified` mount on this machine).
    if std::path::Path::new("/proc/pressure/cpu").exists() {
        let node_cpu = &summary["node"]["cpu"]["psi"];
        assert!(node_cpu["some"]["total"].as_u64().is_some(), "{body}");
        assert!(node_cpu["full"]["avg10"].as_f64().is_some(), "{body}");
        assert!(summary["node"]["io"]["psi"]["some"].is_object(), "{body}");
        let cgroup2 = [
            "/sys/fs/cgroup/unified/cpu.pressure",
            "/sys/fs/cgroup/cgroup.controllers",
        ]
        .iter()
        .any(|p| std::path::Path::new(p).exists());
        if cgroup2 {
            assert!(pods_sc["memory"]["psi"]["some"].is_object(), "{body}");
            assert!(
                pod["cpu"]["psi"]["some"]["total"].as_u64().is_some(),
                "{pod}"
            );
            assert!(pod["memory"]["psi"]["full"].is_object(), "{pod}");
        }
    }

    // The read-only port (on in this harness) has the stats but none of the debugging
    // handlers.
    let (code, body) = k.get("/stats/summary");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(&name), "{body}");
    let (code, _) = k.get(&format!("/containerLogs/default/{name}/main"));
    assert_eq!(code, 404, "no logs on the unauthenticated port");

    let (code, body) = cp.curl(&["--cert", &crt, "--key", &key, &url("/runningpods/")]);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(&name), "{body}");

    let (code, body) = cp.curl(&[
        "--cert",
        &crt,
        "--key",
        &key,
        "-X",
        "POST",
        &url(&format!("/run/default/{name}/main?cmd=echo%20ran%20here")),
    ]);
    assert_eq!((code, body.trim()), (200, "ran here"));

    // --- kubectl logs through the API server ---
    let logs = cp.kubectl_ok(&["logs", &name, "-c", "main"], None);
    assert_eq!(lines(&logs), vec!["one", "two", "three"]);
    let logs = cp.kubectl_ok(&["logs", &name, "-c", "main", "--tail=1"], None);
    assert_eq!(lines(&logs), vec!["three"]);
    let logs = cp.kubectl_ok(&["logs", &name, "-c", "main", "--limit-bytes=5"], None);
    assert_eq!(logs, "one\nt");
    let logs = cp.kubectl_ok(&["logs", &name, "-c", "main", "--timestamps"], None);
    for (l, want) in lines(&logs).iter().zip(["one", "two", "three"]) {
        let (ts, text) = l.split_once(' ').unwrap();
        assert_eq!(text, want);
        assert!(
            ts.len() >= 20 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
            "{l}"
        );
    }
    let logs = cp.kubectl_ok(&["logs", &name, "-c", "main", "--since=1h"], None);
    assert_eq!(lines(&logs), vec!["one", "two", "three"]);

    // Follow the ticker until it exits; then its previous instance's log.
    let pod_now = k.pod(&name).unwrap();
    let ticker_restarts = container_status(&pod_now, "ticker")
        .and_then(|c| c["restartCount"].as_i64())
        .unwrap_or(0);
    let followed = cp.kubectl_ok(&["logs", "-f", &name, "-c", "ticker"], None);
    let ticks = lines(&followed);
    assert_eq!(ticks.last(), Some(&"tick 29"), "{followed}");
    let want: Vec<String> = (0..30).map(|i| format!("tick {i}")).collect();
    assert!(
        ticks.len() <= 30
            && want.ends_with(&ticks.iter().map(|s| s.to_string()).collect::<Vec<_>>()),
        "{followed}"
    );
    k.wait_pod(&name, T, "ticker restarted", |p| {
        container_status(p, "ticker")
            .and_then(|c| c["restartCount"].as_i64())
            .unwrap_or(0)
            > ticker_restarts.max(0)
    });
    let prev = cp.kubectl_ok(&["logs", "--previous", &name, "-c", "ticker"], None);
    assert_eq!(
        lines(&prev),
        want.iter().map(String::as_str).collect::<Vec<_>>()
    );
    // A container that never restarted has no previous log: the kubelet says so, and the
    // API server hands the refusal on as a Status, printed as upstream's kubectl prints it.
    let (code, body) = cp.curl(&[
        "--cert",
        &crt,
        "--key",
        &key,
        &url(&format!("/containerLogs/default/{name}/main?previous=true")),
    ]);
    assert_eq!(
        (code, body.trim()),
        (
            400,
            format!("previous terminated container \"main\" in pod \"{name}\" not found").as_str()
        )
    );
    let o = cp.kubectl(&["logs", "--previous", &name, "-c", "main"]);
    assert!(!o.status.success(), "{:?}", out(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr).trim(),
        format!(
            "Error from server (BadRequest): previous terminated container \"main\" in pod \"{name}\" not found"
        )
    );
    let (code, _) = cp.curl(&[
        "--cert",
        &crt,
        "--key",
        &key,
        &url(&format!("/containerLogs/default/{name}/nope")),
    ]);
    assert_eq!(code, 404, "a container the pod does not have");
    let (code, body) = cp.curl(&[
        "--cert",
        &crt,
        "--key",
        &key,
        &url(&format!("/containerLogs/default/{name}/main?stream=Stdout")),
    ]);
    assert_eq!(code, 400, "split streams are an alpha feature, off: {body}");

    // --- kubectl exec ---
    let said = cp.kubectl_ok(
        &[
            "exec",
            &name,
            "-c",
            "main",
            "--",
            "sh",
            "-c",
            "echo hello-$((1+2))",
        ],
        None,
    );
    assert_eq!(said.trim(), "hello-3");
    let said = cp.kubectl_ok(
        &["exec", "-i", &name, "-c", "main", "--", "cat"],
        Some("piped in\n"),
    );
    assert_eq!(said, "piped in\n");
    let o = cp.kubectl(&["exec", &name, "-c", "main", "--", "sh", "-c", "exit 3"]);
    let (_, err) = out(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("command terminated with exit code 3"), "{err}");
    // -it under a pseudo-terminal, as a user at a shell would run it.
    let kc = cp.admin_kubeconfig().display().to_string();
    let script = format!(
        "kubectl --kubeconfig {kc} exec -it {name} -c main -- sh -c 'tty; echo interactive-ok'"
    );
    let mut cmd = node.netns.command("script").unwrap();
    cmd.args(["-qec", &script, "/dev/null"])
        .env("HOME", cp.dir.path().join("home"))
        .stdin(std::process::Stdio::null());
    let o = cmd.output().unwrap();
    let (so, se) = out(&o);
    assert!(
        so.contains("/dev/pts/") && so.contains("interactive-ok"),
        "stdout: {so}\nstderr: {se}"
    );

    // --- kubectl attach: a running container's output from now on ---
    let mut cmd = node.netns.command("timeout").unwrap();
    cmd.args([
        "-s",
        "INT",
        "4",
        "kubectl",
        "--kubeconfig",
        &kc,
        "attach",
        &name,
        "-c",
        "chatter",
    ])
    .env("HOME", cp.dir.path().join("home"));
    let o = cmd.output().unwrap();
    let (so, se) = out(&o);
    assert!(so.contains("chat"), "attach stdout: {so}\nstderr: {se}");

    // --- kubectl port-forward ---
    assert_port_forward(&node.netns, &cp, &name, 18080);
    drop(k);
    drop(cp);
}

/// `kubectl port-forward pod/<name> <local>:8080`, run in `netns`, serves the pod's
/// `hello-pf` page on 127.0.0.1:<local>.
fn assert_port_forward(netns: &testkit::Netns, cp: &ControlPlane, name: &str, local: u16) {
    let kc = cp.admin_kubeconfig().display().to_string();
    let mut cmd = netns.command("kubectl").unwrap();
    cmd.args([
        "--kubeconfig",
        &kc,
        "port-forward",
        &format!("pod/{name}"),
        &format!("{local}:8080"),
    ])
    .env("HOME", cp.dir.path().join("home"))
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let mut pf = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = (0, String::new());
    while Instant::now() < deadline {
        got = cp.curl(&[&format!("http://127.0.0.1:{local}/index.html")]);
        if got.0 == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = pf.kill();
    let pf_out = pf.wait_with_output().unwrap();
    assert_eq!(
        (got.0, got.1.trim()),
        (200, "hello-pf"),
        "port-forward: {}",
        String::from_utf8_lossy(&pf_out.stderr)
    );
}

const VOLUME_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: vols
  namespace: default
  labels: {app: vols, tier: "web"}
  annotations: {note: "say \"hi\""}
spec:
  nodeName: vol-node
  containers:
  - name: app
    image: docker.io/library/busybox:latest
    resources: {limits: {cpu: 500m, memory: 64Mi}}
    env:
    - {name: FROM_CM, valueFrom: {configMapKeyRef: {name: cfg, key: a}}}
    - {name: FROM_SECRET, valueFrom: {secretKeyRef: {name: sec, key: password}}}
    - {name: MAYBE, valueFrom: {configMapKeyRef: {name: absent, key: a, optional: true}}}
    - {name: COMBINED, value: "$(FROM_CM)-$(CFG_b)"}
    envFrom:
    - {prefix: CFG_, configMapRef: {name: cfg}}
    - configMapRef: {name: digits}
  volumes:
  - name: whole
    configMap: {name: cfg}
  - name: picked
    configMap: {name: cfg, items: [{key: a, path: sub/a.txt, mode: 0600}], defaultMode: 0640}
  - name: creds
    secret: {secretName: sec, defaultMode: 0400}
  - name: maybe
    configMap: {name: absent, optional: true}
  - name: info
    downwardAPI:
      items:
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
      - {path: annotations, fieldRef: {fieldPath: metadata.annotations}}
      - {path: name, fieldRef: {fieldPath: metadata.name}}
      - {path: cpu, resourceFieldRef: {containerName: app, resource: limits.cpu, divisor: 1m}}
  - name: all-in-one
    projected:
      sources:
      - configMap: {name: cfg, items: [{key: b, path: b}]}
      - secret: {name: sec}
      - downwardAPI: {items: [{path: ns, fieldRef: {fieldPath: metadata.namespace}}]}
      - serviceAccountToken: {path: token, expirationSeconds: 3600}
"#;

fn mode(p: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// configMap, secret, downwardAPI and projected volumes and env references, at the crate
/// level against a real API server, read with the node's own identity (so the Node
/// authorizer's "pods bound to this node reference it" rule is what lets the watches in).
/// The full pod path through the API needs the kubelet's API pod source.
#[tokio::test(flavor = "multi_thread")]
async fn config_maps_and_secrets_become_files_and_env_and_updates_propagate() {
    use nodus_kubelet::kuberuntime::env::{EnvContext, make_env};
    use nodus_kubelet::objectcache::ObjectCache;
    use nodus_kubelet::volumes;
    if !common::have_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let cp = nodus_control_plane::start(nodus_control_plane::ControlPlaneConfig::new(
        dir.path().join("cp"),
        "127.0.0.1".parse().unwrap(),
        0,
    ))
    .await
    .expect("control plane");
    let kubectl = |args: &[&str], stdin: Option<&str>| -> String {
        use std::io::Write as _;
        let mut c = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&cp.kubeconfig)
            .args(args)
            .env("HOME", &home)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        if let (Some(mut s), Some(t)) = (c.stdin.take(), stdin) {
            s.write_all(t.as_bytes()).unwrap();
        }
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "kubectl {args:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    kubectl(
        &[
            "create",
            "configmap",
            "cfg",
            "--from-literal=a=1",
            "--from-literal=b=two",
        ],
        None,
    );
    kubectl(
        &[
            "create",
            "secret",
            "generic",
            "sec",
            "--from-literal=password=s3cret",
        ],
        None,
    );
    kubectl(
        &["create", "configmap", "unrelated", "--from-literal=x=y"],
        None,
    );
    kubectl(
        &[
            "create",
            "configmap",
            "digits",
            "--from-literal=1st=x",
            "--from-literal=ok=y",
        ],
        None,
    );
    kubectl(&["create", "-f", "-"], Some(VOLUME_POD));
    let pod_json = kubectl(&["get", "pod", "vols", "-o", "json"], None);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_str(&pod_json).unwrap();
    let uid = pod.metadata.uid.clone().unwrap();

    let node_kc =
        nodus_control_plane::pki::issue_node_kubeconfig(&cp.data_dir, "vol-node", &cp.url).unwrap();
    let client = nodus_kubelet::apiclient::client_from_kubeconfig(&node_kc)
        .await
        .unwrap();
    let tokens = nodus_kubelet::token::Manager::new(client.clone());
    let cache = ObjectCache::new(Some(client));
    let root = dir.path().join("kubelet");
    let sync = |objects| EnvContext {
        node_name: "vol-node".into(),
        node_cpu_milli: 2000,
        node_memory_bytes: 1 << 30,
        objects,
        ..Default::default()
    };
    let objects = volumes::fetch(Some(&cache), Some(&tokens), &pod).await;
    let ctx = sync(objects);
    let paths = volumes::set_up(&root, &pod, &ctx).expect("volumes set up");
    let read = |vol: &str, file: &str| {
        std::fs::read_to_string(paths[vol].join(file))
            .unwrap_or_else(|e| panic!("{vol}/{file}: {e}"))
    };
    assert_eq!(read("whole", "a"), "1");
    assert_eq!(read("whole", "b"), "two");
    assert_eq!(mode(&paths["whole"].join("a")), 0o644);
    assert_eq!(read("picked", "sub/a.txt"), "1");
    assert_eq!(mode(&paths["picked"].join("sub/a.txt")), 0o600);
    assert!(!paths["picked"].join("b").exists(), "items pick keys");
    assert_eq!(read("creds", "password"), "s3cret");
    assert_eq!(mode(&paths["creds"].join("password")), 0o400);
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        mounts.contains(&format!("{} tmpfs", paths["creds"].display())),
        "secret volumes live on tmpfs"
    );
    assert_eq!(
        std::fs::read_dir(&paths["maybe"])
            .unwrap()
            .filter(|e| {
                !e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("..")
            })
            .count(),
        0,
        "an optional, missing configMap is an empty volume"
    );
    assert_eq!(read("info", "labels"), "app=\"vols\"\ntier=\"web\"");
    assert_eq!(read("info", "annotations"), "note=\"say \\\"hi\\\"\"");
    assert_eq!(read("info", "name"), "vols");
    assert_eq!(read("info", "cpu"), "500");
    assert_eq!(read("all-in-one", "b"), "two");
    assert_eq!(read("all-in-one", "password"), "s3cret");
    assert_eq!(read("all-in-one", "ns"), "default");
    // The kubelet asked the API server for a token bound to this pod (TokenRequest): a
    // signed JWT, header.payload.signature.
    let token = read("all-in-one", "token");
    assert_eq!(token.split('.').count(), 3, "not a JWT: {token:?}");
    // The next sync rewrites the volume from the token manager's cache: the same token,
    // not a new TokenRequest per sync (it is refreshed at 80 % of its hour).
    let again = volumes::fetch(Some(&cache), Some(&tokens), &pod).await;
    assert_eq!(
        again.tokens[&("all-in-one".to_string(), "token".to_string())]
            .clone()
            .unwrap(),
        token,
        "a second sync asked for a new token"
    );
    // One cached token per source: this one and the admission-injected kube-api-access.
    assert_eq!(tokens.len(), again.tokens.len());
    assert_eq!(
        std::fs::read_link(paths["whole"].join("a")).unwrap(),
        std::path::Path::new("..data/a")
    );

    // Env: key refs, envFrom with prefix (the invalid key is skipped), optional refs.
    let c = &pod.spec.as_ref().unwrap().containers[0];
    let env = make_env(&pod, c, &ctx).expect("env");
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(get("FROM_CM").as_deref(), Some("1"));
    assert_eq!(get("FROM_SECRET").as_deref(), Some("s3cret"));
    assert_eq!(get("CFG_a").as_deref(), Some("1"));
    assert_eq!(get("CFG_b").as_deref(), Some("two"));
    assert_eq!(get("ok").as_deref(), Some("y"));
    assert_eq!(get("1st"), None, "not a valid variable name: skipped");
    assert_eq!(get("MAYBE"), None);
    assert_eq!(get("COMBINED").as_deref(), Some("1-two"));

    // An update reaches the volume at a later sync, swapped in through ..data.
    let before = std::fs::read_link(paths["whole"].join("..data")).unwrap();
    kubectl(
        &[
            "patch",
            "configmap",
            "cfg",
            "--type=merge",
            "-p",
            r#"{"data":{"a":"changed"}}"#,
        ],
        None,
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let objects = volumes::fetch(Some(&cache), None, &pod).await;
        volumes::set_up(&root, &pod, &sync(objects)).expect("resync");
        if read("whole", "a") == "changed" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "update never arrived");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(read("picked", "sub/a.txt"), "changed");
    assert_ne!(
        std::fs::read_link(paths["whole"].join("..data")).unwrap(),
        before
    );

    // A missing, required configMap: the volume fails with upstream's message, and so
    // does a container whose env needs it; a key that is not there is named.
    let mut broken = pod.clone();
    broken.metadata.uid = Some("broken-uid".into());
    let spec = broken.spec.as_mut().unwrap();
    spec.volumes = Some(vec![
        serde_json::from_value(serde_json::json!(
            {"name": "gone", "configMap": {"name": "nope"}}
        ))
        .unwrap(),
    ]);
    spec.containers[0].env = Some(vec![
        serde_json::from_value(serde_json::json!(
            {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "zzz"}}}
        ))
        .unwrap(),
    ]);
    spec.containers[0].env_from = None;
    // The node may not read an object no pod bound to it references.
    let objects = volumes::fetch(Some(&cache), None, &broken).await;
    let err = volumes::set_up(&root, &broken, &sync(objects.clone()))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("MountVolume.SetUp failed for volume \"gone\" : "),
        "{err}"
    );
    let env_err = make_env(
        &broken,
        &broken.spec.as_ref().unwrap().containers[0],
        &sync(objects),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(env_err, "couldn't find key zzz in ConfigMap default/cfg");
    // With the admin's identity the object's absence is what shows.
    let admin = nodus_kubelet::apiclient::client_from_kubeconfig(&cp.kubeconfig)
        .await
        .unwrap();
    let admin_cache = ObjectCache::new(Some(admin));
    let objects = volumes::fetch(Some(&admin_cache), None, &broken).await;
    let err = volumes::set_up(&root, &broken, &sync(objects))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "MountVolume.SetUp failed for volume \"gone\" : configmap \"nope\" not found"
    );

    volumes::tear_down(&root, &uid).unwrap();
    volumes::tear_down(&root, "broken-uid").unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(&root.display().to_string()),
        "tmpfs left mounted"
    );
    cache.unregister_pod(&uid);
    cp.shutdown().await;
}

/// A pod bound to the test node, for the API server (the kubelet's API source runs it).
fn pod_yaml(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  labels: {{app: {name}}}\nspec:\n  nodeName: {NODE_NAME}\n{spec}"
    )
}

const VOL_SPEC: &str = r#"  containers:
  - name: app
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "exec sleep 3600"]
    env:
    - {name: FROM_CM, valueFrom: {configMapKeyRef: {name: site, key: index.html}}}
    envFrom:
    - {prefix: S_, secretRef: {name: creds}}
    volumeMounts:
    - {name: site, mountPath: /site}
    - {name: creds, mountPath: /creds}
    - {name: info, mountPath: /info}
  volumes:
  - {name: site, configMap: {name: site}}
  - {name: creds, secret: {secretName: creds}}
  - name: info
    downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}
"#;

const BROKEN_ENV_SPEC: &str = r#"  containers:
  - name: app
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "exec sleep 3600"]
    env:
    - {name: X, valueFrom: {configMapKeyRef: {name: missing, key: x}}}
"#;

const BROKEN_MOUNT_SPEC: &str = r#"  containers:
  - name: app
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "exec sleep 3600"]
    volumeMounts:
    - {name: cfg, mountPath: /cfg}
  volumes:
  - {name: cfg, configMap: {name: missing-too}}
"#;

/// The kubelet's own pod path with API objects: configMap, secret and downward API files
/// inside a running container, env from a configMap and a secret, an update reaching the
/// running container, and pods whose objects are missing held back with upstream's reasons
/// while the others run.
///
/// The pods come from the API server, bound to the node: that binding is what lets the
/// Node authorizer give the kubelet their objects.
#[tokio::test(flavor = "multi_thread")]
async fn pods_get_config_maps_and_secrets_as_files_and_env() {
    if !common::have_root() {
        return;
    }
    let node = BareNode::new("10.89.8.0/24");
    node.cgroup.create();
    let cp = ControlPlane::start(node.netns.clone());
    cp.kubectl_ok(
        &[
            "create",
            "configmap",
            "site",
            "--from-literal=index.html=v1",
        ],
        None,
    );
    cp.kubectl_ok(
        &[
            "create",
            "secret",
            "generic",
            "creds",
            "--from-literal=token=t0p",
        ],
        None,
    );
    for (n, spec) in [
        ("vol", VOL_SPEC),
        ("broken", BROKEN_ENV_SPEC),
        ("nomount", BROKEN_MOUNT_SPEC),
    ] {
        cp.kubectl_ok(&["create", "-f", "-"], Some(&pod_yaml(n, spec)));
    }
    let mut k = cp.join_kubelet(&node, &["--sync-frequency".into(), "2s".into()]);
    let vol = "vol".to_string();
    k.wait_pod(&vol, T, "app running", |p| is_running(p, "app"));
    let exec = |cmd: &str| cp.kubectl_ok(&["exec", &vol, "-c", "app", "--", "sh", "-c", cmd], None);
    assert_eq!(exec("cat /site/index.html"), "v1");
    assert_eq!(exec("cat /creds/token"), "t0p");
    assert_eq!(exec("cat /info/labels"), "app=\"vol\"");
    assert_eq!(exec("echo $FROM_CM $S_token"), "v1 t0p\n");
    assert!(
        exec("grep ' /creds ' /proc/mounts").contains("tmpfs"),
        "secrets are on tmpfs"
    );

    let broken = k.wait_pod("broken", T, "config error", |p| {
        container_status(p, "app")
            .is_some_and(|c| c["state"]["waiting"]["reason"] == "CreateContainerConfigError")
    });
    assert_eq!(
        container_status(&broken, "app").unwrap()["state"]["waiting"]["message"],
        "configmap \"missing\" not found"
    );
    let nomount = k.wait_pod("nomount", T, "mount error", |p| {
        container_status(p, "app").is_some_and(|c| {
            c["state"]["waiting"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("MountVolume.SetUp failed"))
        })
    });
    let st = container_status(&nomount, "app").unwrap();
    assert_eq!(st["state"]["waiting"]["reason"], "ContainerCreating");
    assert_eq!(
        st["state"]["waiting"]["message"],
        "MountVolume.SetUp failed for volume \"cfg\" : configmap \"missing-too\" not found"
    );
    // `kubectl describe pod` shows why, as a FailedMount event.
    let mut events = String::new();
    for _ in 0..100 {
        events = cp.kubectl_ok(
            &[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=nomount",
                "-o",
                "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
            ],
            None,
        );
        if events.contains("FailedMount") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(
        events.contains("FailedMount: MountVolume.SetUp failed for volume \"cfg\" : configmap \"missing-too\" not found"),
        "{events}"
    );

    // An update reaches the running container's files at a later sync; env keeps the
    // value the container started with, as upstream.
    cp.kubectl_ok(
        &[
            "patch",
            "configmap",
            "site",
            "--type=merge",
            "-p",
            r#"{"data":{"index.html":"v2"}}"#,
        ],
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if exec("cat /site/index.html") == "v2" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the update never reached the pod\n{}",
            k.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(exec("echo $FROM_CM"), "v1\n");
    // The missing configMap appears: the held-back pod starts.
    cp.kubectl_ok(
        &["create", "configmap", "missing", "--from-literal=x=now"],
        None,
    );
    k.wait_pod("broken", T, "running once its configMap exists", |p| {
        is_running(p, "app")
    });
    assert!(
        is_running(&k.pod(&vol).unwrap(), "app"),
        "others unaffected"
    );

    // A pod that ran to completion keeps no volume mounted on the host (upstream's
    // syncTerminatedPod unmounts them), while a running pod's secret and projected
    // service-account token stay on their tmpfs.
    cp.kubectl_ok(&["create", "-f", "-"], Some(&pod_yaml("done", DONE_SPEC)));
    let done = k.wait_pod("done", T, "Succeeded", |p| {
        p["status"]["phase"] == "Succeeded"
    });
    let done_dir = k
        .root()
        .join("pods")
        .join(done["metadata"]["uid"].as_str().unwrap());
    let vol_dir = k
        .root()
        .join("pods")
        .join(k.pod(&vol).unwrap()["metadata"]["uid"].as_str().unwrap());
    let deadline = Instant::now() + T;
    loop {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let under = |d: &std::path::Path| {
            mountinfo
                .lines()
                .filter(|l| l.contains(&format!(" {}/", d.display())))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let (left, running) = (under(&done_dir), under(&vol_dir));
        if left.is_empty() {
            assert!(
                running
                    .iter()
                    .any(|l| l.contains("/kubernetes.io~secret/creds "))
                    && running
                        .iter()
                        .any(|l| l.contains("/kubernetes.io~projected/kube-api-access-")),
                "the running pod's secret and token are tmpfs mounts: {running:#?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the Succeeded pod's volumes stay mounted: {left:#?}\n{}",
            k.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        done_dir.is_dir(),
        "the terminated pod keeps its directory until deleted"
    );

    // A kubelet that died between a pod's end and the unmount left its tmpfs behind: the
    // next kubelet, which adopts the finished pod without running it, unmounts it.
    k.kill();
    let stale = done_dir.join("volumes/kubernetes.io~secret/creds");
    nix::mount::mount(
        Some("tmpfs"),
        &stale,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    k.start_again();
    let deadline = Instant::now() + T;
    while std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains(&format!(" {} ", stale.display()))
    {
        if Instant::now() >= deadline {
            let _ = nix::mount::umount2(&stale, nix::mount::MntFlags::MNT_DETACH);
            panic!(
                "the restarted kubelet left the finished pod's volume mounted\n{}",
                k.log()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(
        k.pod("done").unwrap()["status"]["phase"],
        "Succeeded",
        "the finished pod is adopted as it was, not run again"
    );
    drop(k);
    drop(cp);
}

const DONE_SPEC: &str = r#"  restartPolicy: Never
  containers:
  - name: app
    image: docker.io/library/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["cat", "/creds/token"]
    volumeMounts:
    - {name: creds, mountPath: /creds}
  volumes:
  - {name: creds, secret: {secretName: creds}}
"#;

/// The same kubelet API on containerd: logs from containerd's log files, exec and
/// port-forward proxied to containerd's own streaming server.
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_logs_exec_and_port_forward_work_on_containerd() {
    if !common::have_root() {
        return;
    }
    let netns = std::sync::Arc::new(testkit::Netns::new("kapi-ctrd").unwrap());
    let base = tempfile::tempdir().unwrap();
    let ctrd = common::node::start_containerd(&netns, base.path(), "10.89.9.0/24");
    let cgroup = testkit::CgroupParent::new("kapi-ctrd");
    cgroup.create();
    let cp = ControlPlane::start(netns.clone());
    let flags = cp.kubelet_flags(NODE_NAME);
    let flag_refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let k = Kubelet::start(netns.clone(), &ctrd.endpoint(), &cgroup.path(), &flag_refs);
    k.write_manifest("web.yaml", &static_manifest());
    let name = format!("web-{NODE_NAME}");
    k.wait_pod(&name, T, "main and server running", |p| {
        is_running(p, "main") && is_running(p, "server")
    });
    cp.wait_mirror_running(&name, T);
    let logs = cp.kubectl_ok(&["logs", &name, "-c", "main", "--tail=2"], None);
    assert_eq!(lines(&logs), vec!["two", "three"]);
    let said = cp.kubectl_ok(
        &[
            "exec",
            &name,
            "-c",
            "main",
            "--",
            "sh",
            "-c",
            "echo on-$((40+2))",
        ],
        None,
    );
    assert_eq!(said.trim(), "on-42");
    let o = cp.kubectl(&["exec", &name, "-c", "main", "--", "sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7), "{:?}", out(&o));
    assert_port_forward(&netns, &cp, &name, 18081);
    drop(k);
    drop(cp);
    drop(ctrd);
}

/// The API server's TokenReview and SubjectAccessReview, as the kubelet's webhooks ask
/// them: a known token is a user with its groups, an unknown one is not authenticated; the
/// Node authorizer refuses one node another node's proxy; malformed reviews are 422.
#[tokio::test(flavor = "multi_thread")]
async fn reviews_answer_with_the_api_servers_authenticator_and_authorizer() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let data = dir.path().join("cp");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("tokens.csv"),
        format!("{ALLOWED_TOKEN},alice,1001,\"dev,ops\"\n"),
    )
    .unwrap();
    let cp = nodus_control_plane::start(nodus_control_plane::ControlPlaneConfig::new(
        &data,
        "127.0.0.1".parse().unwrap(),
        0,
    ))
    .await
    .expect("control plane");
    let raw = |path: &str, body: serde_json::Value| -> (bool, String) {
        use std::io::Write as _;
        let mut c = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&cp.kubeconfig)
            .args(["create", "--raw", path, "-f", "-"])
            .env("HOME", &home)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin
            .take()
            .unwrap()
            .write_all(body.to_string().as_bytes())
            .unwrap();
        let o = c.wait_with_output().unwrap();
        (
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )
    };
    let tr = "/apis/authentication.k8s.io/v1/tokenreviews";
    let (ok, out) = raw(
        tr,
        serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": ALLOWED_TOKEN}}),
    );
    assert!(ok, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"]["authenticated"], true);
    assert_eq!(v["status"]["user"]["username"], "alice");
    assert_eq!(
        v["status"]["user"]["groups"],
        serde_json::json!(["dev", "ops", "system:authenticated"])
    );
    let (ok, out) = raw(
        tr,
        serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": "nope"}}),
    );
    assert!(ok, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    // `authenticated` is omitempty upstream: a refused token leaves it out and says why.
    assert_ne!(v["status"]["authenticated"], true, "{out}");
    assert!(
        v["status"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("invalid bearer token")),
        "{out}"
    );
    let (ok, out) = raw(
        tr,
        serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {}}),
    );
    assert!(!ok && out.contains("spec.token"), "{out}");

    let sar = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    let review = |user: &str, groups: &[&str], sub: &str| {
        serde_json::json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": {
                "verb": "get", "version": "v1", "resource": "nodes", "subresource": sub, "name": "n1"}}})
    };
    let allowed = |body| {
        let (ok, out) = raw(sar, body);
        assert!(ok, "{out}");
        let v: Value = serde_json::from_str(&out).unwrap();
        (
            v["status"]["allowed"] == true,
            v["status"]["reason"].as_str().unwrap_or("").to_string(),
        )
    };
    assert!(allowed(review("kubernetes-admin", &["system:masters"], "proxy")).0);
    assert!(
        !allowed(review("alice", &["dev"], "stats")).0,
        "RBAC: an unbound user may not read a node's stats"
    );
    let (ok, out) = raw(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "dev-admin"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "dev"}]}),
    );
    assert!(ok, "{out}");
    assert!(
        allowed(review("alice", &["dev"], "stats")).0,
        "bound through her group"
    );
    let (ok, reason) = allowed(review("system:node:n2", &["system:nodes"], "proxy"));
    assert!(!ok, "one node may not use another's kubelet API");
    assert!(reason.contains("no relationship found"), "{reason}");
    let (ok, out) = raw(
        sar,
        serde_json::json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}}),
    );
    assert!(
        !ok && out.contains("at least one of user or group"),
        "{out}"
    );
    cp.shutdown().await;
}
