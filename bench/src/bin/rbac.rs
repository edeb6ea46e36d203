//! The cost of RBAC: authorization decisions per request measured in-process against an
//! index of 1,000 RoleBindings (plus the bootstrap policy), and pods created per second
//! through the real `nodus control-plane` binary under `--authorization-mode AlwaysAllow`
//! (as the admin) versus `Node,RBAC` with a non-admin user bound to `edit`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use nodus_bench::controlplane::{client, start_with};
use nodus_bench::targets::pct;
use nodus_control_plane::apiserver::authn::User;
use nodus_control_plane::apiserver::authz::rbac::RbacAuthorizer;
use nodus_control_plane::apiserver::authz::{Attributes, Request, ResourceAttrs, policy};
use nodus_control_plane::storage::{EmbeddedStore, Store};
use serde_json::json;

const BINDINGS: usize = 1_000;
const NAMESPACES: usize = 100;
const DECISIONS: usize = 200_000;
const CLIENTS: usize = 8;
const PER_CLIENT: usize = 250;

/// p50 and p99 of one decision, in µs, over the 1,000-binding index.
fn decisions() -> Result<(f64, f64, f64, f64)> {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&dir.path().join("s.redb"))?);
    for role in policy::cluster_roles() {
        let name = role["metadata"]["name"].as_str().unwrap_or("").to_string();
        store.create(
            &format!("/rbac.authorization.k8s.io/clusterroles/{name}"),
            role,
        )?;
    }
    for b in policy::cluster_role_bindings() {
        let name = b["metadata"]["name"].as_str().unwrap_or("").to_string();
        store.create(
            &format!("/rbac.authorization.k8s.io/clusterrolebindings/{name}"),
            b,
        )?;
    }
    // Aggregated roles get their rules as the controller gives them (view feeds edit,
    // which feeds admin).
    for _ in 0..3 {
        policy::aggregate(store.as_ref())?;
    }
    for i in 0..BINDINGS {
        let ns = format!("ns-{}", i % NAMESPACES);
        let role = if i % 2 == 0 { "edit" } else { "view" };
        store.create(
            &format!("/rbac.authorization.k8s.io/rolebindings/{ns}/b-{i}"),
            json!({"metadata": {"name": format!("b-{i}"), "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": format!("user-{i}")},
                             {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": format!("team-{}", i % 50)}]}),
        )?;
    }
    let authz = RbacAuthorizer::new(store.clone());
    let _ = authz.index();
    let mut allowed_us = Vec::with_capacity(DECISIONS / 2);
    let mut denied_us = Vec::with_capacity(DECISIONS / 2);
    for k in 0..DECISIONS {
        let i = k % BINDINGS;
        let user = User {
            name: format!("user-{i}"),
            groups: vec![
                format!("team-{}", (i + 7) % 50),
                "system:authenticated".into(),
            ],
            ..Default::default()
        };
        let ns = format!("ns-{}", i % NAMESPACES);
        // Allowed: get pods in the bound namespace; refused: delete nodes (nothing grants it,
        // so every rule bound to the user is tried).
        let (verb, resource, ns_ref) = if k % 2 == 0 {
            ("get", "pods", ns.as_str())
        } else {
            ("delete", "nodes", "")
        };
        let attrs = Attributes {
            verb,
            request: Request::Named(ResourceAttrs {
                group: "",
                resource,
                subresource: "",
                namespace: ns_ref,
                name: "x",
            }),
            body: None,
            field_selector: None,
        };
        let t = Instant::now();
        let d = authz.authorize(&user, &attrs);
        let us = t.elapsed().as_secs_f64() * 1e6;
        let allow = matches!(d, nodus_control_plane::apiserver::authz::Decision::Allow);
        if k % 2 == 0 {
            anyhow::ensure!(allow, "user-{i} may get pods in {ns}");
            allowed_us.push(us);
        } else {
            anyhow::ensure!(!allow, "user-{i} may not delete nodes");
            denied_us.push(us);
        }
    }
    Ok((
        pct(&mut allowed_us, 50.0),
        pct(&mut allowed_us, 99.0),
        pct(&mut denied_us, 50.0),
        pct(&mut denied_us, 99.0),
    ))
}

fn pod(name: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"containers": [{"name": "app", "image": "busybox", "command": ["sleep", "3600"]}]}
    }))?)
}

