//! The cost of access control (issue "Identity and access"), on the release `nodus
//! control-plane` binary over HTTPS and, for the decision alone, on the same authorizer
//! chain in-process:
//!
//! 1. Authorization decisions with 1,000 RoleBindings and 1,000 ClusterRoleBindings (plus
//!    the bootstrap policy) in the store: an allowed and a refused request, timed as
//!    `Chain::authorize` calls (`Node,RBAC`, the server's own code, nothing around it) and
//!    as SubjectAccessReview round trips (client to server and back), beside the round trip
//!    of a review the chain answers before any authorizer (a `system:masters` subject).
//! 2. Pods created per second with the API server benchmark's create workload
//!    (`nodus_bench::controlplane::create_rates`) as the same non-admin user under
//!    `--authorization-mode AlwaysAllow` and `Node,RBAC`, where that user's RoleBinding is
//!    one of the 1,000; rounds alternate the modes on fresh servers.
//! 3. TokenReview throughput for a service-account token (TokenRequest), a bootstrap token
//!    (`nodus token create`) and, as the floor, a token no authenticator accepts.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenReview};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use kube::api::{Api, PostParams};
use nodus_bench::cluster::cpu_ms;
use nodus_bench::controlplane::{
    CONCURRENT, PER_CLIENT, SINGLE, Server, client, create_rates, start_with,
};
use nodus_bench::targets::pct;
use nodus_control_plane::apiserver::authn::User;
use nodus_control_plane::apiserver::authz::{Attributes, Chain, Request, parse_modes, policy};
use nodus_control_plane::apiserver::rest::path::{Parsed, parse};
use nodus_control_plane::storage::{EmbeddedStore, Store};
use serde_json::{Value, json};

const ROLE_BINDINGS: usize = 1_000;
const CLUSTER_ROLE_BINDINGS: usize = 1_000;
const NAMESPACES: usize = 100;
const GROUPS: usize = 50;
/// In-process decisions of each kind.
const DECISIONS: usize = 100_000;
/// SubjectAccessReview round trips of each kind, after a warm-up.
const REVIEWS: usize = 3_000;
/// TokenReviews of each kind: one client, then each of the [`CONCURRENT`] clients.
const TOKEN_REVIEWS: usize = 3_000;
const TOKEN_REVIEWS_PER_CLIENT: usize = 500;
/// Rounds of the create workload per authorization mode.
const ROUNDS: usize = 5;
/// The non-admin user who creates pods, and the binding that lets it.
const BENCH_USER: &str = "bench";
const GROUP: &str = "rbac.authorization.k8s.io";
/// A ClusterRole the ClusterRoleBindings grant: cluster-scoped reads that neither
/// measured request asks for, so the RBAC authorizer must try its rules and go on.
const NODE_READER: &str = "bench:node-reader";

/// What the store holds besides the bootstrap policy, as (plural, namespace, object):
/// namespaces, a ClusterRole, [`ROLE_BINDINGS`] RoleBindings (`user-<i>` and group
/// `team-<i mod 50>` to `edit` or `view` in `ns-<i mod 100>`; the last one binds
/// [`BENCH_USER`] to `edit` in `default`) and [`CLUSTER_ROLE_BINDINGS`]
/// ClusterRoleBindings (`user-<i>` and group `team-<i mod 50>` to [`NODE_READER`]).
fn population() -> Vec<(&'static str, Option<String>, Value)> {
    let mut out = Vec::new();
    for n in 0..NAMESPACES {
        out.push((
            "namespaces",
            None,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("ns-{n}")}}),
        ));
    }
    out.push((
        "clusterroles",
        None,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": NODE_READER},
            "rules": [{"verbs": ["get", "list", "watch"], "apiGroups": [""],
                       "resources": ["nodes", "persistentvolumes"]},
                      {"verbs": ["get", "list", "watch"], "apiGroups": ["storage.k8s.io"],
                       "resources": ["storageclasses"]}]}),
    ));
    let binding = |kind: &str, name: String, ns: Option<&str>, role: &str, subjects: Value| {
        let mut meta = json!({"name": name});
        if let Some(ns) = ns {
            meta["namespace"] = json!(ns);
        }
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role},
            "subjects": subjects})
    };
    let subjects = |i: usize| {
        json!([{"apiGroup": GROUP, "kind": "User", "name": format!("user-{i}")},
               {"apiGroup": GROUP, "kind": "Group", "name": format!("team-{}", i % GROUPS)}])
    };
    for i in 0..ROLE_BINDINGS - 1 {
        let ns = format!("ns-{}", i % NAMESPACES);
        let role = if i % 2 == 0 { "edit" } else { "view" };
        let b = binding(
            "RoleBinding",
            format!("b-{i}"),
            Some(&ns),
            role,
            subjects(i),
        );
        out.push(("rolebindings", Some(ns), b));
    }
    out.push((
        "rolebindings",
        Some("default".into()),
        binding(
            "RoleBinding",
            "bench-edit".into(),
            Some("default"),
            "edit",
            json!([{"apiGroup": GROUP, "kind": "User", "name": BENCH_USER}]),
        ),
    ));
    for i in 0..CLUSTER_ROLE_BINDINGS {
        out.push((
            "clusterrolebindings",
            None,
            binding(
                "ClusterRoleBinding",
                format!("cb-{i}"),
                None,
                NODE_READER,
                subjects(i),
            ),
        ));
    }
    out
}

