//! Custom resources against built-in kinds on the same API server: creates per second of a
//! custom resource (structural schema: pruning, defaulting and validation on every write)
//! and of a ConfigMap carrying the same payload, through kube-rs over HTTPS. The two
//! workloads alternate in rounds so machine noise hits both alike.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use nodus_bench::controlplane::{client, start};

const ROUNDS: usize = 5;
const PER_ROUND: usize = 200;
/// Payload entries per object (each a 32-byte string): ~1 KiB of data either way.
const ENTRIES: usize = 24;

fn payload() -> serde_json::Map<String, serde_json::Value> {
    (0..ENTRIES)
        .map(|i| (format!("key{i:02}"), serde_json::json!("x".repeat(32))))
        .collect()
}

const CRD: &str = r#"{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
 "metadata": {"name": "benches.example.com"},
 "spec": {"group": "example.com", "scope": "Namespaced",
  "names": {"plural": "benches", "singular": "bench", "kind": "Bench"},
  "versions": [{"name": "v1", "served": true, "storage": true,
   "schema": {"openAPIV3Schema": {"type": "object", "properties": {
     "spec": {"type": "object", "properties": {
       "replicas": {"type": "integer", "minimum": 0, "default": 1},
       "data": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 64}}}}}}}}]}}"#;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let bin = nodus_bench::nodus_bin();
    let build = nodus_bench::build_profile(&bin);
    let server = start(&bin)?;
    let c = client(&server.kubeconfig).await?;

    let crd_res = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    );
    let crds: Api<DynamicObject> = Api::all_with(c.clone(), &crd_res);
    crds.create(&PostParams::default(), &serde_json::from_str(CRD)?)
        .await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let o = crds.get("benches.example.com").await?;
        let established = o.data["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        });
        if established {
            break;
        }
        if Instant::now() > deadline {
            bail!("CRD not Established in 30s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bench_res = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Bench"),
        "benches",
    );
    let benches: Api<DynamicObject> = Api::namespaced_with(c.clone(), "default", &bench_res);
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    // Discovery of the new resource can lag the condition by a moment: retry the first one.
    let first: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "example.com/v1", "kind": "Bench", "metadata": {"name": "warm"},
        "spec": {"data": payload()}}))?;
    let mut tries = 0;
    while let Err(e) = benches.create(&PostParams::default(), &first).await {
        tries += 1;
        if tries > 50 {
            return Err(e).context("creating the first custom resource");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (mut cr_secs, mut cm_secs) = (0.0, 0.0);
    for round in 0..ROUNDS {
        let t = Instant::now();
        for i in 0..PER_ROUND {
            let o: DynamicObject = serde_json::from_value(serde_json::json!({
                "apiVersion": "example.com/v1", "kind": "Bench",
                "metadata": {"name": format!("b{round}-{i}")},
                "spec": {"data": payload()}}))?;
            benches.create(&PostParams::default(), &o).await?;
        }
        cr_secs += t.elapsed().as_secs_f64();
        let t = Instant::now();
        for i in 0..PER_ROUND {
            let o: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("c{round}-{i}")}, "data": payload()}))?;
            cms.create(&PostParams::default(), &o).await?;
        }
        cm_secs += t.elapsed().as_secs_f64();
    }
    let n = (ROUNDS * PER_ROUND) as f64;
    let (cr_rate, cm_rate) = (n / cr_secs, n / cm_secs);
    let check = benches.get("b0-0").await?;
    if check.data["spec"]["replicas"] != 1 {
        bail!("defaulting did not run: {:?}", check.data["spec"]);
    }

    let date = nodus_bench::today();
    let body = format!(
        "Measured {date} on this machine (2 cores shared with other work), `nodus control-plane` \
{build} build, one kube-rs client over HTTPS, creates one after another, {ROUNDS} alternating \
rounds of {PER_ROUND} per kind. Both objects carry the same {ENTRIES} × 32-byte string map \
(a ConfigMap's `data`, the custom resource's `spec.data`, declared with \
`additionalProperties: {{type: string, maxLength: 64}}` plus a defaulted `spec.replicas`).\n\n\
| measure | custom resource | ConfigMap |\n| --- | --- | --- |\n\
| creates/s, 1 client | {cr_rate:.0} | {cm_rate:.0} |\n\
| time per create | {:.2} ms | {:.2} ms |\n\n\
Both are one fsynced store commit; what differs is the per-kind work before it: a \
ConfigMap's body is decoded through the typed k8s-openapi struct twice (strict field \
validation and the decode check), a custom resource's is walked against its structural \
schema three times (pruning, defaulting, validation).\n",
        1000.0 / cr_rate,
        1000.0 / cm_rate,
    );
    println!("{body}");
    if let Some(p) = write {
        nodus_bench::write_section(
            &p,
            "crd",
            "## Custom resources (`bash bench/crd.sh`)",
            &body,
        )?;
        eprintln!("wrote {}", p.display());
    }
    drop(server);
    Ok(())
}