/// Pods created per second by 8 concurrent clients with the given kubeconfig.
async fn create_rate(kubeconfig: &std::path::Path, prefix: &str) -> Result<f64> {
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(client(kubeconfig).await?);
    }
    let t = Instant::now();
    let mut tasks = Vec::new();
    for (k, c) in clients.into_iter().enumerate() {
        let prefix = format!("{prefix}-{k}");
        tasks.push(tokio::spawn(async move {
            let api: Api<Pod> = Api::namespaced(c, "default");
            for i in 0..PER_CLIENT {
                api.create(&PostParams::default(), &pod(&format!("{prefix}-{i}"))?)
                    .await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok((CLIENTS * PER_CLIENT) as f64 / t.elapsed().as_secs_f64())
}

/// A kubeconfig for a non-admin user `bench` bound to `edit` in default.
async fn edit_user(server: &nodus_bench::controlplane::Server) -> Result<std::path::PathBuf> {
    let admin = std::fs::read_to_string(&server.kubeconfig)?;
    let url = admin
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .context("server in admin.kubeconfig")?
        .to_string();
    let kc = nodus_control_plane::pki::issue_user_kubeconfig(
        &server.data_dir,
        "bench.kubeconfig",
        "bench",
        &[],
        &url,
    )?;
    let c = client(&server.kubeconfig).await?;
    let rb: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "bench-edit", "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bench"}]
    }))?;
    Api::namespaced(c, "default")
        .create(&PostParams::default(), &rb)
        .await?;
    Ok(kc)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let (a50, a99, d50, d99) = decisions()?;
    println!(
        "decision allowed p50 {a50:.2} µs p99 {a99:.2} µs; refused p50 {d50:.2} µs p99 {d99:.2} µs"
    );

    let bin = std::path::PathBuf::from(
        std::env::var("NODUS_BIN").unwrap_or_else(|_| "target/release/nodus".into()),
    );
    let allow = start_with(&bin, &["--authorization-mode", "AlwaysAllow"], None)?;
    let allow_rate = create_rate(&allow.kubeconfig, "aa").await?;
    drop(allow);
    let rbac = start_with(&bin, &["--authorization-mode", "Node,RBAC"], None)?;
    let kc = edit_user(&rbac).await?;
    // The binding is in force once its write returned; no settling wait is needed.
    let rbac_rate = create_rate(&kc, "rb").await?;
    drop(rbac);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let overhead = (allow_rate - rbac_rate) / allow_rate * 100.0;
    println!(
        "pods created/s (8 clients): AlwaysAllow {allow_rate:.0}, Node,RBAC as an edit user {rbac_rate:.0} ({overhead:+.1} %)"
    );
    if let Some(path) = write {
        let body = format!(
            "| measure | figure | goal |\n|---|---|---|\n\
             | decision, allowed (get pods; 1,000 RoleBindings + bootstrap policy) | p50 {a50:.2} µs, p99 {a99:.2} µs | p99 < 50 µs |\n\
             | decision, refused (delete nodes; every bound rule tried) | p50 {d50:.2} µs, p99 {d99:.2} µs | p99 < 50 µs |\n\
             | pods created/s, 8 clients, `--authorization-mode AlwaysAllow` (admin) | {allow_rate:.0} | |\n\
             | pods created/s, 8 clients, `Node,RBAC`, non-admin bound to `edit` | {rbac_rate:.0} ({overhead:+.1} %) | < 5 % slower |\n\n\
             Decisions: {DECISIONS} in-process calls of the RBAC authorizer (index by subject, \
             rebuilt only when an RBAC object changes), each timed alone. Creates: the real \
             `nodus control-plane` binary (release), {CLIENTS} kube-rs clients x {PER_CLIENT} \
             pods over HTTPS with client certificates; the difference includes run-to-run noise \
             of a shared machine.\n"
        );
        nodus_bench::write_section(
            &path,
            "rbac",
            "## RBAC: authorization cost (bench/rbac.sh)",
            &body,
        )?;
    }
    Ok(())
}
