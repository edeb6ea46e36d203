//! Server-side apply against update on the same API server: requests per second of
//! `PATCH application/apply-patch+yaml` (merge into the live object, field ownership,
//! conflict check, managed fields) and of `PUT` with the full object (which records an
//! Update entry in the managed fields), through kube-rs over HTTPS, one client. Each write
//! changes the replicas and an annotation so that none is a no-op; the two alternate in
//! rounds so machine noise hits both alike.

use std::time::Instant;

use anyhow::Result;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodus_bench::controlplane::{client, start};

const ROUNDS: usize = 5;
const PER_ROUND: usize = 100;

fn deployment(name: &str, n: usize) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default",
                     "labels": {"app": name}, "annotations": {"bench/n": n.to_string()}},
        "spec": {"replicas": (n % 5) as i64, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                  "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1",
                   "ports": [{"containerPort": 80}],
                   "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                   "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}})
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let bin = nodus_bench::nodus_bin();
    let build = nodus_bench::build_profile(&bin);
    let server = start(&bin)?;
    let c = client(&server.kubeconfig).await?;
    let deps: Api<Deployment> = Api::namespaced(c.clone(), "default");
    let pp = PatchParams::apply("bench").force();
    deps.patch("applied", &pp, &Patch::Apply(deployment("applied", 0)))
        .await?;
    deps.create(
        &PostParams::default(),
        &serde_json::from_value(deployment("updated", 0))?,
    )
    .await?;

    let (mut apply_secs, mut put_secs) = (0.0, 0.0);
    let mut n = 0;
    let mut conflicts = 0;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..PER_ROUND {
            n += 1;
            deps.patch("applied", &pp, &Patch::Apply(deployment("applied", n)))
                .await?;
        }
        apply_secs += t.elapsed().as_secs_f64();
        let t = Instant::now();
        for i in 0..PER_ROUND {
            // A PUT carries the whole object, as `kubectl replace` or a controller's update:
            // read-modify-write, so its GET is timed too.
            // The Deployment controller writes the object's status meanwhile: a 409 is
            // retried from the GET, as client-go's RetryOnConflict does.
            loop {
                let mut d = deps.get("updated").await?;
                let want: Deployment =
                    serde_json::from_value(deployment("updated", n - PER_ROUND + i + 1))?;
                d.spec = want.spec;
                d.metadata.annotations = want.metadata.annotations;
                match deps.replace("updated", &PostParams::default(), &d).await {
                    Ok(_) => break,
                    Err(kube::Error::Api(e)) if e.code == 409 => conflicts += 1,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        put_secs += t.elapsed().as_secs_f64();
    }
    let total = (ROUNDS * PER_ROUND) as f64;
    let (apply_rate, put_rate) = (total / apply_secs, total / put_secs);
    let applied = deps.get("applied").await?;
    let managers: Vec<String> = applied
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    anyhow::ensure!(
        managers.contains(&"bench".to_string()),
        "no apply entry: {managers:?}"
    );

    let date = nodus_bench::today();
    let body = format!(
        "Measured {date} on this machine (2 cores shared with other work), `nodus control-plane` \
{build} build, one kube-rs client over HTTPS, writes one after another, {ROUNDS} alternating \
rounds of {PER_ROUND} per kind, each write changing `spec.replicas` and an annotation of a \
one-container Deployment (ports, env, resources).\n\n\
| measure | server-side apply (PATCH, force) | update (GET + PUT) |\n| --- | --- | --- |\n\
| writes/s, 1 client | {apply_rate:.0} | {put_rate:.0} |\n\
| time per write | {:.2} ms | {:.2} ms |\n\
| conflicts retried | none possible | {conflicts} |\n\n\
An apply is one request: the server merges the configuration into the live object, \
computes its field set and the fields it changes, checks them against the other managers' \
and drops what the manager no longer applies, all under the store's write lock. An update \
is two (the client reads the object to send it back whole), and the server computes the \
fields it changed for the writer's Update entry.\n",
        1000.0 / apply_rate,
        1000.0 / put_rate,
    );
    println!("{body}");
    if let Some(p) = write {
        nodus_bench::write_section(
            &p,
            "ssa",
            "## Server-side apply (`bash bench/ssa.sh`)",
            &body,
        )?;
        eprintln!("wrote {}", p.display());
    }
    drop(server);
    Ok(())
}