/// A measured user: `user-<i>`, authenticated, in a team whose RoleBindings are in other
/// namespaces than its own binding but whose ClusterRoleBindings (20 of them) apply.
fn user(i: usize) -> User {
    User {
        name: format!("user-{i}"),
        groups: vec![
            format!("team-{}", (i + 7) % GROUPS),
            "system:authenticated".into(),
        ],
        ..Default::default()
    }
}

/// The two measured requests of `user(i)`, as URL paths with their verbs: get a pod in the
/// namespace of its binding (allowed by `edit` or `view`), and create a RoleBinding there
/// (granted by neither, so every rule bound to the user is tried).
fn requests(i: usize) -> [(&'static str, String, bool); 2] {
    let ns = format!("ns-{}", i % NAMESPACES);
    [
        ("get", format!("/api/v1/namespaces/{ns}/pods/p"), true),
        (
            "create",
            format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"),
            false,
        ),
    ]
}

fn store_key(plural: &str, ns: Option<&str>, obj: &Value) -> String {
    let group = if plural == "namespaces" {
        "core"
    } else {
        GROUP
    };
    let name = obj["metadata"]["name"].as_str().unwrap_or("");
    match ns {
        Some(ns) => format!("/{group}/{plural}/{ns}/{name}"),
        None => format!("/{group}/{plural}/{name}"),
    }
}

/// p50 and p99 in µs of the allowed and the refused decision, each a `Chain::authorize`
/// call of `Node,RBAC` over a store holding the bootstrap policy and [`population`].
fn decisions_in_process() -> Result<[(f64, f64); 2]> {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&dir.path().join("s.redb"))?);
    for role in policy::cluster_roles() {
        store.create(&store_key("clusterroles", None, &role), role)?;
    }
    for b in policy::cluster_role_bindings() {
        store.create(&store_key("clusterrolebindings", None, &b), b)?;
    }
    for (plural, ns, obj) in population() {
        store.create(&store_key(plural, ns.as_deref(), &obj), obj)?;
    }
    // The aggregation controller's passes: view feeds edit, which feeds admin.
    for _ in 0..3 {
        policy::aggregate(store.as_ref())?;
    }
    let chain = Chain::new(
        &parse_modes("Node,RBAC").map_err(anyhow::Error::msg)?,
        store.clone(),
    );
    let mut times = [Vec::with_capacity(DECISIONS), Vec::with_capacity(DECISIONS)];
    for k in 0..DECISIONS * 2 {
        let i = (k / 2) % (ROLE_BINDINGS - 1);
        let u = user(i);
        let reqs = requests(i);
        let (verb, path, want) = &reqs[k % 2];
        let Parsed::Resource(target) = parse(path) else {
            bail!("{path} is not a served resource");
        };
        let attrs = Attributes {
            verb,
            request: Request::Served(&target),
            body: None,
            field_selector: None,
        };
        let t = Instant::now();
        let d = chain.authorize(&u, &attrs, store.as_ref());
        let us = t.elapsed().as_secs_f64() * 1e6;
        ensure!(
            d.is_ok() == *want,
            "{} {verb} {path}: allowed {}, expected {want}",
            u.name,
            d.is_ok()
        );
        times[k % 2].push(us);
    }
    Ok(times.map(|mut v| (pct(&mut v, 50.0), pct(&mut v, 99.0))))
}

