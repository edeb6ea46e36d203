//! Container commands: create, run, start, stop, rm, ps, inspect.

use crate::format::{
    Output, go_map, one_or_array, proto_json, status_with_info, table, trunc13, truncate_image,
};
use crate::timefmt::{GO_ZERO_TIME, ago, now_ns, rfc3339_local};
use crate::util::{
    aggregate, compile, io, matches, parse_labels, rpc_text, truncate_count, with_timeout,
};
use crate::{Clients, CrictlError, rpc};
use base64::Engine as _;
use clap::Args;
use cri::runtime::v1::{
    AuthConfig, Container, ContainerConfig, ContainerFilter, ContainerState, ContainerStateValue,
    ContainerStatusRequest, ContainerStatusResponse, CreateContainerRequest, ImageSpec,
    ImageStatusRequest, ListContainersRequest, PodSandboxConfig, PullImageRequest,
    RemoveContainerRequest, StartContainerRequest, StopContainerRequest,
};
use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

/// The kubelet's labels crictl reads a container's pod name and namespace from.
const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";

#[derive(Debug, Args, Clone)]
pub struct PullFlags {
    /// Do not pull the image on container creation (the default for create).
    #[arg(long)]
    pub no_pull: bool,
    /// Pull the image on container creation.
    #[arg(long)]
    pub with_pull: bool,
    /// Registry credentials, USERNAME[:PASSWORD].
    #[arg(long)]
    pub creds: Option<String>,
    /// Base64 of USERNAME:PASSWORD.
    #[arg(long)]
    pub auth: Option<String>,
    /// Registry user name; the password is read from stdin.
    #[arg(long)]
    pub username: Option<String>,
    /// Time to wait for the create request to complete before cancelling it, e.g. 30s.
    #[arg(short = 'T', long, value_parser = crate::parse_duration)]
    pub cancel_timeout: Option<Duration>,
    /// Maximum time to be used for pulling the image (0s: no limit).
    #[arg(long, alias = "pt", env = "CRICTL_PULL_TIMEOUT", value_parser = crate::parse_duration)]
    pub pull_timeout: Option<Duration>,
}

#[derive(Debug, Args, Clone)]
pub struct CreateArgs {
    /// Pod sandbox id.
    #[arg(value_name = "POD")]
    pub pod: String,
    /// Container config file (JSON or YAML).
    #[arg(value_name = "CONTAINER_CONFIG")]
    pub container_config: String,
    /// Pod sandbox config file (JSON or YAML).
    #[arg(value_name = "POD_CONFIG")]
    pub pod_config: String,
    #[command(flatten)]
    pub pull: PullFlags,
}

#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    /// Container config file (JSON or YAML).
    #[arg(value_name = "CONTAINER_CONFIG")]
    pub container_config: String,
    /// Pod sandbox config file (JSON or YAML).
    #[arg(value_name = "POD_CONFIG")]
    pub pod_config: String,
    /// Runtime handler to use.
    #[arg(short, long)]
    pub runtime: Option<String>,
    #[command(flatten)]
    pub pull: PullFlags,
}

#[derive(Debug, Args, Clone)]
pub struct StartArgs {
    #[arg(value_name = "CONTAINER-ID")]
    pub containers: Vec<String>,
}

#[derive(Debug, Args, Clone)]
pub struct StopArgs {
    #[arg(value_name = "CONTAINER-ID")]
    pub containers: Vec<String>,
    /// Seconds to wait to kill the container after a graceful stop is requested.
    #[arg(short, long, default_value_t = 0)]
    pub timeout: i64,
    /// Stop all running containers.
    #[arg(short, long)]
    pub all: bool,
}

#[derive(Debug, Args, Clone)]
pub struct RmArgs {
    #[arg(value_name = "CONTAINER-ID")]
    pub containers: Vec<String>,
    /// Force removal of the container, disregarding if running.
    #[arg(short, long)]
    pub force: bool,
    /// Preserve the container log file and its rotations.
    #[arg(short, long)]
    pub keep_logs: bool,
    /// Remove all containers.
    #[arg(short, long)]
    pub all: bool,
}

