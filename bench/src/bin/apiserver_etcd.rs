//! The API server on etcd against the embedded store, same workload for both: pods created
//! per second (1 client, 8 concurrent clients), the full list of 10,000 pods, the server's
//! RSS and etcd's own RSS at 10,000 pods. etcd is Debian's `/usr/bin/etcd`, one member on
//! 127.0.0.1 with its data in a temp dir (fsync on every commit, as the embedded store).
//! Goal (issue 22): on etcd, within 2× the embedded store's create rate.
//!
//! The floor beside it: the same pods (as the API server stored them, after admission) created
//! one after another straight into the same etcd through nodus's etcd client — one guarded
//! transaction each, what every create through the API server costs at least.

use std::path::PathBuf;

use anyhow::{Context, Result};
use kube::api::ListParams;
use nodus_bench::controlplane::{
    CONCURRENT, PER_CLIENT, SINGLE, client, create_rates, fill_to, list_pods, start_with,
};
use nodus_bench::targets::{pct, rss_kib};
use nodus_control_plane::storage::EtcdServer;

const TOTAL_PODS: usize = 10_000;

struct Figures {
    single: f64,
    concurrent: f64,
    list_ms: f64,
    count: usize,
    server_mib: f64,
    etcd_mib: Option<f64>,
    /// One pod as the server stored it, for the floor's writes.
    stored_pod: serde_json::Value,
}

async fn run(bin: &std::path::Path, etcd: Option<&EtcdServer>) -> Result<Figures> {
    let url = etcd.map(EtcdServer::url);
    let extra: Vec<&str> = match &url {
        Some(u) => vec!["--etcd-servers", u.as_str()],
        None => vec![],
    };
    let server = start_with(bin, &extra, None)?;
    let pid = server.child.id();
    let mut clients = Vec::new();
    for _ in 0..CONCURRENT {
        clients.push(client(&server.kubeconfig).await?);
    }
    let (single, concurrent) = create_rates(&clients, "").await?;
    fill_to(&clients, TOTAL_PODS).await?;
    let (mut lat, count) = list_pods(&clients[0], &ListParams::default(), 5).await?;
    let server_mib = rss_kib(pid) as f64 / 1024.0;
    let etcd_mib = etcd.map(|e| rss_kib(e.pid()) as f64 / 1024.0);
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(clients[0].clone(), "default");
    let stored_pod = serde_json::to_value(
        pods.list(&ListParams::default().limit(1))
            .await?
            .items
            .first()
            .context("no pod stored")?,
    )?;
    drop(server);
    Ok(Figures {
        single,
        concurrent,
        list_ms: pct(&mut lat, 50.0),
        count,
        server_mib,
        etcd_mib,
        stored_pod,
    })
}

/// Creates per second of `pod` straight into etcd, one after another: the floor of a create.
fn etcd_floor(member: &EtcdServer, pod: &serde_json::Value) -> Result<f64> {
    use nodus_control_plane::storage::{EtcdConfig, EtcdStore, Store};
    let mut cfg = EtcdConfig::new(vec![member.url()]);
    cfg.prefix = "/bench-floor".into();
    let store = EtcdStore::connect(&cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
    let started = std::time::Instant::now();
    for i in 0..SINGLE {
        let mut p = pod.clone();
        p["metadata"]["name"] = serde_json::json!(format!("floor-{i}"));
        store
            .create(&format!("/core/pods/default/floor-{i}"), p)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(SINGLE as f64 / started.elapsed().as_secs_f64())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let write = std::env::args()
        .skip_while(|a| a != "--write")
        .nth(1)
        .map(PathBuf::from);
    let build = std::env::var("BENCH_BUILD").unwrap_or_else(|_| "release".into());
    let bin = nodus_bench::nodus_bin();
    let embedded = run(&bin, None).await?;
    let dir = tempfile::Builder::new().prefix("bench-etcd-").tempdir()?;
    let member = EtcdServer::start(dir.path())?;
    let on_etcd = run(&bin, Some(&member)).await?;
    let pod = on_etcd.stored_pod.clone();
    let floor = {
        let m = &member;
        tokio::task::block_in_place(|| etcd_floor(m, &pod))?
    };
    drop(member);

    let date = nodus_bench::today();
    let ratio = embedded.single / on_etcd.single.max(f64::MIN_POSITIVE);
    let ratio8 = embedded.concurrent / on_etcd.concurrent.max(f64::MIN_POSITIVE);
    let body = format!(
        "Measured {date} on this machine (2 cores shared with other work), `nodus control-plane` \
{build} build, kube-rs clients over HTTPS, pods in one namespace; etcd is Debian's etcd \
{version}, one member on 127.0.0.1 with its data on the same disk.\n\n\
| measure | embedded store | etcd (`--etcd-servers`) |\n| --- | --- | --- |\n\
| pods created/s, 1 client (sequential, {SINGLE} pods) | {:.0} | {:.0} |\n\
| pods created/s, {CONCURRENT} concurrent clients ({} pods) | {:.0} | {:.0} |\n\
| full list of {} pods (all namespaces), median | {:.0} ms | {:.0} ms |\n\
| API server RSS at 10,000 pods | {:.0} MiB | {:.0} MiB |\n\
| etcd RSS at 10,000 pods | – | {:.0} MiB |\n\
| floor: the same pods written straight into etcd, 1 client | – | {floor:.0}/s ({floor_ms:.2} ms each) |\n\n\
Goal: on etcd, within 2× the embedded store's create rate: the embedded store creates \
{ratio:.2}× as fast with 1 client and {ratio8:.2}× with {CONCURRENT}. Each create on etcd is \
one guarded transaction over gRPC (the floor row: etcd's own commit, fsync included); \
admission's reads (namespace, service account, priority class) come from listers kept by a \
watch, as upstream's informers, so they cost no round trip, and lists and watches are served \
from the watch cache (`storage/cacher.rs`). With one client the API server adds {own_ms:.2} ms \
per create beyond the floor.\n",
        embedded.single,
        on_etcd.single,
        CONCURRENT * PER_CLIENT,
        embedded.concurrent,
        on_etcd.concurrent,
        on_etcd.count.max(embedded.count),
        embedded.list_ms,
        on_etcd.list_ms,
        embedded.server_mib,
        on_etcd.server_mib,
        on_etcd.etcd_mib.unwrap_or(0.0),
        version = etcd_version(),
        floor_ms = 1000.0 / floor.max(f64::MIN_POSITIVE),
        own_ms =
            1000.0 / on_etcd.single.max(f64::MIN_POSITIVE) - 1000.0 / floor.max(f64::MIN_POSITIVE),
    );
    println!("{body}");
    if let Some(p) = write {
        nodus_bench::write_section(
            &p,
            "apiserver-etcd",
            "## API server on etcd (`bash bench/apiserver-etcd.sh`)",
            &body,
        )?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

fn etcd_version() -> String {
    let v = nodus_bench::tool_version(
        nodus_control_plane::storage::etcd::server::etcd_binary(),
        "etcd Version: ",
    );
    if v.is_empty() { "?".into() } else { v }
}
