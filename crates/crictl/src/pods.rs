//! Pod commands: runp, stopp, rmp, pods, inspectp.

use crate::format::{Output, go_map, one_or_array, proto_json, status_with_info, table, trunc13};
use crate::timefmt::{ago, go_time_string, now_ns, rfc3339_local};
use crate::util::{aggregate, compile, io, matches, parse_labels, rpc_text, truncate_count};
use crate::{Clients, CrictlError, rpc};
use clap::Args;
use cri::runtime::v1::{
    ListPodSandboxRequest, PodSandbox, PodSandboxFilter, PodSandboxState, PodSandboxStateValue,
    PodSandboxStatusRequest, PodSandboxStatusResponse, RemovePodSandboxRequest,
    RunPodSandboxRequest, StopPodSandboxRequest,
};
use std::io::Write;
use std::time::Duration;

#[derive(Debug, Args, Clone)]
pub struct RunpArgs {
    /// Pod sandbox config file (JSON or YAML).
    #[arg(value_name = "POD_CONFIG")]
    pub config: String,
    /// Runtime handler to use. Available options are defined by the container runtime.
    #[arg(short, long)]
    pub runtime: Option<String>,
    /// Time to wait for the request to complete before cancelling it, e.g. 30s.
    #[arg(short = 'T', long, value_parser = crate::parse_duration)]
    pub cancel_timeout: Option<Duration>,
}

#[derive(Debug, Args, Clone)]
pub struct StoppArgs {
    #[arg(value_name = "POD-ID")]
    pub pods: Vec<String>,
}

#[derive(Debug, Args, Clone)]
pub struct RmpArgs {
    #[arg(value_name = "POD-ID")]
    pub pods: Vec<String>,
    /// Force removal of the pod sandbox, disregarding if running.
    #[arg(short, long)]
    pub force: bool,
    /// Remove all pods.
    #[arg(short, long)]
    pub all: bool,
}

#[derive(Debug, Args, Clone)]
pub struct PodsArgs {
    /// Filter by pod id.
    #[arg(long)]
    pub id: Option<String>,
    /// Filter by pod name regular expression pattern.
    #[arg(long)]
    pub name: Option<String>,
    /// Filter by pod namespace regular expression pattern.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Filter by pod state: ready or notready.
    #[arg(short, long)]
    pub state: Option<String>,
    /// Filter by key=value label.
    #[arg(long = "label")]
    pub label: Vec<String>,
    /// Show verbose info for pods.
    #[arg(short, long)]
    pub verbose: bool,
    /// List only pod IDs.
    #[arg(short, long)]
    pub quiet: bool,
    /// Output format: json, yaml or table.
    #[arg(short, long)]
    pub output: Option<String>,
    /// Show the most recently created pod.
    #[arg(short, long)]
    pub latest: bool,
    /// Show last n recently created pods. Set 0 for unlimited.
    #[arg(short = 'n', long, default_value_t = 0)]
    pub last: usize,
    /// Show output without truncating the ID.
    #[arg(long)]
    pub no_trunc: bool,
}

#[derive(Debug, Args, Clone)]
pub struct InspectpArgs {
    #[arg(value_name = "POD-ID")]
    pub pods: Vec<String>,
    /// Output format: json (default), yaml or table.
    #[arg(short, long)]
    pub output: Option<String>,
    /// Do not show verbose information.
    #[arg(short, long)]
    pub quiet: bool,
    /// Go templates are not supported by nodus crictl.
    #[arg(long, hide = true)]
    pub template: Option<String>,
    /// Filter by pod name regular expression pattern.
    #[arg(long)]
    pub name: Option<String>,
    /// Filter by pod namespace regular expression pattern.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Filter by pod state.
    #[arg(short, long)]
    pub state: Option<String>,
    /// Filter by key=value label.
    #[arg(long = "label")]
    pub label: Vec<String>,
    /// Show the most recently created pod.
    #[arg(short, long)]
    pub latest: bool,
    /// Show last n recently created pods.
    #[arg(short = 'n', long, default_value_t = 0)]
    pub last: usize,
}