#[derive(Debug, Args, Clone)]
pub struct PsArgs {
    /// Show verbose information for containers.
    #[arg(short, long)]
    pub verbose: bool,
    /// Filter by container id.
    #[arg(long)]
    pub id: Option<String>,
    /// Filter by container name regular expression pattern.
    #[arg(long)]
    pub name: Option<String>,
    /// Filter by pod id.
    #[arg(short, long)]
    pub pod: Option<String>,
    /// Filter by container image.
    #[arg(long)]
    pub image: Option<String>,
    /// Filter by container state: created, running, exited or unknown.
    #[arg(short, long)]
    pub state: Option<String>,
    /// Filter by key=value label.
    #[arg(long = "label")]
    pub label: Vec<String>,
    /// Only display container IDs.
    #[arg(short, long)]
    pub quiet: bool,
    /// Output format: json, yaml or table.
    #[arg(short, long)]
    pub output: Option<String>,
    /// Show all containers.
    #[arg(short, long)]
    pub all: bool,
    /// Show the most recently created container (includes all states).
    #[arg(short, long)]
    pub latest: bool,
    /// Show last n recently created containers (includes all states). Set 0 for unlimited.
    #[arg(short = 'n', long, default_value_t = 0)]
    pub last: usize,
    /// Show output without truncating the ID.
    #[arg(long)]
    pub no_trunc: bool,
    /// Show image path instead of image id.
    #[arg(short, long)]
    pub resolve_image_path: bool,
    /// Filter by pod namespace regular expression pattern.
    #[arg(long)]
    pub namespace: Option<String>,
}

#[derive(Debug, Args, Clone)]
pub struct InspectArgs {
    #[arg(value_name = "CONTAINER-ID")]
    pub containers: Vec<String>,
    /// Output format: json (default), yaml or table.
    #[arg(short, long)]
    pub output: Option<String>,
    /// Do not show verbose information.
    #[arg(short, long)]
    pub quiet: bool,
    /// Go templates are not supported by nodus crictl.
    #[arg(long, hide = true)]
    pub template: Option<String>,
    /// Filter by container name regular expression pattern.
    #[arg(long)]
    pub name: Option<String>,
    /// Filter by pod namespace regular expression pattern.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Filter by pod id.
    #[arg(short, long)]
    pub pod: Option<String>,
    /// Filter by container image.
    #[arg(long)]
    pub image: Option<String>,
    /// Filter by container state.
    #[arg(short, long)]
    pub state: Option<String>,
    /// Filter by key=value label.
    #[arg(long = "label")]
    pub label: Vec<String>,
    /// Show the most recently created container (includes all states).
    #[arg(short, long)]
    pub latest: bool,
    /// Show last n recently created containers (includes all states).
    #[arg(short = 'n', long, default_value_t = 0)]
    pub last: usize,
    /// Show all containers.
    #[arg(short, long)]
    pub all: bool,
}

fn pull_auth(p: &PullFlags) -> Result<Option<AuthConfig>, CrictlError> {
    let (user, pass) = if let Some(creds) = &p.creds {
        let (u, pw) = creds.split_once(':').unwrap_or((creds.as_str(), ""));
        if u.is_empty() {
            return Err(CrictlError::Usage(
                "--creds must be USERNAME[:PASSWORD] with a non-empty username".into(),
            ));
        }
        (u.to_string(), pw.to_string())
    } else if let Some(encoded) = &p.auth {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| CrictlError::Usage(format!("--auth is not valid base64: {e}")))?;
        let s = String::from_utf8(decoded)
            .map_err(|_| CrictlError::Usage("--auth does not decode to UTF-8".into()))?;
        let (u, pw) = s.split_once(':').unwrap_or((s.as_str(), ""));
        (u.to_string(), pw.to_string())
    } else if let Some(u) = &p.username {
        eprint!("Enter Password:");
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .map_err(|e| CrictlError::Other(format!("reading the password: {e}")))?;
        (u.clone(), line.trim_end_matches(['\r', '\n']).to_string())
    } else {
        return Ok(None);
    };
    Ok(Some(AuthConfig {
        username: user,
        password: pass,
        ..Default::default()
    }))
}

