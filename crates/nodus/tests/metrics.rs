//! Metrics end to end, through `nodus up` and the real kubectl: the kubelet's
//! `/metrics/resource` (through the API server's node proxy, so with the kubelet API's
//! authentication and authorization) has the running pod's container working set; the
//! API server's `/metrics` counts requests; and `metrics.k8s.io`, fed by scraping the
//! kubelets, makes `kubectl top node` and `kubectl top pod` print the node and the pod.

mod common;

use common::up::Up;
use std::time::Duration;

const POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: busy
  labels:
    app: busy
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "while true; do i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done; sleep 1; done"]
"#;

/// Runs `kubectl top …` until it prints a row for `name`, and returns that row's fields.
fn top_row(up: &Up, args: &[&str], name: &str) -> Vec<String> {
    let mut last = String::new();
    // metrics-server's first rate needs two scrapes, 15 s apart.
    for _ in 0..60 {
        let (ok, out, err) = up.k(args);
        if ok
            && let Some(row) = out
                .lines()
                .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                .find(|f| f.iter().any(|x| x == name))
        {
            return row;
        }
        last = format!("{out}{err}");
        std::thread::sleep(Duration::from_secs(2));
    }
    panic!(
        "kubectl {args:?} never listed {name}; last: {last}\n{}",
        up.log()
    );
}

fn is_cpu(s: &str) -> bool {
    s.strip_suffix('m')
        .is_some_and(|n| n.parse::<u64>().is_ok())
}

fn is_memory(s: &str) -> bool {
    s.strip_suffix("Mi")
        .is_some_and(|n| n.parse::<u64>().is_ok())
}

#[test]
fn kubectl_top_and_the_metrics_endpoints_work() {
    if !common::have_root() {
        return;
    }
    let node = "metrics-node";
    let up = Up::start("nodus-metrics", "10.99.97.0/24", node);
    up.apply(POD);
    up.running("busy");

    // The kubelet's resource metrics, through the API server's node proxy.
    let path = format!("/api/v1/nodes/{node}/proxy/metrics/resource");
    let (ok, out, err) = up.k(&["get", "--raw", &path]);
    assert!(ok, "{out}{err}");
    let line = out
        .lines()
        .find(|l| {
            l.starts_with(
                "container_memory_working_set_bytes{container=\"app\",namespace=\"default\",pod=\"busy\"}",
            )
        })
        .unwrap_or_else(|| panic!("no working set for the pod's container in\n{out}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "value and timestamp: {line}");
    assert!(fields[1].parse::<f64>().unwrap() > 0.0, "{line}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("node_cpu_usage_seconds_total ")),
        "{out}"
    );
    assert!(out.lines().any(|l| l == "scrape_error 0"), "{out}");

    // The API server's own metrics.
    let (ok, out, err) = up.k(&["get", "--raw", "/metrics"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.lines().any(|l| l.starts_with("apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1\"} ")),
        "no counted pod creation in\n{out}"
    );
    assert!(
        out.contains("# TYPE apiserver_request_duration_seconds histogram"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("apiserver_storage_objects{resource=\"pods\"} ")),
        "{out}"
    );

    // kubectl finds the Metrics API and prints the node and the pod.
    let row = top_row(&up, &["top", "node"], node);
    assert_eq!(
        row.len(),
        5,
        "NAME CPU(cores) CPU(%) MEMORY(bytes) MEMORY(%): {row:?}"
    );
    assert!(is_cpu(&row[1]), "{row:?}");
    assert!(row[2].ends_with('%'), "{row:?}");
    assert!(is_memory(&row[3]), "{row:?}");
    let row = top_row(&up, &["top", "pod", "-A"], "busy");
    assert_eq!(
        row.len(),
        4,
        "NAMESPACE NAME CPU(cores) MEMORY(bytes): {row:?}"
    );
    assert_eq!(row[0], "default");
    assert!(is_cpu(&row[2]), "{row:?}");
    assert!(is_memory(&row[3]), "{row:?}");
    let row = top_row(
        &up,
        &["top", "pod", "-l", "app=busy", "--containers"],
        "busy",
    );
    assert_eq!(row[1], "app", "POD NAME CPU(cores) MEMORY(bytes): {row:?}");

    // A pod that is not there is NotFound, in the Metrics API's words.
    let (ok, _, err) = up.k(&[
        "get",
        "--raw",
        "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/nope",
    ]);
    assert!(!ok);
    assert!(err.contains("NotFound"), "{err}");
}
