//! The API server on etcd against the embedded store, same workload for both: pods created
//! per second (1 client, 8 concurrent clients), the full list of 10,000 pods, the server's
//! RSS and etcd's own RSS at 10,000 pods. etcd is Debian's `/usr/bin/etcd`, one member on
//! 127.0.0.1 with its data in a temp dir (fsync on every commit, as the embedded store).
//! Goal (issue 22): on etcd, within 2× the embedded store's create rate.

use std::path::PathBuf;

use anyhow::Result;
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
    drop(server);
    Ok(Figures {
        single,
        concurrent,
        list_ms: pct(&mut lat, 50.0),
        count,
        server_mib,
        etcd_mib,
    })
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
| etcd RSS at 10,000 pods | – | {:.0} MiB |\n\n\
Goal: on etcd, within 2× the embedded store's create rate: the embedded store creates \
{ratio:.2}× as fast with 1 client and {ratio8:.2}× with {CONCURRENT}. Each create on etcd is \
one guarded transaction over gRPC (plus the API server's own reads of the store, which on \
etcd are round trips too).\n",
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
    std::process::Command::new(nodus_control_plane::storage::etcd::server::etcd_binary())
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("etcd Version: "))
                .map(str::to_string)
        })
        .unwrap_or_else(|| "?".into())
}