/// crictl's `CreateContainer`: load both configs, pull when asked, create.
async fn create_container(
    c: &Clients,
    pod_id: &str,
    container_config: &str,
    pod_config: &str,
    pull: &PullFlags,
    with_pull: bool,
) -> Result<String, CrictlError> {
    let mut config: ContainerConfig = crate::config::load_container_config(container_config)
        .map_err(|e| CrictlError::Other(format!("creating container: {e}")))?;
    let pod: PodSandboxConfig = crate::config::load_pod_config(pod_config)
        .map_err(|e| CrictlError::Other(format!("creating container: {e}")))?;
    let image = config.image.clone().unwrap_or_default();
    if image.user_specified_image.is_empty()
        && let Some(i) = config.image.as_mut()
    {
        i.user_specified_image = image.image.clone();
    }
    if with_pull {
        let auth = pull_auth(pull)?;
        let mut images = vec![image.image.clone()];
        for m in &config.mounts {
            if let Some(i) = m.image.as_ref().filter(|i| !i.image.is_empty()) {
                images.push(i.image.clone());
            }
        }
        for name in images {
            let mut ic = c.image.clone();
            let req = PullImageRequest {
                image: Some(ImageSpec {
                    image: name.clone(),
                    annotations: image.annotations.clone(),
                    ..Default::default()
                }),
                auth: auth.clone(),
                sandbox_config: Some(pod.clone()),
            };
            with_timeout(pull.pull_timeout, async move { ic.pull_image(req).await })
                .await
                .map_err(rpc(format!("creating container: pulling image {name:?}")))?;
        }
    }
    let mut rt = c.runtime.clone();
    let req = CreateContainerRequest {
        pod_sandbox_id: pod_id.to_string(),
        config: Some(config),
        sandbox_config: Some(pod),
    };
    with_timeout(pull.cancel_timeout, async move {
        rt.create_container(req)
            .await
            .map(|r| r.into_inner().container_id)
    })
    .await
    .map_err(rpc("creating container"))
}

fn pull_conflict(p: &PullFlags) -> Result<(), CrictlError> {
    if p.no_pull && p.with_pull {
        return Err(CrictlError::Usage(
            "conflict: no-pull and with-pull are both set".into(),
        ));
    }
    Ok(())
}

pub async fn create(
    c: &Clients,
    a: CreateArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    pull_conflict(&a.pull)?;
    // crictl's pull-image-on-create defaults to false: only --with-pull pulls.
    let with_pull = a.pull.with_pull;
    let id = create_container(
        c,
        &a.pod,
        &a.container_config,
        &a.pod_config,
        &a.pull,
        with_pull,
    )
    .await?;
    writeln!(out, "{id}").map_err(io)
}

pub async fn run(c: &Clients, a: RunArgs, out: &mut (dyn Write + Send)) -> Result<(), CrictlError> {
    pull_conflict(&a.pull)?;
    // crictl's disable-pull-on-run defaults to false: run pulls unless --no-pull.
    let with_pull = !a.pull.no_pull || a.pull.with_pull;
    let pod = crate::config::load_pod_config(&a.pod_config).map_err(|e| {
        CrictlError::Other(format!("running container: load podSandboxConfig: {e}"))
    })?;
    let pod_id = c
        .runtime
        .clone()
        .run_pod_sandbox(cri::runtime::v1::RunPodSandboxRequest {
            config: Some(pod),
            runtime_handler: a.runtime.clone().unwrap_or_default(),
        })
        .await
        .map_err(rpc("running container: run pod sandbox"))?
        .into_inner()
        .pod_sandbox_id;
    let id = create_container(
        c,
        &pod_id,
        &a.container_config,
        &a.pod_config,
        &a.pull,
        with_pull,
    )
    .await?;
    start_one(c, &id).await.map_err(|e| {
        CrictlError::Other(format!(
            "running container: starting the container {id:?}: {e}"
        ))
    })?;
    writeln!(out, "{id}").map_err(io)
}

async fn start_one(c: &Clients, id: &str) -> Result<(), String> {
    c.runtime
        .clone()
        .start_container(StartContainerRequest {
            container_id: id.into(),
        })
        .await
        .map(|_| ())
        .map_err(rpc_text)
}

