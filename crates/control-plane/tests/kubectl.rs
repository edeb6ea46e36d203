//! The real kubectl against an in-process control plane: what a user types and sees.

mod common;

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: nginx
    image: nginx:1.27
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_get_describe_label_annotate_patch_delete() {
    let c = common::start().await;
    let out = c.apply(POD).await;
    assert_eq!(out.ok().trim(), "pod/web created");

    let get = c.kubectl(&["get", "pods"]).await;
    let text = get.ok();
    assert!(text.starts_with("NAME"), "table header: {text}");
    assert!(text.contains("web"), "{text}");

    let yaml = c.kubectl(&["get", "pod", "web", "-o", "yaml"]).await;
    let y = yaml.ok();
    assert!(
        y.contains("serviceAccountName: default"),
        "ServiceAccount admission: {y}"
    );
    assert!(y.contains("phase: Pending"), "{y}");
    assert!(y.contains("uid:"), "{y}");

    let d = c.kubectl(&["describe", "pod", "web"]).await;
    let d = d.ok();
    assert!(d.contains("Name:") && d.contains("web"), "{d}");

    assert_eq!(
        c.kubectl(&["label", "pod", "web", "tier=front"])
            .await
            .ok()
            .trim(),
        "pod/web labeled"
    );
    assert_eq!(
        c.kubectl(&["annotate", "pod", "web", "note=hello"])
            .await
            .ok()
            .trim(),
        "pod/web annotated"
    );
    let labels = c
        .kubectl(&["get", "pods", "-l", "tier=front", "-o", "name"])
        .await;
    assert_eq!(labels.ok().trim(), "pod/web");
    let none = c
        .kubectl(&["get", "pods", "-l", "tier=back", "-o", "name"])
        .await;
    assert_eq!(none.code, 0);
    assert_eq!(none.stdout.trim(), "");

    let merge = c
        .kubectl(&[
            "patch",
            "pod",
            "web",
            "--type=merge",
            "-p",
            r#"{"metadata":{"labels":{"m":"1"}}}"#,
        ])
        .await;
    assert_eq!(merge.ok().trim(), "pod/web patched");
    let strategic = c
        .kubectl(&[
            "patch",
            "pod",
            "web",
            "-p",
            r#"{"metadata":{"annotations":{"s":"2"}}}"#,
        ])
        .await;
    assert_eq!(strategic.ok().trim(), "pod/web patched");
    let json = c
        .kubectl(&[
            "patch",
            "pod",
            "web",
            "--type=json",
            "-p",
            r#"[{"op":"add","path":"/metadata/labels/j","value":"3"}]"#,
        ])
        .await;
    assert_eq!(json.ok().trim(), "pod/web patched");
    let got = c
        .kubectl(&[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.metadata.labels.m}{.metadata.annotations.s}{.metadata.labels.j}",
        ])
        .await;
    assert_eq!(got.ok(), "123");

    // An unbound pod goes at once.
    assert_eq!(
        c.kubectl(&["delete", "pod", "web"]).await.ok().trim(),
        "pod \"web\" deleted"
    );
    let gone = c.kubectl(&["get", "pod", "web"]).await;
    assert_eq!(
        gone.fails().trim(),
        "Error from server (NotFound): pods \"web\" not found"
    );
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_print_as_kubectl_prints_them() {
    let c = common::start().await;
    let nf = c.kubectl(&["get", "pod", "nope"]).await;
    assert_eq!(
        nf.fails().trim(),
        "Error from server (NotFound): pods \"nope\" not found"
    );

    let bad = r#"
apiVersion: v1
kind: Pod
metadata: {name: bad}
spec:
  restartPolicy: Sometimes
  containers: [{name: c, image: busybox}]
"#;
    let out = c.kubectl_stdin(&["create", "-f", "-"], Some(bad)).await;
    let err = out.fails();
    assert!(err.contains("The Pod \"bad\" is invalid:"), "{err}");
    assert!(err.contains("spec.restartPolicy"), "{err}");

    let nsless = c.kubectl(&["get", "pods", "-n", "missing-ns"]).await;
    assert_eq!(
        nsless.code, 0,
        "listing in a missing namespace is empty, as upstream"
    );

    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\ndata: {a: \"1\"}\n";
    c.kubectl_stdin(&["create", "-f", "-"], Some(cm)).await.ok();
    let again = c.kubectl_stdin(&["create", "-f", "-"], Some(cm)).await;
    assert_eq!(
        again.fails().trim(),
        "Error from server (AlreadyExists): error when creating \"STDIN\": configmaps \"cm\" already exists"
    );

    // A stale resourceVersion is a conflict.
    let stale = c.kubectl(&["get", "configmap", "cm", "-o", "json"]).await;
    let stale_json = stale.ok().to_string();
    c.kubectl(&["label", "configmap", "cm", "x=y"]).await.ok();
    let replace = c
        .kubectl_stdin(&["replace", "-f", "-"], Some(&stale_json))
        .await;
    let err = replace.fails();
    assert!(
        err.contains("Operation cannot be fulfilled on configmaps \"cm\": the object has been modified; please apply your changes to the latest version and try again"),
        "{err}"
    );

    // metadata.uid is immutable: a patch naming another uid (a client that means an object
    // since deleted and recreated) is refused and changes nothing; the right uid applies.
    let wrong = c
        .kubectl(&[
            "patch",
            "configmap",
            "cm",
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"uid":"00000000-0000-0000-0000-000000000000"},"data":{"a":"2"}}"#,
        ])
        .await;
    let err = wrong.fails();
    assert!(
        err.contains("The ConfigMap \"cm\" is invalid: metadata.uid: Invalid value: \"00000000-0000-0000-0000-000000000000\": field is immutable"),
        "{err}"
    );
    let uid = c
        .kubectl(&["get", "configmap", "cm", "-o", "jsonpath={.metadata.uid}"])
        .await
        .ok()
        .to_string();
    let data = c
        .kubectl(&["get", "configmap", "cm", "-o", "jsonpath={.data.a}"])
        .await;
    assert_eq!(data.ok().trim(), "1", "the refused patch changed nothing");
    let patch = format!(
        r#"{{"metadata":{{"uid":"{}"}},"data":{{"a":"3"}}}}"#,
        uid.trim()
    );
    c.kubectl(&["patch", "configmap", "cm", "--type", "merge", "-p", &patch])
        .await
        .ok();
    let data = c
        .kubectl(&["get", "configmap", "cm", "-o", "jsonpath={.data.a}"])
        .await;
    assert_eq!(data.ok().trim(), "3");

    let other = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n";
    let intoms = c
        .kubectl_stdin(&["create", "-n", "nowhere", "-f", "-"], Some(other))
        .await;
    assert!(
        intoms.fails().contains("namespaces \"nowhere\" not found"),
        "{}",
        intoms.stderr
    );
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_leases_and_system_objects() {
    let c = common::start().await;
    let node = r#"
apiVersion: v1
kind: Node
metadata:
  name: n1
  labels: {kubernetes.io/hostname: n1}
status:
  addresses:
  - {type: InternalIP, address: 10.0.0.5}
  - {type: Hostname, address: n1}
  nodeInfo:
    kubeletVersion: v1.33.0
    osImage: Debian GNU/Linux 13
    kernelVersion: 6.1.0
    containerRuntimeVersion: nodus://0.1.0
    architecture: amd64
    operatingSystem: linux
    bootID: ""
    machineID: ""
    systemUUID: ""
    kubeProxyVersion: ""
  conditions:
  - {type: Ready, status: "True", reason: KubeletReady, message: ready}
"#;
    c.kubectl_stdin(&["create", "-f", "-"], Some(node))
        .await
        .ok();
    let wide = c.kubectl(&["get", "nodes", "-o", "wide"]).await;
    let text = wide.ok();
    assert!(text.contains("INTERNAL-IP"), "{text}");
    assert!(text.contains("10.0.0.5"), "{text}");

    let lease = r#"
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: n1, namespace: kube-node-lease}
spec: {holderIdentity: n1, leaseDurationSeconds: 40}
"#;
    c.kubectl_stdin(&["create", "-f", "-"], Some(lease))
        .await
        .ok();
    let leases = c.kubectl(&["get", "leases", "-n", "kube-node-lease"]).await;
    let text = leases.ok();
    assert!(text.contains("n1"), "{text}");

    let ns = c.kubectl(&["get", "namespaces", "-o", "name"]).await;
    let text = ns.ok();
    for n in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(text.contains(&format!("namespace/{n}")), "{text}");
    }
    let svc = c
        .kubectl(&[
            "get",
            "service",
            "kubernetes",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .await;
    assert_eq!(svc.ok(), "10.96.0.1");
    let pcs = c
        .kubectl(&[
            "get",
            "priorityclass",
            "system-node-critical",
            "-o",
            "jsonpath={.value}",
        ])
        .await;
    assert_eq!(pcs.ok(), "2000001000");
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_run_wait_and_watch() {
    let c = common::start().await;
    let dry = c
        .kubectl(&["run", "dry", "--image=busybox", "--dry-run=server"])
        .await;
    assert_eq!(dry.ok().trim(), "pod/dry created (server dry run)");
    let none = c.kubectl(&["get", "pod", "dry"]).await;
    assert!(none.fails().contains("NotFound"), "{}", none.stderr);

    assert_eq!(
        c.kubectl(&["run", "one", "--image=busybox"])
            .await
            .ok()
            .trim(),
        "pod/one created"
    );
    let wait = c
        .kubectl(&[
            "wait",
            "--for=jsonpath={.status.phase}=Pending",
            "pod/one",
            "--timeout=30s",
        ])
        .await;
    assert_eq!(wait.ok().trim(), "pod/one condition met");

    let home = c.dir.path().join("home");
    let mut watcher = tokio::process::Command::new(common::kubectl_bin())
        .arg("--kubeconfig")
        .arg(c.kubeconfig())
        .args(["get", "pods", "-w"])
        .env("HOME", &home)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl get -w");
    let stdout = watcher.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("header")
        .expect("line");
    assert!(first.is_some_and(|l| l.starts_with("NAME")));
    c.kubectl(&["run", "two", "--image=busybox"]).await.ok();
    let mut saw = false;
    for _ in 0..10 {
        let Ok(Ok(Some(l))) =
            tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await
        else {
            break;
        };
        if l.starts_with("two") {
            saw = true;
            break;
        }
    }
    assert!(saw, "kubectl get -w showed the new pod");
    let _ = watcher.kill().await;
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_twice_configures_and_describe_node_works() {
    let c = common::start().await;
    let dep = |replicas: u32| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, labels: {{app: web}}}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec:\n      containers: [{{name: nginx, image: nginx:1.27}}]\n"
        )
    };
    assert_eq!(
        c.apply(&dep(1)).await.ok().trim(),
        "deployment.apps/web created"
    );
    assert_eq!(
        c.apply(&dep(1)).await.ok().trim(),
        "deployment.apps/web unchanged"
    );
    assert_eq!(
        c.apply(&dep(2)).await.ok().trim(),
        "deployment.apps/web configured"
    );
    let r = c
        .kubectl(&[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.spec.replicas} {.metadata.generation}",
        ])
        .await;
    assert_eq!(r.ok(), "2 2");

    let node = "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nstatus:\n  addresses: [{type: InternalIP, address: 10.0.0.5}]\n";
    c.kubectl_stdin(&["create", "-f", "-"], Some(node))
        .await
        .ok();
    let d = c.kubectl(&["describe", "node", "n1"]).await;
    let text = d.ok();
    assert!(text.contains("Name:") && text.contains("n1"), "{text}");
    assert!(text.contains("InternalIP:  10.0.0.5"), "{text}");
    // Server-side apply over what client-side apply wrote: the replicas it changes belong
    // to kubectl-client-side-apply, as upstream answers.
    let ssa = c.apply_server_side(&dep(3)).await;
    assert!(
        ssa.fails().contains(
            "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using apps/v1: .spec.replicas"
        ),
        "{}",
        ssa.stderr
    );
    let pods = c.kubectl(&["get", "pods", "-A"]).await;
    assert_eq!(pods.code, 0, "{}", pods.stderr);
    c.handle.shutdown().await;
}