/// Writes [`population`] through the API as the admin.
async fn populate(c: &kube::Client) -> Result<()> {
    let pp = PostParams::default();
    for (plural, ns, obj) in population() {
        match (plural, ns) {
            ("namespaces", _) => {
                Api::<Namespace>::all(c.clone())
                    .create(&pp, &serde_json::from_value(obj)?)
                    .await?;
            }
            ("clusterroles", _) => {
                Api::<ClusterRole>::all(c.clone())
                    .create(&pp, &serde_json::from_value(obj)?)
                    .await?;
            }
            ("clusterrolebindings", _) => {
                Api::<ClusterRoleBinding>::all(c.clone())
                    .create(&pp, &serde_json::from_value(obj)?)
                    .await?;
            }
            ("rolebindings", Some(ns)) => {
                Api::<RoleBinding>::namespaced(c.clone(), &ns)
                    .create(&pp, &serde_json::from_value(obj)?)
                    .await?;
            }
            (other, _) => bail!("no API for {other}"),
        }
    }
    Ok(())
}

fn sar(user: &User, verb: &str, path: &str) -> Result<SubjectAccessReview> {
    let Parsed::Resource(t) = parse(path) else {
        bail!("{path} is not a served resource");
    };
    Ok(serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user.name, "groups": user.groups,
            "resourceAttributes": {"verb": verb, "group": t.info.group, "resource": t.info.plural,
                "namespace": t.namespace, "name": t.name}}
    }))?)
}

/// p50 and p99 in µs of SubjectAccessReview round trips on one connection: the allowed
/// request, the refused one, and a `system:masters` subject (answered before any
/// authorizer), interleaved.
async fn decisions_over_http(admin: &kube::Client) -> Result<[(f64, f64); 3]> {
    let api: Api<SubjectAccessReview> = Api::all(admin.clone());
    let pp = PostParams::default();
    let master = User {
        name: "bench-admin".into(),
        groups: vec!["system:masters".into(), "system:authenticated".into()],
        ..Default::default()
    };
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    let warm = REVIEWS / 10;
    for k in 0..(REVIEWS + warm) * 3 {
        let i = (k / 3) % (ROLE_BINDINGS - 1);
        let (review, want) = match k % 3 {
            2 => (sar(&master, "delete", "/api/v1/nodes/n")?, true),
            m => {
                let reqs = requests(i);
                let (verb, path, want) = &reqs[m];
                (sar(&user(i), verb, path)?, *want)
            }
        };
        let t = Instant::now();
        let got = api.create(&pp, &review).await?;
        let us = t.elapsed().as_secs_f64() * 1e6;
        let allowed = got.status.as_ref().is_some_and(|s| s.allowed);
        ensure!(
            allowed == want,
            "SubjectAccessReview {:?}: allowed {allowed}, expected {want}",
            review.spec
        );
        if k >= warm * 3 {
            times[k % 3].push(us);
        }
    }
    Ok(times.map(|mut v| (pct(&mut v, 50.0), pct(&mut v, 99.0))))
}

/// A client certificate kubeconfig for [`BENCH_USER`] (no groups but
/// `system:authenticated`).
fn bench_kubeconfig(server: &Server) -> Result<PathBuf> {
    let admin = std::fs::read_to_string(&server.kubeconfig)?;
    let url = admin
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .context("server in admin.kubeconfig")?
        .to_string();
    Ok(nodus_control_plane::pki::issue_user_kubeconfig(
        &server.data_dir,
        "bench.kubeconfig",
        BENCH_USER,
        &[],
        &url,
    )?)
}

/// Waits until `default/default` exists: ServiceAccount admission refuses pods before.
async fn wait_default_sa(admin: &kube::Client) -> Result<()> {
    let api: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.get_opt("default").await?.is_none() {
        ensure!(
            Instant::now() < deadline,
            "no default ServiceAccount after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A started server with [`population`] written and the default ServiceAccount present.
async fn populated_server(bin: &Path, mode: &str) -> Result<(Server, kube::Client)> {
    let server = start_with(bin, &["--authorization-mode", mode], None)?;
    let admin = client(&server.kubeconfig).await?;
    populate(&admin).await?;
    wait_default_sa(&admin).await?;
    Ok((server, admin))
}

/// Pods created per second (1 client, [`CONCURRENT`] clients) as [`BENCH_USER`], and the
/// server's CPU time (user + system) per created pod over both.
async fn create_rates_as_bench(server: &Server) -> Result<(f64, f64, f64)> {
    let kc = bench_kubeconfig(server)?;
    let mut clients = Vec::new();
    for _ in 0..CONCURRENT {
        clients.push(client(&kc).await?);
    }
    let cpu = cpu_ms(server.child.id());
    let (single, concurrent) = create_rates(&clients, "").await?;
    let per_pod = (cpu_ms(server.child.id()) - cpu) / (SINGLE + CONCURRENT * PER_CLIENT) as f64;
    Ok((single, concurrent, per_pod))
}

fn token_review(token: &str) -> Result<TokenReview> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": token}
    }))?)
}