pub async fn start(
    c: &Clients,
    a: StartArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    if a.containers.is_empty() {
        return Err(CrictlError::Usage("ID cannot be empty".into()));
    }
    for id in &a.containers {
        start_one(c, id)
            .await
            .map_err(|e| CrictlError::Other(format!("starting the container {id:?}: {e}")))?;
        writeln!(out, "{id}").map_err(io)?;
    }
    Ok(())
}

async fn stop_one(
    c: &Clients,
    id: &str,
    timeout: i64,
    out: &mut (dyn Write + Send),
) -> Result<(), String> {
    c.runtime
        .clone()
        .stop_container(StopContainerRequest {
            container_id: id.into(),
            timeout,
        })
        .await
        .map_err(rpc_text)?;
    writeln!(out, "{id}").map_err(|e| e.to_string())
}

pub async fn stop(
    c: &Clients,
    a: StopArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    if a.all && !a.containers.is_empty() {
        return Err(CrictlError::Usage(
            "cannot specify CONTAINER-ID(s) when using --all".into(),
        ));
    }
    let ids = if a.all {
        let running = list(
            c,
            &ListOpts {
                state: Some("running".into()),
                ..Default::default()
            },
        )
        .await?;
        if running.is_empty() {
            writeln!(out, "No running containers found.").map_err(io)?;
            return Ok(());
        }
        running.into_iter().map(|c| c.id).collect()
    } else {
        if a.containers.is_empty() {
            return Err(CrictlError::Usage(
                "you must specify at least one CONTAINER-ID or use --all".into(),
            ));
        }
        a.containers.clone()
    };
    for id in ids {
        stop_one(c, &id, a.timeout, out)
            .await
            .map_err(|e| CrictlError::Other(format!("stopping the container {id:?}: {e}")))?;
    }
    Ok(())
}

async fn container_status(
    c: &Clients,
    id: &str,
    verbose: bool,
) -> Result<ContainerStatusResponse, String> {
    c.runtime
        .clone()
        .container_status(ContainerStatusRequest {
            container_id: id.into(),
            verbose,
        })
        .await
        .map(|r| r.into_inner())
        .map_err(rpc_text)
}

/// The log file and its rotations (`<path>.*`), which `crictl rm` deletes.
fn log_files(log_path: &str) -> Vec<std::path::PathBuf> {
    let p = std::path::Path::new(log_path);
    let mut files = Vec::new();
    if let (Some(dir), Some(name)) = (p.parent(), p.file_name().and_then(|n| n.to_str())) {
        let prefix = format!("{name}.");
        if let Ok(rd) = std::fs::read_dir(if dir.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            dir
        }) {
            let mut rot: Vec<_> = rd
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| dir.join(e.file_name()))
                .collect();
            rot.sort();
            files.extend(rot);
        }
    }
    files.push(p.to_path_buf());
    files
}

pub async fn rm(c: &Clients, a: RmArgs, out: &mut (dyn Write + Send)) -> Result<(), CrictlError> {
    let mut ids = a.containers.clone();
    if a.all {
        ids = c
            .runtime
            .clone()
            .list_containers(ListContainersRequest { filter: None })
            .await
            .map_err(rpc("listing containers"))?
            .into_inner()
            .containers
            .into_iter()
            .map(|c| c.id)
            .collect();
        if ids.is_empty() {
            eprintln!("INFO[0000] No containers to remove");
            return Ok(());
        }
    }
    if ids.is_empty() {
        return Err(CrictlError::Usage("ID cannot be empty".into()));
    }
    let mut errors = Vec::new();
    for id in ids {
        let status = match container_status(c, &id, false).await {
            Ok(s) => s,
            Err(e) => {
                errors.push(format!("getting container status {id:?}: {e}"));
                continue;
            }
        };
        let st = status.status.unwrap_or_default();
        if st.state == ContainerState::ContainerRunning as i32 {
            if !a.force {
                errors.push(format!("container {id:?} is running, please stop it first"));
                continue;
            }
            if let Err(e) = stop_one(c, &id, 0, out).await {
                errors.push(format!("stopping the container {id:?}: {e}"));
                continue;
            }
        }
        if let Err(s) = c
            .runtime
            .clone()
            .remove_container(RemoveContainerRequest {
                container_id: id.clone(),
            })
            .await
        {
            errors.push(format!("removing container {id:?}: {}", rpc_text(s)));
            continue;
        }
        writeln!(out, "{id}").map_err(io)?;
        if !a.keep_logs && !st.log_path.is_empty() {
            for f in log_files(&st.log_path) {
                if let Err(e) = std::fs::remove_file(&f)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    eprintln!(
                        "ERRO[0000] removing log file {} for container {id:?} failed: {e}",
                        f.display()
                    );
                }
            }
        }
    }
    aggregate(errors)
}