/// The networking, flowcontrol and apiregistration groups as kubectl sees them: Ingress
/// validation texts, DefaultIngressClass admission, NetworkPolicy defaulting, the APF
/// bootstrap objects, the Local APIServices, discovery and explain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn networking_flowcontrol_and_apiservices() {
    let c = common::start().await;

    let ingress = |name: &str, path: &str, path_type: &str| {
        format!(
            r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: {name}}}
spec:
  rules:
  - host: shop.example.com
    http:
      paths:
      - path: "{path}"
        pathType: {path_type}
        backend:
          service: {{name: web, port: {{number: 80}}}}
"#
        )
    };
    let bad_type = c
        .kubectl_stdin(&["create", "-f", "-"], Some(&ingress("bad", "/", "Regex")))
        .await;
    assert_eq!(
        bad_type.fails().trim(),
        "The Ingress \"bad\" is invalid: spec.rules[0].http.paths[0].pathType: Unsupported value: \"Regex\": supported values: \"Exact\", \"ImplementationSpecific\", \"Prefix\""
    );
    let bad_path = c
        .kubectl_stdin(
            &["create", "-f", "-"],
            Some(&ingress("bad", "shop/../admin", "Prefix")),
        )
        .await;
    assert_eq!(
        bad_path.fails().trim(),
        "The Ingress \"bad\" is invalid: \n* spec.rules[0].http.paths[0].path: Invalid value: \"shop/../admin\": must be an absolute path\n* spec.rules[0].http.paths[0].path: Invalid value: \"shop/../admin\": must not contain '/../'"
    );

    // No default class yet: the Ingress keeps no class.
    c.kubectl_stdin(
        &["create", "-f", "-"],
        Some(&ingress("before", "/", "Prefix")),
    )
    .await
    .ok();
    let class = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: nginx
  annotations: {ingressclass.kubernetes.io/is-default-class: "true"}
