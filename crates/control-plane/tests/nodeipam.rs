//! The node IPAM controller (range allocator) against the real API server and kubectl:
//! Nodes get distinct pod CIDRs that `kubectl describe node` shows, a deleted Node's CIDR
//! goes to the next Node that needs one, an exhausted range gives the Node upstream's
//! `CIDRNotAvailable` event, a restarted control plane keeps the CIDRs Nodes hold, and bad
//! flags stop `nodus control-plane` before it starts.

mod common;

use std::path::Path;

use clap::Parser;
use nodus_control_plane::apiserver::state::ApiConfig;
use nodus_control_plane::cli::{ControlPlaneArgs, NodeIpamArgs};
use nodus_control_plane::controllers::ControllersConfig;

fn controllers(args: &[&str]) -> ControllersConfig {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        ipam: NodeIpamArgs,
    }
    let argv = std::iter::once("test").chain(args.iter().copied());
    let cli = Cli::try_parse_from(argv).expect("flags parse");
    ControllersConfig {
        node_ipam: cli
            .ipam
            .config(false, None, ApiConfig::default().service_cidr)
            .expect("flags are valid"),
        ..Default::default()
    }
}

async fn add_node(kubeconfig: &Path, name: &str) {
    let yaml = format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n");
    common::kubectl_with(kubeconfig, &["create", "-f", "-"], Some(&yaml))
        .await
        .ok();
}

async fn pod_cidrs(kubeconfig: &Path, name: &str) -> String {
    let out = common::kubectl_with(
        kubeconfig,
        &[
            "get",
            "node",
            name,
            "-o",
            "jsonpath={.spec.podCIDR} {.spec.podCIDRs}",
        ],
        None,
    )
    .await;
    out.ok().trim().to_string()
}

/// Waits for the Node's `podCIDR podCIDRs` as kubectl prints them.
async fn wait_cidr(kubeconfig: &Path, name: &str) -> String {
    common::eventually(&format!("a pod CIDR on {name}"), || async {
        let s = pod_cidrs(kubeconfig, name).await;
        (!s.is_empty()).then_some(s)
    })
    .await
}

/// The CIDRNotAvailable event on `name`, as `kubectl get events` shows it.
async fn wait_cidr_not_available(kubeconfig: &Path, name: &str) -> String {
    common::eventually(&format!("CIDRNotAvailable on {name}"), || async {
        let selector = format!("involvedObject.name={name},reason=CIDRNotAvailable");
        let out = common::kubectl_with(
            kubeconfig,
            &[
                "get",
                "events",
                "-A",
                "--field-selector",
                &selector,
                "-o",
                "custom-columns=TYPE:.type,REASON:.reason,KIND:.involvedObject.kind,SOURCE:.source.component,MESSAGE:.message",
                "--no-headers",
            ],
            None,
        )
        .await;
        let s = out.ok().trim().to_string();
        (!s.is_empty()).then_some(s)
    })
    .await
}