#[derive(Default)]
struct ListOpts {
    id: Option<String>,
    pod: Option<String>,
    name: Option<String>,
    namespace: Option<String>,
    image: Option<String>,
    state: Option<String>,
    labels: Vec<String>,
    all: bool,
    latest: bool,
    last: usize,
}

fn state_filter(o: &ListOpts) -> Result<Option<ContainerStateValue>, CrictlError> {
    let state = o.state.as_deref().unwrap_or("");
    let mut filter = None;
    if !o.all && state.is_empty() {
        filter = Some(ContainerState::ContainerRunning);
    }
    if !state.is_empty() {
        filter = Some(match state.to_ascii_lowercase().as_str() {
            "created" => ContainerState::ContainerCreated,
            "running" => ContainerState::ContainerRunning,
            "exited" => ContainerState::ContainerExited,
            "unknown" => ContainerState::ContainerUnknown,
            _ => {
                return Err(CrictlError::Usage(
                    "--state should be one of created, running, exited or unknown".into(),
                ));
            }
        });
    }
    if o.latest || o.last > 0 {
        filter = None;
    }
    Ok(filter.map(|s| ContainerStateValue { state: s as i32 }))
}

async fn image_id(c: &Clients, image: &str) -> Result<Option<String>, CrictlError> {
    Ok(c.image
        .clone()
        .image_status(ImageStatusRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .map_err(rpc(format!("image status for {image:?} request")))?
        .into_inner()
        .image
        .map(|i| i.id))
}

fn label_or_unknown<'a>(labels: &'a HashMap<String, String>, key: &str) -> &'a str {
    labels.get(key).map(String::as_str).unwrap_or("unknown")
}

/// crictl's `ListContainers` + `getContainersList`.
async fn list(c: &Clients, o: &ListOpts) -> Result<Vec<Container>, CrictlError> {
    let name = compile(o.name.as_deref())?;
    let namespace = compile(o.namespace.as_deref())?;
    let filter = ContainerFilter {
        id: o.id.clone().unwrap_or_default(),
        pod_sandbox_id: o.pod.clone().unwrap_or_default(),
        state: state_filter(o)?,
        label_selector: parse_labels(&o.labels)?,
    };
    let all = c
        .runtime
        .clone()
        .list_containers(ListContainersRequest {
            filter: Some(filter),
        })
        .await
        .map_err(rpc("listing containers: call list containers RPC"))?
        .into_inner()
        .containers;
    let wanted_image = match o.image.as_deref().filter(|i| !i.is_empty()) {
        Some(i) => Some(image_id(c, i).await?),
        None => None,
    };
    let mut out = Vec::new();
    for ctr in all {
        if let Some(want) = &wanted_image {
            let own = image_id(c, &ctr.image.clone().unwrap_or_default().image).await?;
            if want.is_none() || own.is_none() || *want != own {
                continue;
            }
        }
        let Some(md) = &ctr.metadata else { continue };
        if matches(&name, &md.name)
            && matches(
                &namespace,
                label_or_unknown(&ctr.labels, POD_NAMESPACE_LABEL),
            )
        {
            out.push(ctr);
        }
    }
    out.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    truncate_count(&mut out, o.latest, o.last);
    Ok(out)
}

pub fn container_state(state: i32) -> &'static str {
    match ContainerState::try_from(state) {
        Ok(ContainerState::ContainerCreated) => "Created",
        Ok(ContainerState::ContainerRunning) => "Running",
        Ok(ContainerState::ContainerExited) => "Exited",
        _ => "Unknown",
    }
}