spec: {controller: k8s.io/ingress-nginx}
"#;
    assert_eq!(
        c.kubectl_stdin(&["create", "-f", "-"], Some(class))
            .await
            .ok()
            .trim(),
        "ingressclass.networking.k8s.io/nginx created"
    );
    c.kubectl_stdin(
        &["create", "-f", "-"],
        Some(&ingress("shop", "/cart", "Exact")),
    )
    .await
    .ok();
    let get = c.kubectl(&["get", "ingress"]).await;
    let rows: Vec<Vec<&str>> = get
        .ok()
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"]
    );
    // ADDRESS is empty (no controller wrote a load balancer status).
    assert_eq!(rows[1][..4], ["before", "<none>", "shop.example.com", "80"]);
    assert_eq!(rows[2][..4], ["shop", "nginx", "shop.example.com", "80"]);
    // `kubectl create ingress` sends a protobuf body.
    assert_eq!(
        c.kubectl(&[
            "create",
            "ingress",
            "simple",
            "--rule=foo.com/bar=svc1:8080"
        ])
        .await
        .ok()
        .trim(),
        "ingress.networking.k8s.io/simple created"
    );
    let simple = c
        .kubectl(&[
            "get",
            "ingress",
            "simple",
            "-o",
            "jsonpath={.spec.ingressClassName} {.spec.rules[0].http.paths[0].pathType} {.spec.rules[0].http.paths[0].backend.service.port.number}",
        ])
        .await;
    assert_eq!(simple.ok(), "nginx Exact 8080");
    let classes = c.kubectl(&["get", "ingressclass"]).await;
    let text = classes.ok();
    assert!(
        text.starts_with("NAME")
            && text.contains("CONTROLLER")
            && text.contains("PARAMETERS")
            && text.contains("k8s.io/ingress-nginx"),
        "{text}"
    );
    let bad_class = "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {name: bad}\nspec: {controller: nginx}\n";
    assert_eq!(
        c.kubectl_stdin(&["create", "-f", "-"], Some(bad_class))
            .await
            .fails()
            .trim(),
        "The IngressClass \"bad\" is invalid: spec.controller: Invalid value: \"nginx\": must be a domain-prefixed path (such as \"acme.io/foo\")"
    );

    // policyTypes: Ingress always, Egress when there are egress rules.
    let policies = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-in}