pub async fn runp(
    c: &Clients,
    a: RunpArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    let config = crate::config::load_pod_config(&a.config)
        .map_err(|e| CrictlError::Other(format!("load podSandboxConfig: {e}")))?;
    let mut rt = c.runtime.clone();
    let req = RunPodSandboxRequest {
        config: Some(config),
        runtime_handler: a.runtime.unwrap_or_default(),
    };
    let id = crate::util::with_timeout(a.cancel_timeout, async move {
        rt.run_pod_sandbox(req)
            .await
            .map(|r| r.into_inner().pod_sandbox_id)
    })
    .await
    .map_err(rpc("run pod sandbox"))?;
    writeln!(out, "{id}").map_err(io)
}

async fn stop_one(c: &Clients, id: &str, out: &mut (dyn Write + Send)) -> Result<(), String> {
    c.runtime
        .clone()
        .stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        })
        .await
        .map_err(rpc_text)?;
    writeln!(out, "Stopped sandbox {id}").map_err(|e| e.to_string())
}

pub async fn stopp(
    c: &Clients,
    a: StoppArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    if a.pods.is_empty() {
        return Err(CrictlError::Usage("ID cannot be empty".into()));
    }
    for id in &a.pods {
        stop_one(c, id, out)
            .await
            .map_err(|e| CrictlError::Other(format!("stopping the pod sandbox {id:?}: {e}")))?;
    }
    Ok(())
}

pub async fn rmp(c: &Clients, a: RmpArgs, out: &mut (dyn Write + Send)) -> Result<(), CrictlError> {
    let mut ids = a.pods.clone();
    if a.all {
        ids = list_raw(c, PodSandboxFilter::default())
            .await?
            .into_iter()
            .map(|p| p.id)
            .collect();
        if ids.is_empty() {
            eprintln!("INFO[0000] No pods to remove");
            return Ok(());
        }
    }
    if ids.is_empty() {
        return Err(CrictlError::Usage("ID cannot be empty".into()));
    }
    let mut errors = Vec::new();
    for id in ids {
        let status = match pod_status(c, &id, false).await {
            Ok(s) => s,
            Err(e) => {
                errors.push(format!("getting sandbox status of pod {id:?}: {e}"));
                continue;
            }
        };
        let ready =
            status.status.as_ref().map(|s| s.state) == Some(PodSandboxState::SandboxReady as i32);
        if ready {
            if !a.force {
                errors.push(format!(
                    "pod sandbox {id:?} is running, please stop it first"
                ));
                continue;
            }
            if let Err(e) = stop_one(c, &id, out).await {
                errors.push(format!("stopping the pod sandbox {id:?} failed: {e}"));
                continue;
            }
        }
        match c
            .runtime
            .clone()
            .remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
        {
            Ok(_) => writeln!(out, "Removed sandbox {id}").map_err(io)?,
            Err(s) => errors.push(format!("removing the pod sandbox {id:?}: {}", rpc_text(s))),
        }
    }
    aggregate(errors)
}

async fn pod_status(
    c: &Clients,
    id: &str,
    verbose: bool,
) -> Result<PodSandboxStatusResponse, String> {
    c.runtime
        .clone()
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose,
        })
        .await
        .map(|r| r.into_inner())
        .map_err(rpc_text)
}

async fn list_raw(c: &Clients, filter: PodSandboxFilter) -> Result<Vec<PodSandbox>, CrictlError> {
    Ok(c.runtime
        .clone()
        .list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(filter),
        })
        .await
        .map_err(rpc("call list sandboxes RPC"))?
        .into_inner()
        .items)
}

fn state_filter(state: Option<&str>) -> Result<Option<PodSandboxStateValue>, CrictlError> {
    let Some(s) = state.filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let st = match s.to_ascii_lowercase().as_str() {
        "ready" => PodSandboxState::SandboxReady,
        "notready" => PodSandboxState::SandboxNotready,
        _ => {
            return Err(CrictlError::Usage(
                "--state should be ready or notready".into(),
            ));
        }
    };
    Ok(Some(PodSandboxStateValue { state: st as i32 }))
}

struct ListOpts<'a> {
    id: Option<&'a str>,
    name: Option<&'a str>,
    namespace: Option<&'a str>,
    state: Option<&'a str>,
    labels: &'a [String],
    latest: bool,
    last: usize,
}