/// The `crictl ps` table (images already resolved when `--resolve-image-path`).
pub fn ps_table(ctrs: &[(Container, String)], no_trunc: bool, now: i128) -> String {
    let mut rows = vec![
        [
            "CONTAINER",
            "IMAGE",
            "CREATED",
            "STATE",
            "NAME",
            "ATTEMPT",
            "POD ID",
            "POD",
            "NAMESPACE",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for (ctr, image) in ctrs {
        let md = ctr.metadata.clone().unwrap_or_default();
        let (id, pod) = if no_trunc {
            (ctr.id.clone(), ctr.pod_sandbox_id.clone())
        } else {
            (trunc13(&ctr.id), trunc13(&ctr.pod_sandbox_id))
        };
        rows.push(vec![
            id,
            image.clone(),
            ago(ctr.created_at, now),
            container_state(ctr.state).into(),
            md.name,
            md.attempt.to_string(),
            pod,
            label_or_unknown(&ctr.labels, POD_NAME_LABEL).into(),
            label_or_unknown(&ctr.labels, POD_NAMESPACE_LABEL).into(),
        ]);
    }
    table(&rows)
}

fn labelled(out: &mut String, title: &str, m: &HashMap<String, String>) {
    if m.is_empty() {
        return;
    }
    out.push_str(title);
    out.push_str(":\n");
    let mut keys: Vec<_> = m.keys().collect();
    keys.sort();
    for k in keys {
        out.push_str(&format!("\t{k} -> {}\n", m[k]));
    }
}

fn ps_verbose(ctrs: &[Container], now: i128) -> String {
    let mut o = String::new();
    for ctr in ctrs {
        o.push_str(&format!("ID: {}\n", ctr.id));
        o.push_str(&format!("PodID: {}\n", ctr.pod_sandbox_id));
        o.push_str(&format!(
            "Namespace: {}\n",
            label_or_unknown(&ctr.labels, POD_NAMESPACE_LABEL)
        ));
        if let Some(md) = &ctr.metadata {
            if !md.name.is_empty() {
                o.push_str(&format!("Name: {}\n", md.name));
            }
            o.push_str(&format!("Attempt: {}\n", md.attempt));
        }
        o.push_str(&format!("State: {}\n", container_state(ctr.state)));
        if let Some(i) = &ctr.image {
            o.push_str(&format!("Image: {}\n", i.image));
        }
        o.push_str(&format!("Created: {}\n", ago(ctr.created_at, now)));
        labelled(&mut o, "Labels", &ctr.labels);
        labelled(&mut o, "Annotations", &ctr.annotations);
        o.push('\n');
    }
    o
}

pub async fn ps(c: &Clients, a: PsArgs, out: &mut (dyn Write + Send)) -> Result<(), CrictlError> {
    let output = Output::parse(a.output.as_deref(), Output::Table)?;
    let ctrs = list(
        c,
        &ListOpts {
            id: a.id.clone(),
            pod: a.pod.clone(),
            name: a.name.clone(),
            namespace: a.namespace.clone(),
            image: a.image.clone(),
            state: a.state.clone(),
            labels: a.label.clone(),
            all: a.all,
            latest: a.latest,
            last: a.last,
        },
    )
    .await?;
    if output != Output::Table {
        let resp = cri::runtime::v1::ListContainersResponse { containers: ctrs };
        return crate::format::write_message(
            out,
            output,
            "runtime.v1.ListContainersResponse",
            &resp,
        )
        .map_err(io);
    }
    if a.quiet {
        for ctr in &ctrs {
            writeln!(out, "{}", ctr.id).map_err(io)?;
        }
        return Ok(());
    }
    let now = now_ns();
    if a.verbose {
        return write!(out, "{}", ps_verbose(&ctrs, now)).map_err(io);
    }
    let mut rows = Vec::new();
    for ctr in ctrs {
        let mut image = ctr.image.clone().unwrap_or_default().image;
        if !a.no_trunc {
            image = truncate_image(&image);
        }
        if a.resolve_image_path {
            let st = c
                .image
                .clone()
                .image_status(ImageStatusRequest {
                    image: Some(ImageSpec {
                        image: image.clone(),
                        ..Default::default()
                    }),
                    verbose: false,
                })
                .await
                .map_err(rpc("failed to fetch repo image"))?
                .into_inner();
            if let Some(tag) = st.image.and_then(|i| i.repo_tags.into_iter().next()) {
                image = tag;
            }
        }
        rows.push((ctr, image));
    }
    write!(out, "{}", ps_table(&rows, a.no_trunc, now)).map_err(io)
}

/// crictl's `marshalContainerStatus`: protobuf JSON with the three times as RFC 3339
/// (Go's zero time where the state says the event has not happened).
fn status_json(r: &ContainerStatusResponse) -> serde_json::Value {
    let Some(st) = &r.status else {
        return serde_json::Value::Null;
    };
    let mut v = proto_json("runtime.v1.ContainerStatus", st);
    let state = ContainerState::try_from(st.state).unwrap_or(ContainerState::ContainerUnknown);
    let started = if state != ContainerState::ContainerCreated {
        rfc3339_local(st.started_at)
    } else {
        GO_ZERO_TIME.into()
    };
    let finished = if state == ContainerState::ContainerExited
        || (state == ContainerState::ContainerUnknown && st.finished_at > 0)
    {
        rfc3339_local(st.finished_at)
    } else {
        GO_ZERO_TIME.into()
    };
    if let Some(obj) = v.as_object_mut() {
        obj.insert("createdAt".into(), rfc3339_local(st.created_at).into());
        obj.insert("startedAt".into(), started.into());
        obj.insert("finishedAt".into(), finished.into());
    }
    v
}

fn status_table(r: &ContainerStatusResponse, verbose: bool, now: i128) -> String {
    let st = r.status.clone().unwrap_or_default();
    let mut o = format!("ID: {}\n", st.id);
    if let Some(md) = &st.metadata {
        if !md.name.is_empty() {
            o.push_str(&format!("Name: {}\n", md.name));
        }
        if md.attempt != 0 {
            o.push_str(&format!("Attempt: {}\n", md.attempt));
        }
    }
    let state = ContainerState::try_from(st.state).unwrap_or(ContainerState::ContainerUnknown);
    o.push_str(&format!("State: {}\n", state.as_str_name()));
    o.push_str(&format!("Created: {}\n", ago(st.created_at, now)));
    if state != ContainerState::ContainerCreated {
        o.push_str(&format!("Started: {}\n", ago(st.started_at, now)));
    }
    if state == ContainerState::ContainerExited {
        if st.finished_at > 0 {
            o.push_str(&format!("Finished: {}\n", ago(st.finished_at, now)));
        }
        o.push_str(&format!("Exit Code: {}\n", st.exit_code));
    }
    labelled(&mut o, "Labels", &st.labels);
    labelled(&mut o, "Annotations", &st.annotations);
    if verbose {
        o.push_str(&format!("Info: {}\n", go_map(&r.info)));
    }
    o
}

pub async fn inspect(
    c: &Clients,
    a: InspectArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    if a.template.is_some() {
        return Err(CrictlError::Usage(
            "--template is not supported: nodus crictl prints json, yaml or table".into(),
        ));
    }
    let output = Output::parse(a.output.as_deref(), Output::Json)?;
    let mut ids = a.containers.clone();
    if ids.is_empty() {
        ids = list(
            c,
            &ListOpts {
                pod: a.pod.clone(),
                name: a.name.clone(),
                namespace: a.namespace.clone(),
                image: a.image.clone(),
                state: a.state.clone(),
                labels: a.label.clone(),
                all: a.all,
                latest: a.latest,
                last: a.last,
                ..Default::default()
            },
        )
        .await?
        .into_iter()
        .map(|c| c.id)
        .collect();
    }
    if ids.is_empty() {
        return Err(CrictlError::Usage(
            "No IDs provided or nothing found per filter".into(),
        ));
    }
    let verbose = !a.quiet;
    let now = now_ns();
    let mut statuses = Vec::new();
    for id in &ids {
        let r = container_status(c, id, verbose).await.map_err(|e| {
            CrictlError::Other(format!(
                "get the status of containers: get container status: {e}"
            ))
        })?;
        if output == Output::Table {
            write!(out, "{}", status_table(&r, verbose, now)).map_err(io)?;
        } else {
            statuses.push(status_with_info(status_json(&r), &r.info));
        }
    }
    if statuses.is_empty() {
        return Ok(());
    }
    crate::format::write_value(out, output, &one_or_array(statuses)).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cri::runtime::v1::ContainerMetadata;

    fn ctr(id: &str, image: &str, created: i64, labels: &[(&str, &str)]) -> Container {
        Container {
            id: id.into(),
            pod_sandbox_id: "fedcba9876543210".into(),
            metadata: Some(ContainerMetadata {
                name: "main".into(),
                attempt: 1,
            }),
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            state: ContainerState::ContainerRunning as i32,
            created_at: created,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn ps_table_columns_and_truncation() {
        let now = 1_700_000_030_000_000_000i128;
        let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
        let c1 = ctr(
            "0123456789abcdef0123",
            &digest,
            1_700_000_000_000_000_000,
            &[(POD_NAME_LABEL, "web"), (POD_NAMESPACE_LABEL, "default")],
        );
        let rows = vec![(c1.clone(), truncate_image(&digest))];
        let t = ps_table(&rows, false, now);
        let lines: Vec<&str> = t.lines().collect();
        let header: Vec<&str> = lines[0]
            .split("  ")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        assert_eq!(
            header,
            [
                "CONTAINER",
                "IMAGE",
                "CREATED",
                "STATE",
                "NAME",
                "ATTEMPT",
                "POD ID",
                "POD",
                "NAMESPACE"
            ]
        );
        assert_eq!(
            lines[1],
            "0123456789abc       0123456789abc       30 seconds ago      Running             main                1                   fedcba9876543       web                 default"
        );
        let c2 = ctr(
            "0123456789abcdef0123",
            "busybox",
            1_700_000_000_000_000_000,
            &[],
        );
        let t = ps_table(&[(c2, "busybox".into())], true, now);
        let row: Vec<&str> = t.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            row,
            [
                "0123456789abcdef0123",
                "busybox",
                "30",
                "seconds",
                "ago",
                "Running",
                "main",
                "1",
                "fedcba9876543210",
                "unknown",
                "unknown"
            ]
        );
        let v = ps_verbose(&[c1], now);
        assert!(
            v.starts_with("ID: 0123456789abcdef0123\nPodID: fedcba9876543210\nNamespace: default\nName: main\nAttempt: 1\nState: Running\n"),
            "{v}"
        );
    }

    #[test]
    fn state_filters() {
        let f = |state: Option<&str>, all: bool, latest: bool| {
            state_filter(&ListOpts {
                state: state.map(String::from),
                all,
                latest,
                ..Default::default()
            })
        };
        assert_eq!(f(None, false, false).unwrap().unwrap().state, 1);
        assert!(f(None, true, false).unwrap().is_none());
        assert_eq!(f(Some("Exited"), true, false).unwrap().unwrap().state, 2);
        assert!(f(Some("running"), false, true).unwrap().is_none());
        assert!(f(Some("paused"), false, false).is_err());
    }

    #[test]
    fn status_json_times() {
        let r = ContainerStatusResponse {
            status: Some(cri::runtime::v1::ContainerStatus {
                id: "x".into(),
                state: ContainerState::ContainerCreated as i32,
                created_at: 1_700_000_000_000_000_000,
                ..Default::default()
            }),
            info: HashMap::new(),
        };
        let v = status_json(&r);
        assert_eq!(v["startedAt"], GO_ZERO_TIME);
        assert_eq!(v["finishedAt"], GO_ZERO_TIME);
        assert_eq!(v["state"], "CONTAINER_CREATED");
        assert!(v["createdAt"].as_str().unwrap().starts_with("2023-11-1"));
        let t = status_table(&r, true, 1_700_000_005_000_000_000);
        assert_eq!(
            t,
            "ID: x\nState: CONTAINER_CREATED\nCreated: 5 seconds ago\nInfo: map[]\n"
        );
    }

    #[test]
    fn log_rotations_are_found() {
        let d = std::env::temp_dir().join(format!("nodus-crictl-rm-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        for f in ["0.log", "0.log.1", "0.log.20240101.gz", "1.log"] {
            std::fs::write(d.join(f), "x").unwrap();
        }
        let files = log_files(&d.join("0.log").display().to_string());
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["0.log.1", "0.log.20240101.gz", "0.log"]);
        let _ = std::fs::remove_dir_all(d);
    }
}