spec:
  podSelector: {matchLabels: {app: web}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: out-dns}
spec:
  podSelector: {}
  egress:
  - ports: [{port: 53}]
    to:
    - ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}
"#;
    c.kubectl_stdin(&["create", "-f", "-"], Some(policies))
        .await
        .ok();
    let types = |name: &'static str| {
        let c = &c;
        async move {
            c.kubectl(&[
                "get",
                "networkpolicy",
                name,
                "-o",
                "jsonpath={.spec.policyTypes}",
            ])
            .await
            .ok()
            .to_string()
        }
    };
    assert_eq!(types("deny-in").await, r#"["Ingress"]"#);
    assert_eq!(types("out-dns").await, r#"["Ingress","Egress"]"#);
    let proto = c
        .kubectl(&[
            "get",
            "netpol",
            "out-dns",
            "-o",
            "jsonpath={.spec.egress[0].ports[0].protocol}",
        ])
        .await;
    assert_eq!(proto.ok(), "TCP");
    let netpols = c.kubectl(&["get", "netpol"]).await;
    let text = netpols.ok();
    assert!(
        text.contains("POD-SELECTOR") && text.contains("app=web") && text.contains("<none>"),
        "{text}"
    );
    let outside = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: outside}
spec:
  podSelector: {}
  ingress:
  - from:
    - ipBlock: {cidr: 10.0.0.0/16, except: [192.168.0.0/24]}
"#;
    assert_eq!(
        c.kubectl_stdin(&["create", "-f", "-"], Some(outside))
            .await
            .fails()
            .trim(),
        "The NetworkPolicy \"outside\" is invalid: spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: \"192.168.0.0/24\": must be a strict subset of `cidr`"
    );

    // API Priority and Fairness: upstream's defaults, readable and protected.
    let apf = c
        .kubectl(&["get", "flowschemas,prioritylevelconfigurations"])
        .await;
    let text = apf.ok();
    for want in [
        "flowschema.flowcontrol.apiserver.k8s.io/exempt",
        "flowschema.flowcontrol.apiserver.k8s.io/catch-all",
        "flowschema.flowcontrol.apiserver.k8s.io/global-default",
        "flowschema.flowcontrol.apiserver.k8s.io/system-leader-election",
        "prioritylevelconfiguration.flowcontrol.apiserver.k8s.io/exempt",
        "prioritylevelconfiguration.flowcontrol.apiserver.k8s.io/workload-low",
        "PRIORITYLEVEL",
        "MATCHINGPRECEDENCE",
        "NOMINALCONCURRENCYSHARES",
        "QUEUELENGTHLIMIT",
    ] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
    let global = c.kubectl(&["get", "flowschema", "global-default"]).await;
    let rows: Vec<Vec<String>> = global
        .ok()
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    assert_eq!(
        rows[0],
        [
            "NAME",
            "PRIORITYLEVEL",
            "MATCHINGPRECEDENCE",
            "DISTINGUISHERMETHOD",
            "AGE",
            "MISSINGPL"
        ]
    );
    assert_eq!(
        [&rows[1][..4], &rows[1][5..]].concat(),
        [
            "global-default",
            "global-default",
            "9900",
            "ByUser",
            "False"
        ]
    );
    let patched = c
        .kubectl(&[
            "patch",
            "prioritylevelconfiguration",
            "catch-all",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"limited":{"nominalConcurrencyShares":50}}}"#,
        ])
        .await;
    let err = patched.fails();
    assert!(
        err.contains("spec: Invalid value:")
            && err.contains("spec of 'catch-all' must equal the fixed value"),
        "{err}"
    );

    // A schema naming a level that does not exist is marked as such (MISSINGPL).
    let orphan = r#"
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata: {name: batch-jobs}
spec:
  priorityLevelConfiguration: {name: batch}
  rules:
  - subjects: [{kind: Group, group: {name: batch-runners}}]
    resourceRules: [{verbs: [list], apiGroups: [batch], resources: [jobs], namespaces: ["*"]}]