/// crictl's `ListPodSandboxes`: server-side id/state/label filters, then name and namespace
/// regular expressions, newest first, `--latest`/`--last`.
async fn list(c: &Clients, o: ListOpts<'_>) -> Result<Vec<PodSandbox>, CrictlError> {
    let name = compile(o.name)?;
    let namespace = compile(o.namespace)?;
    let filter = PodSandboxFilter {
        id: o.id.unwrap_or_default().to_string(),
        state: state_filter(o.state)?,
        label_selector: parse_labels(o.labels)?,
    };
    let mut pods: Vec<PodSandbox> = list_raw(c, filter)
        .await?
        .into_iter()
        .filter(|p| {
            p.metadata
                .as_ref()
                .is_some_and(|m| matches(&name, &m.name) && matches(&namespace, &m.namespace))
        })
        .collect();
    pods.sort_by_key(|p| std::cmp::Reverse(p.created_at));
    truncate_count(&mut pods, o.latest, o.last);
    Ok(pods)
}

pub fn pod_state(state: i32) -> &'static str {
    match PodSandboxState::try_from(state) {
        Ok(PodSandboxState::SandboxReady) => "Ready",
        Ok(PodSandboxState::SandboxNotready) => "NotReady",
        Err(_) => "Unknown",
    }
}

fn runtime_handler(p: &PodSandbox) -> &str {
    if p.runtime_handler.is_empty() {
        "(default)"
    } else {
        &p.runtime_handler
    }
}