/// What a kubelet status update does: any update makes the allocator look at the Node
/// again (upstream retries a Node without CIDRs on its updates).
async fn touch(kubeconfig: &Path, name: &str, n: u32) {
    common::kubectl_with(
        kubeconfig,
        &[
            "label",
            "node",
            name,
            &format!("touched={n}"),
            "--overwrite",
        ],
        None,
    )
    .await
    .ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_get_distinct_cidrs_reused_after_delete_and_kept_across_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Four /24s.
    let cfg = controllers(&["--allocate-node-cidrs", "--cluster-cidr", "10.42.0.0/22"]);
    let first = common::start_configured(dir.path(), ApiConfig::default(), cfg.clone()).await;
    let kc = first.kubeconfig.clone();
    let mut seen = Vec::new();
    for n in ["n1", "n2", "n3", "n4"] {
        add_node(&kc, n).await;
        seen.push(wait_cidr(&kc, n).await);
    }
    assert_eq!(
        seen,
        [
            "10.42.0.0/24 [\"10.42.0.0/24\"]",
            "10.42.1.0/24 [\"10.42.1.0/24\"]",
            "10.42.2.0/24 [\"10.42.2.0/24\"]",
            "10.42.3.0/24 [\"10.42.3.0/24\"]",
        ]
    );
    let describe = common::kubectl_with(&kc, &["describe", "node", "n2"], None).await;
    let describe = describe.ok();
    assert!(
        describe
            .lines()
            .any(|l| l.starts_with("PodCIDR:") && l.ends_with(" 10.42.1.0/24")),
        "{describe}"
    );
    assert!(
        describe
            .lines()
            .any(|l| l.starts_with("PodCIDRs:") && l.ends_with(" 10.42.1.0/24")),
        "{describe}"
    );

    // The range is exhausted: the fifth Node gets none, and upstream's event says so.
    add_node(&kc, "n5").await;
    let ev = wait_cidr_not_available(&kc, "n5").await;
    assert_eq!(
        ev.split_whitespace().collect::<Vec<_>>(),
        [
            "Normal",
            "CIDRNotAvailable",
            "Node",
            "cidrAllocator",
            "Node",
            "n5",
            "status",
            "is",
            "now:",
            "CIDRNotAvailable"
        ]
    );
    assert_eq!(pod_cidrs(&kc, "n5").await, "");

    // n1 goes; n5's next update takes its CIDR.
    common::kubectl_with(&kc, &["delete", "node", "n1"], None)
        .await
        .ok();
    let mut i = 0;
    let got = common::eventually("n5 to get n1's CIDR", || {
        i += 1;
        let kc = kc.clone();
        async move {
            touch(&kc, "n5", i).await;
            let s = pod_cidrs(&kc, "n5").await;
            (!s.is_empty()).then_some(s)
        }
    })
    .await;
    assert_eq!(got, "10.42.0.0/24 [\"10.42.0.0/24\"]");
    first.shutdown().await;

    // A restarted allocator occupies what the Nodes hold: all four are taken again, so a
    // new Node waits, and gets the CIDR of the next Node deleted.
    let second = common::start_configured(dir.path(), ApiConfig::default(), cfg).await;
    let kc = second.kubeconfig.clone();
    add_node(&kc, "n6").await;
    wait_cidr_not_available(&kc, "n6").await;
    assert_eq!(pod_cidrs(&kc, "n6").await, "");
    for n in ["n2", "n3", "n4", "n5"] {
        assert!(!pod_cidrs(&kc, n).await.is_empty(), "{n} kept its CIDR");
    }
    common::kubectl_with(&kc, &["delete", "node", "n3"], None)
        .await
        .ok();
    let mut i = 0;
    let got = common::eventually("n6 to get n3's CIDR", || {
        i += 1;
        let kc = kc.clone();
        async move {
            touch(&kc, "n6", i).await;
            let s = pod_cidrs(&kc, "n6").await;
            (!s.is_empty()).then_some(s)
        }
    })
    .await;
    assert_eq!(got, "10.42.2.0/24 [\"10.42.2.0/24\"]");
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_nodes_get_one_cidr_per_family() {
    let cfg = controllers(&[
        "--allocate-node-cidrs=true",
        "--cluster-cidr",
        "10.42.0.0/16,fd00:42::/56",
        "--node-cidr-mask-size-ipv4",
        "25",
    ]);
    let c = common::start_with_controllers(cfg).await;
    let kc = c.kubeconfig().to_path_buf();
    add_node(&kc, "a").await;
    add_node(&kc, "b").await;
    assert_eq!(
        wait_cidr(&kc, "a").await,
        "10.42.0.0/25 [\"10.42.0.0/25\",\"fd00:42::/64\"]"
    );
    assert_eq!(
        wait_cidr(&kc, "b").await,
        "10.42.0.128/25 [\"10.42.0.128/25\",\"fd00:42:0:1::/64\"]"
    );
    let describe = c.kubectl(&["describe", "node", "b"]).await;
    assert!(
        describe
            .ok()
            .lines()
            .any(|l| l.starts_with("PodCIDRs:") && l.ends_with(" 10.42.0.128/25,fd00:42:0:1::/64")),
        "{}",
        describe.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_allocate_node_cidrs_nodes_get_none() {
    let c = common::start_with_controllers(controllers(&["--cluster-cidr", "10.42.0.0/16"])).await;
    let kc = c.kubeconfig().to_path_buf();
    add_node(&kc, "plain").await;
    // An allocator that ran would have set it within this wait (it does in milliseconds in
    // the tests above); none must come.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(pod_cidrs(&kc, "plain").await, "");
}

/// `nodus control-plane` refuses bad node IPAM flags with a message naming the flag and
/// the value, before it starts anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_flags_are_refused_at_start() {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        cp: ControlPlaneArgs,
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("cp");
    for (flags, want) in [
        (
            vec!["--allocate-node-cidrs"],
            "--cluster-cidr is required when --allocate-node-cidrs=true",
        ),
        (
            vec!["--allocate-node-cidrs", "--cluster-cidr", "10.42.0.0/33"],
            "invalid --cluster-cidr: \"10.42.0.0/33\": the prefix length must be at most 32",
        ),
        (
            vec![
                "--allocate-node-cidrs",
                "--cluster-cidr",
                "10.42.0.0/16,10.42.128.0/17",
            ],
            "invalid --cluster-cidr \"10.42.0.0/16,10.42.128.0/17\": two CIDRs are dual-stack and need one IPv4 and one IPv6 CIDR (10.42.0.0/16 and 10.42.128.0/17 are of one family and overlap)",
        ),
        (
            vec!["--allocate-node-cidrs", "--cluster-cidr", "10.100.0.0/16"],
            "--cluster-cidr 10.100.0.0/16 overlaps --service-cluster-ip-range 10.96.0.0/12: pod and Service addresses must not share a range",
        ),
        (
            vec![
                "--allocate-node-cidrs",
                "--cluster-cidr",
                "10.42.0.0/16",
                "--node-cidr-mask-size",
                "8",
            ],
            "invalid --node-cidr-mask-size: the node CIDR mask size /8 does not fit cluster CIDR 10.42.0.0/16: it must be between /16 and /32",
        ),
        (
            vec![
                "--allocate-node-cidrs",
                "--cluster-cidr",
                "10.42.0.0/16,fd00:42::/56",
                "--node-cidr-mask-size",
                "24",
            ],
            "usage of --node-cidr-mask-size is not allowed with dual-stack clusters",
        ),
    ] {
        let mut argv = vec![
            "nodus-control-plane",
            "--data-dir",
            data_dir.to_str().expect("utf-8"),
        ];
        argv.extend(flags.iter().copied());
        let cli = Cli::try_parse_from(&argv).expect("flags parse");
        let err = nodus_control_plane::cli::run(cli.cp)
            .await
            .expect_err("refused");
        assert_eq!(err.to_string(), want, "{flags:?}");
        assert!(!data_dir.exists(), "{flags:?}: nothing was started");
    }
}