/// Reviews `token` `n` times on one connection; each round trip's time in µs. `want` is
/// the user the review must name (`None`: not authenticated).
async fn review_tokens(
    c: kube::Client,
    token: Arc<str>,
    want: Option<Arc<str>>,
    n: usize,
) -> Result<Vec<f64>> {
    let api: Api<TokenReview> = Api::all(c);
    let pp = PostParams::default();
    let review = token_review(&token)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let got = api.create(&pp, &review).await?;
        out.push(t.elapsed().as_secs_f64() * 1e6);
        let status = got.status.unwrap_or_default();
        let name = status
            .user
            .and_then(|u| u.username)
            .filter(|_| status.authenticated == Some(true));
        ensure!(
            name.as_deref() == want.as_deref(),
            "TokenReview: {name:?}, expected {want:?} ({:?})",
            status.error
        );
    }
    Ok(out)
}

struct TokenFigures {
    kind: &'static str,
    p50_us: f64,
    p99_us: f64,
    single_per_s: f64,
    concurrent_per_s: f64,
}

/// A service-account token of `default/default` from TokenRequest (the API server's
/// audiences, one hour).
async fn service_account_token(admin: &kube::Client) -> Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let req: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": 3600}
    }))?;
    let got: TokenRequest = api
        .create_subresource("token", "default", &PostParams::default(), &req)
        .await?;
    Ok(got.status.context("TokenRequest has no status")?.token)
}