fn labelled(out: &mut String, title: &str, m: &std::collections::HashMap<String, String>) {
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

/// The `crictl pods` table for `pods` (already filtered and sorted).
pub fn pods_table(pods: &[PodSandbox], no_trunc: bool, now: i128) -> String {
    let mut rows = vec![
        [
            "POD ID",
            "CREATED",
            "STATE",
            "NAME",
            "NAMESPACE",
            "ATTEMPT",
            "RUNTIME",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for p in pods {
        let md = p.metadata.clone().unwrap_or_default();
        rows.push(vec![
            if no_trunc {
                p.id.clone()
            } else {
                trunc13(&p.id)
            },
            ago(p.created_at, now),
            pod_state(p.state).into(),
            md.name,
            md.namespace,
            md.attempt.to_string(),
            runtime_handler(p).into(),
        ]);
    }
    table(&rows)
}

fn pods_verbose(pods: &[PodSandbox]) -> String {
    let mut o = String::new();
    for p in pods {
        o.push_str(&format!("ID: {}\n", p.id));
        if let Some(md) = &p.metadata {
            if !md.name.is_empty() {
                o.push_str(&format!("Name: {}\n", md.name));
            }
            if !md.uid.is_empty() {
                o.push_str(&format!("UID: {}\n", md.uid));
            }
            if !md.namespace.is_empty() {
                o.push_str(&format!("Namespace: {}\n", md.namespace));
            }
            if md.attempt != 0 {
                o.push_str(&format!("Attempt: {}\n", md.attempt));
            }
        }
        o.push_str(&format!("Status: {}\n", pod_state(p.state)));
        o.push_str(&format!("Created: {}\n", go_time_string(p.created_at)));
        labelled(&mut o, "Labels", &p.labels);
        labelled(&mut o, "Annotations", &p.annotations);
        o.push_str(&format!("Runtime: {}\n\n", runtime_handler(p)));
    }
    o
}

pub async fn pods(
    c: &Clients,
    a: PodsArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    let output = Output::parse(a.output.as_deref(), Output::Table)?;
    let pods = list(
        c,
        ListOpts {
            id: a.id.as_deref(),
            name: a.name.as_deref(),
            namespace: a.namespace.as_deref(),
            state: a.state.as_deref(),
            labels: &a.label,
            latest: a.latest,
            last: a.last,
        },
    )
    .await?;
    if output != Output::Table {
        let resp = cri::runtime::v1::ListPodSandboxResponse { items: pods };
        return crate::format::write_message(
            out,
            output,
            "runtime.v1.ListPodSandboxResponse",
            &resp,
        )
        .map_err(io);
    }
    if a.quiet {
        for p in &pods {
            writeln!(out, "{}", p.id).map_err(io)?;
        }
        return Ok(());
    }
    let text = if a.verbose {
        pods_verbose(&pods)
    } else {
        pods_table(&pods, a.no_trunc, now_ns())
    };
    write!(out, "{text}").map_err(io)
}

/// crictl's `marshalPodSandboxStatus`: protobuf JSON with `createdAt` as RFC 3339.
fn status_json(r: &PodSandboxStatusResponse) -> serde_json::Value {
    let Some(st) = &r.status else {
        return serde_json::Value::Null;
    };
    let mut v = proto_json("runtime.v1.PodSandboxStatus", st);
    if let Some(obj) = v.as_object_mut() {
        obj.insert("createdAt".into(), rfc3339_local(st.created_at).into());
    }
    v
}

fn status_table(r: &PodSandboxStatusResponse, verbose: bool) -> String {
    let st = r.status.clone().unwrap_or_default();
    let mut o = format!("ID: {}\n", st.id);
    if let Some(md) = &st.metadata {
        if !md.name.is_empty() {
            o.push_str(&format!("Name: {}\n", md.name));
        }
        if !md.uid.is_empty() {
            o.push_str(&format!("UID: {}\n", md.uid));
        }
        if !md.namespace.is_empty() {
            o.push_str(&format!("Namespace: {}\n", md.namespace));
        }
        o.push_str(&format!("Attempt: {}\n", md.attempt));
    }
    let state = PodSandboxState::try_from(st.state)
        .map(|s| s.as_str_name().to_string())
        .unwrap_or_else(|_| st.state.to_string());
    o.push_str(&format!("Status: {state}\n"));
    o.push_str(&format!("Created: {}\n", go_time_string(st.created_at)));
    if let Some(n) = &st.network {
        o.push_str(&format!("IP Addresses: {}\n", n.ip));
        for ip in &n.additional_ips {
            o.push_str(&format!("Additional IP: {}\n", ip.ip));
        }
    }
    labelled(&mut o, "Labels", &st.labels);
    labelled(&mut o, "Annotations", &st.annotations);
    if verbose {
        o.push_str(&format!("Info: {}\n", go_map(&r.info)));
    }
    o
}

pub async fn inspectp(
    c: &Clients,
    a: InspectpArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    if a.template.is_some() {
        return Err(CrictlError::Usage(
            "--template is not supported: nodus crictl prints json, yaml or table".into(),
        ));
    }
    let output = Output::parse(a.output.as_deref(), Output::Json)?;
    let mut ids = a.pods.clone();
    if ids.is_empty() {
        ids = list(
            c,
            ListOpts {
                id: None,
                name: a.name.as_deref(),
                namespace: a.namespace.as_deref(),
                state: a.state.as_deref(),
                labels: &a.label,
                latest: a.latest,
                last: a.last,
            },
        )
        .await?
        .into_iter()
        .map(|p| p.id)
        .collect();
    }
    if ids.is_empty() {
        return Err(CrictlError::Usage(
            "No IDs provided or nothing found per filter".into(),
        ));
    }
    let verbose = !a.quiet;
    let mut statuses = Vec::new();
    for id in &ids {
        let r = pod_status(c, id, verbose).await.map_err(|e| {
            CrictlError::Other(format!(
                "get the status of pod sandboxes: get pod sandbox status: {e}"
            ))
        })?;
        if output == Output::Table {
            write!(out, "{}", status_table(&r, verbose)).map_err(io)?;
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
    use cri::runtime::v1::PodSandboxMetadata;

    #[test]
    fn pods_table_columns() {
        let now = 1_700_000_100_000_000_000i128;
        let pods = vec![PodSandbox {
            id: "0123456789abcdef".into(),
            metadata: Some(PodSandboxMetadata {
                name: "web".into(),
                uid: "u".into(),
                namespace: "default".into(),
                attempt: 2,
            }),
            state: PodSandboxState::SandboxReady as i32,
            created_at: 1_700_000_000_000_000_000,
            ..Default::default()
        }];
        let t = pods_table(&pods, false, now);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "POD ID              CREATED              STATE               NAME                NAMESPACE           ATTEMPT             RUNTIME"
        );
        assert_eq!(
            lines[1],
            "0123456789abc       About a minute ago   Ready               web                 default             2                   (default)"
        );
        assert!(pods_table(&pods, true, now).contains("0123456789abcdef "));
        let v = pods_verbose(&pods);
        assert!(v.starts_with("ID: 0123456789abcdef\nName: web\nUID: u\nNamespace: default\nAttempt: 2\nStatus: Ready\nCreated: "), "{v}");
        assert!(v.ends_with("Runtime: (default)\n\n"), "{v}");
    }

    #[test]
    fn state_filter_values() {
        assert_eq!(state_filter(Some("Ready")).unwrap().unwrap().state, 0);
        assert_eq!(state_filter(Some("notready")).unwrap().unwrap().state, 1);
        assert!(state_filter(Some("running")).is_err());
        assert!(state_filter(None).unwrap().is_none());
    }
}
