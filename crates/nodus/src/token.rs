//! `nodus token`: bootstrap tokens for joining nodes, as `kubeadm token create|list`. A
//! token is a Secret in kube-system written through the API with the admin kubeconfig;
//! `create` prints the token and the `nodus node` line that joins with it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, PostParams};
use nodus_control_plane::apiserver::authn::bootstraptoken::{
    DEFAULT_NODE_TOKEN_GROUP, generate_token, parse_token,
};

#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub action: TokenAction,
    /// The control plane's data dir: its admin.kubeconfig and CA are used.
    #[arg(long, global = true, default_value = "/var/lib/nodus/control-plane")]
    pub data_dir: PathBuf,
    /// The kubeconfig to create tokens with [default: DATA_DIR/admin.kubeconfig].
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
pub enum TokenAction {
    /// Create a bootstrap token and print the `nodus node` line that joins with it.
    Create {
        /// The token to create [default: a random one]; `[a-z0-9]{6}.[a-z0-9]{16}`.
        token: Option<String>,
        /// How long the token is valid; 0 never expires.
        #[arg(long, default_value = "24h")]
        ttl: String,
        /// A description kept with the token.
        #[arg(long)]
        description: Option<String>,
        /// Extra groups the token authenticates as (each `system:bootstrappers:...`).
        #[arg(long, value_delimiter = ',', default_value = DEFAULT_NODE_TOKEN_GROUP)]
        groups: Vec<String>,
    },
    /// List the bootstrap tokens.
    List,
}

async fn client(args: &TokenArgs) -> anyhow::Result<kube::Client> {
    let path = args
        .kubeconfig
        .clone()
        .unwrap_or_else(|| args.data_dir.join("admin.kubeconfig"));
    let kc = kube::config::Kubeconfig::read_from(&path)
        .with_context(|| format!("reading {}", path.display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .with_context(|| format!("loading {}", path.display()))?;
    kube::Client::try_from(cfg).context("building the API client")
}

fn rfc3339(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

pub async fn run(args: TokenArgs) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client(&args).await?, "kube-system");
    match &args.action {
        TokenAction::Create {
            token,
            ttl,
            description,
            groups,
        } => {
            let token = token.clone().unwrap_or_else(generate_token);
            let parts = parse_token(&token).with_context(|| {
                format!(
                    "the token {token:?} does not match the pattern [a-z0-9]{{6}}.[a-z0-9]{{16}}"
                )
            })?;
            for g in groups {
                anyhow::ensure!(
                    nodus_control_plane::apiserver::authn::bootstraptoken::valid_extra_group(g),
                    "--groups: {g:?} does not match system:bootstrappers:[a-z0-9:-]{{0,255}}[a-z0-9]"
                );
            }
            let ttl: Duration = nodus_k8s::duration::parse_duration(ttl)
                .map_err(|e| anyhow::anyhow!("--ttl: {e}"))?;
            let mut data = std::collections::BTreeMap::new();
            let mut put = |k: &str, v: &str| {
                data.insert(k.to_string(), ByteString(v.as_bytes().to_vec()));
            };
            put("token-id", parts.id);
            put("token-secret", parts.secret);
            put("usage-bootstrap-authentication", "true");
            put("usage-bootstrap-signing", "true");
            if !groups.is_empty() {
                put("auth-extra-groups", &groups.join(","));
            }
            if !ttl.is_zero() {
                put("expiration", &rfc3339(std::time::SystemTime::now() + ttl));
            }
            if let Some(d) = description {
                put("description", d);
            }
            let secret = Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(format!("bootstrap-token-{}", parts.id)),
                    namespace: Some("kube-system".into()),
                    ..Default::default()
                },
                type_: Some("bootstrap.kubernetes.io/token".into()),
                data: Some(data),
                ..Default::default()
            };
            secrets
                .create(&PostParams::default(), &secret)
                .await
                .context("creating the bootstrap token Secret")?;
            let ca = std::fs::read_to_string(args.data_dir.join("pki").join("ca.crt"))
                .context("reading the cluster CA")?;
            let hash = nodus_control_plane::pki::ca_cert_hash(&ca)?;
            let server = client_server(&args)?;
            println!("{token}");
            println!(
                "nodus node --server {server} --token {token} --discovery-token-ca-cert-hash {hash}"
            );
        }
        TokenAction::List => {
            let list = secrets
                .list(&ListParams::default())
                .await
                .context("listing Secrets in kube-system")?;
            println!("TOKEN\tEXPIRES\tUSAGES\tDESCRIPTION\tEXTRA GROUPS");
            for s in list
                .items
                .iter()
                .filter(|s| s.type_.as_deref() == Some("bootstrap.kubernetes.io/token"))
            {
                let get = |k: &str| {
                    s.data
                        .as_ref()
                        .and_then(|d| d.get(k))
                        .map(|v| String::from_utf8_lossy(&v.0).to_string())
                        .unwrap_or_default()
                };
                let usages: Vec<&str> = [
                    ("usage-bootstrap-authentication", "authentication"),
                    ("usage-bootstrap-signing", "signing"),
                ]
                .iter()
                .filter(|(k, _)| get(k) == "true")
                .map(|(_, u)| *u)
                .collect();
                let or_none = |s: String| if s.is_empty() { "<none>".into() } else { s };
                println!(
                    "{}.{}\t{}\t{}\t{}\t{}",
                    get("token-id"),
                    get("token-secret"),
                    or_none(get("expiration")),
                    or_none(usages.join(",")),
                    or_none(get("description")),
                    or_none(get("auth-extra-groups")),
                );
            }
        }
    }
    Ok(())
}

/// The API server URL of the kubeconfig in use, for the printed join line.
fn client_server(args: &TokenArgs) -> anyhow::Result<String> {
    let path = args
        .kubeconfig
        .clone()
        .unwrap_or_else(|| args.data_dir.join("admin.kubeconfig"));
    let kc = kube::config::Kubeconfig::read_from(&path)?;
    kc.clusters
        .iter()
        .find_map(|c| c.cluster.as_ref()?.server.clone())
        .with_context(|| format!("{} names no server", path.display()))
}