/// A bootstrap token as an administrator makes one: `nodus token create`.
fn bootstrap_token(bin: &Path, data_dir: &Path) -> Result<String> {
    let out = std::process::Command::new(bin)
        .args(["token", "create", "--ttl", "1h", "--data-dir"])
        .arg(data_dir)
        .output()?;
    ensure!(
        out.status.success(),
        "nodus token create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)?
        .lines()
        .next()
        .map(str::to_string)
        .context("nodus token create printed no token")
}

async fn token_reviews(
    bin: &Path,
    server: &Server,
    admin: &kube::Client,
) -> Result<Vec<TokenFigures>> {
    let sa = service_account_token(admin).await?;
    let bootstrap = bootstrap_token(bin, &server.data_dir)?;
    let id = bootstrap.split('.').next().unwrap_or("").to_string();
    let kinds: [(&'static str, String, Option<String>); 3] = [
        (
            "service-account token (ES256 JWT, TokenRequest)",
            sa,
            Some("system:serviceaccount:default:default".into()),
        ),
        (
            "bootstrap token (`nodus token create`)",
            bootstrap,
            Some(format!("system:bootstrap:{id}")),
        ),
        (
            "floor: a token no authenticator accepts",
            "not-a-token".into(),
            None,
        ),
    ];
    let mut clients = Vec::new();
    for _ in 0..CONCURRENT {
        clients.push(client(&server.kubeconfig).await?);
    }
    let mut out = Vec::new();
    for (kind, token, want) in kinds {
        let token: Arc<str> = token.into();
        let want: Option<Arc<str>> = want.map(Into::into);
        // Warm-up, then one client in a row.
        review_tokens(admin.clone(), token.clone(), want.clone(), 200).await?;
        let t = Instant::now();
        let mut lat =
            review_tokens(admin.clone(), token.clone(), want.clone(), TOKEN_REVIEWS).await?;
        let single_per_s = TOKEN_REVIEWS as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut tasks = Vec::new();
        for c in &clients {
            tasks.push(tokio::spawn(review_tokens(
                c.clone(),
                token.clone(),
                want.clone(),
                TOKEN_REVIEWS_PER_CLIENT,
            )));
        }
        for task in tasks {
            task.await??;
        }
        let concurrent_per_s =
            (CONCURRENT * TOKEN_REVIEWS_PER_CLIENT) as f64 / t.elapsed().as_secs_f64();
        out.push(TokenFigures {
            kind,
            p50_us: pct(&mut lat, 50.0),
            p99_us: pct(&mut lat, 99.0),
            single_per_s,
            concurrent_per_s,
        });
    }
    Ok(out)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn median(v: &[f64]) -> f64 {
    pct(&mut v.to_vec(), 50.0)
}

fn list(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn list3(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.3}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let write = nodus_bench::write_arg().map_err(anyhow::Error::msg)?;
    let bin =
        PathBuf::from(std::env::var("NODUS_BIN").unwrap_or_else(|_| "target/release/nodus".into()));
    let load_start = loadavg();

    let [(a50, a99), (d50, d99)] = tokio::task::spawn_blocking(decisions_in_process).await??;
    println!(
        "in-process Chain::authorize: allowed p50 {a50:.2} µs p99 {a99:.2} µs; refused p50 {d50:.2} µs p99 {d99:.2} µs"
    );

    // Create throughput, modes alternating on fresh servers; the RBAC server of the first
    // round also answers the review benchmarks.
    let mut rates: [(Vec<f64>, Vec<f64>, Vec<f64>); 2] = Default::default();
    let mut reviews = None;
    let mut tokens = Vec::new();
    for round in 0..ROUNDS {
        for (m, mode) in ["AlwaysAllow", "Node,RBAC"].into_iter().enumerate() {
            let (server, admin) = populated_server(&bin, mode).await?;
            let (single, conc, cpu) = create_rates_as_bench(&server).await?;
            println!(
                "round {round} {mode}: pods created/s as {BENCH_USER}: 1 client {single:.0}, {CONCURRENT} clients {conc:.0}; server CPU {cpu:.3} ms per pod (load {})",
                loadavg()
            );
            rates[m].0.push(single);
            rates[m].1.push(conc);
            rates[m].2.push(cpu);
            if mode == "Node,RBAC" && reviews.is_none() {
                let r = decisions_over_http(&admin).await?;
                println!(
                    "SubjectAccessReview round trip p50/p99 µs: allowed {:.0}/{:.0}, refused {:.0}/{:.0}, system:masters {:.0}/{:.0}",
                    r[0].0, r[0].1, r[1].0, r[1].1, r[2].0, r[2].1
                );
                reviews = Some(r);
                tokens = token_reviews(&bin, &server, &admin).await?;
                for t in &tokens {
                    println!(
                        "TokenReview {}: p50 {:.0} µs p99 {:.0} µs, {:.0}/s one client, {:.0}/s {CONCURRENT} clients",
                        t.kind, t.p50_us, t.p99_us, t.single_per_s, t.concurrent_per_s
                    );
                }
            }
            drop(server);
        }
    }
    let load_end = loadavg();
    let r = reviews.context("no review figures")?;
    let (aa_single, aa_conc) = (median(&rates[0].0), median(&rates[0].1));
    let (rb_single, rb_conc) = (median(&rates[1].0), median(&rates[1].1));
    let (aa_cpu, rb_cpu) = (median(&rates[0].2), median(&rates[1].2));
    let slower = |aa: f64, rb: f64| (aa - rb) / aa * 100.0;
    println!(
        "median pods created/s: 1 client AlwaysAllow {aa_single:.0} vs Node,RBAC {rb_single:.0} ({:+.1} % slower); {CONCURRENT} clients {aa_conc:.0} vs {rb_conc:.0} ({:+.1} % slower); server CPU per pod {aa_cpu:.3} vs {rb_cpu:.3} ms ({:+.1} %)",
        slower(aa_single, rb_single),
        slower(aa_conc, rb_conc),
        (rb_cpu - aa_cpu) / aa_cpu * 100.0
    );

    let Some(path) = write else {
        return Ok(());
    };
    let date = nodus_bench::today();
    let mut body = format!(
        "Measured {date} by `bash bench/rbac.sh` (bench/src/bin/rbac.rs): the release `nodus \
control-plane` binary on 127.0.0.1, kube-rs clients over HTTPS with client certificates, one \
kept-alive connection per client; 2 cores, load average {load_start} at the start and \
{load_end} at the end.\n\n\
The store holds upstream's bootstrap policy plus {ROLE_BINDINGS} RoleBindings over \
{NAMESPACES} namespaces (`user-<i>` and group `team-<i mod {GROUPS}>` to `edit` or `view`; \
the last one binds the create benchmark's user to `edit` in `default`) and \
{CLUSTER_ROLE_BINDINGS} ClusterRoleBindings (`user-<i>` and its team to a ClusterRole of \
node, PV and StorageClass reads). A measured user `user-<i>` is in a team with 20 \
ClusterRoleBindings and RoleBindings only elsewhere; allowed = `get pods` in the namespace of \
its binding, refused = `create rolebindings` there (neither `edit` nor `view` grants it, so \
every rule bound to the user is tried).\n\n\
| decision | in-process: `Chain::authorize` (`Node,RBAC`), p50 / p99 | end to end: SubjectAccessReview round trip, p50 / p99 | goal |\n\
| --- | --- | --- | --- |\n\
| allowed | {a50:.2} / {a99:.2} µs | {:.0} / {:.0} µs | p99 < 50 µs |\n\
| refused | {d50:.2} / {d99:.2} µs | {:.0} / {:.0} µs | p99 < 50 µs |\n\
| none: subject in `system:masters` (answered before any authorizer) | – | {:.0} / {:.0} µs | |\n\n\
In-process: {DECISIONS} calls of each kind of the API server's own authorizer chain over \
an embedded store with the same objects, each call timed alone (the RBAC index is built \
once, before timing, as the server builds it once per RBAC change). End to end: \
{REVIEWS} SubjectAccessReviews of each kind, interleaved, posted by the admin on one \
connection after {} warm-up rounds; the `system:masters` row is the same round trip with no \
authorizer consulted, so the difference of the p50s is what the decision adds to a request.\n\n",
        r[0].0,
        r[0].1,
        r[1].0,
        r[1].1,
        r[2].0,
        r[2].1,
        REVIEWS / 10
    );
    body.push_str(&format!(
        "Pods created per second, the API server benchmark's create workload \
(`create_rates`: {SINGLE} pods by one client, then {CONCURRENT} clients × {PER_CLIENT}) as \
the non-admin user `{BENCH_USER}` (client certificate, no groups), {ROUNDS} rounds \
alternating the modes, each on a fresh server holding the objects above:\n\n\
| `--authorization-mode` | 1 client, pods/s (rounds) | median | {CONCURRENT} clients, pods/s (rounds) | median | server CPU per created pod (rounds) | median |\n\
| --- | --- | --- | --- | --- | --- | --- |\n\
| `AlwaysAllow` | {} | {aa_single:.0} | {} | {aa_conc:.0} | {} ms | {aa_cpu:.3} ms |\n\
| `Node,RBAC` (`{BENCH_USER}` bound to `edit` by one of the {ROLE_BINDINGS} RoleBindings) | {} | {rb_single:.0} | {} | {rb_conc:.0} | {} ms | {rb_cpu:.3} ms |\n\
| RBAC's cost (medians) | | {:+.1} % | | {:+.1} % | | {:+.1} % |\n\n\
Goal: RBAC adds under 5 % to create throughput. Server CPU is the `nodus control-plane` \
process's user + system time over both phases divided by the {} pods: it is what RBAC \
adds to the server's work, and is far less sensitive than wall time to other work on the \
machine.\n\n",
        list(&rates[0].0),
        list(&rates[0].1),
        list3(&rates[0].2),
        list(&rates[1].0),
        list(&rates[1].1),
        list3(&rates[1].2),
        slower(aa_single, rb_single),
        slower(aa_conc, rb_conc),
        (rb_cpu - aa_cpu) / aa_cpu * 100.0,
        SINGLE + CONCURRENT * PER_CLIENT,
    ));
    body.push_str(&format!(
        "TokenReview throughput, posted by the admin (`system:masters`, so no authorizer runs \
for the review itself): 200 warm-up reviews, {TOKEN_REVIEWS} on one connection, then \
{CONCURRENT} clients × {TOKEN_REVIEWS_PER_CLIENT} at once; each answer checked for the \
expected user.\n\n\
| token | 1 client: p50 / p99 | 1 client | {CONCURRENT} clients |\n| --- | --- | --- | --- |\n"
    ));
    for t in &tokens {
        body.push_str(&format!(
            "| {} | {:.0} / {:.0} µs | {:.0} reviews/s | {:.0} reviews/s |\n",
            t.kind, t.p50_us, t.p99_us, t.single_per_s, t.concurrent_per_s
        ));
    }
    nodus_bench::write_section(
        &path,
        "rbac",
        "## Access control: authorization, TokenReview (`bash bench/rbac.sh`)",
        &body,
    )?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