"#;
    c.kubectl_stdin(&["create", "-f", "-"], Some(orphan))
        .await
        .ok();
    let missing = common::eventually("the Dangling condition", || async {
        let out = c
            .kubectl(&[
                "get",
                "flowschema",
                "batch-jobs",
                "-o",
                "jsonpath={.spec.matchingPrecedence} {.status.conditions[?(@.type==\"Dangling\")].status}",
            ])
            .await;
        let text = out.ok().to_string();
        text.ends_with("True").then_some(text)
    })
    .await;
    assert_eq!(missing, "1000 True", "matchingPrecedence defaults to 1000");

    // A Local APIService per served group-version, each Available.
    let services = c.kubectl(&["get", "apiservices"]).await;
    let text = services.ok();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["NAME", "SERVICE", "AVAILABLE", "AGE"]);
    for name in [
        "v1.",
        "v1.apps",
        "v1.networking.k8s.io",
        "v1.flowcontrol.apiserver.k8s.io",
        "v1.apiregistration.k8s.io",
        "v1beta1.metrics.k8s.io",
    ] {
        let row = rows
            .iter()
            .find(|r| r[0] == name)
            .unwrap_or_else(|| panic!("{name} missing from:\n{text}"));
        assert_eq!(row[1..3], ["Local", "True"], "{text}");
    }

    let resources = c.kubectl(&["api-resources", "-o", "name"]).await;
    let text = resources.ok();
    for name in [
        "ingresses.networking.k8s.io",
        "ingressclasses.networking.k8s.io",
        "networkpolicies.networking.k8s.io",
        "flowschemas.flowcontrol.apiserver.k8s.io",
        "prioritylevelconfigurations.flowcontrol.apiserver.k8s.io",
        "apiservices.apiregistration.k8s.io",
    ] {
        assert!(text.lines().any(|l| l == name), "{name} missing:\n{text}");
    }
    let explain = c.kubectl(&["explain", "ingress.spec.rules"]).await;
    let text = explain.ok();
    assert!(
        text.contains("KIND:       Ingress")
            && text.contains("GROUP:      networking.k8s.io")
            && text.contains("FIELD: rules <[]IngressRule>")
            && text.contains("http\t<HTTPIngressRuleValue>"),
        "{text}"
    );
    c.handle.shutdown().await;
}
