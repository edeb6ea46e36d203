//! `nodus nri-plugin`: a small NRI plugin, an example of the plugin side and the tests'
//! plugin. It connects to the runtime's NRI socket (or uses the socket it was started with,
//! as a pre-installed plugin), and at CreateContainer injects environment variables,
//! devices, mounts and annotations; it can log every event it sees (JSON lines), fail or
//! delay a given event, and ask the runtime to update or evict a container once it started.

use clap::Args;
use cri::nri as api;
use nodus_runtime::nri::stub::{self, Reply, Request, Stub};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

#[derive(Debug, Args)]
pub struct NriPluginArgs {
    /// The runtime's NRI socket (unused when started by the runtime: NRI_PLUGIN_SOCKET).
    #[arg(long, default_value = "/var/run/nri/nri.sock")]
    socket: PathBuf,
    /// Plugin name [default: NRI_PLUGIN_NAME, else nodus-example].
    #[arg(long)]
    name: Option<String>,
    /// Plugin index, two digits; plugins are called in index order [default:
    /// NRI_PLUGIN_IDX, else 50].
    #[arg(long)]
    idx: Option<String>,
    /// Events to subscribe to, comma-separated (RunPodSandbox, CreateContainer, ...) or `all`.
    #[arg(long, default_value = "all")]
    events: String,
    /// An environment variable to inject into every container (KEY=VALUE; repeatable).
    #[arg(long = "inject-env", value_name = "KEY=VALUE")]
    inject_env: Vec<String>,
    /// A host device node to inject into every container (repeatable).
    #[arg(long = "inject-device", value_name = "PATH")]
    inject_device: Vec<PathBuf>,
    /// A read-only bind mount to inject into every container (SOURCE:DESTINATION).
    #[arg(long = "inject-mount", value_name = "SOURCE:DESTINATION")]
    inject_mount: Vec<String>,
    /// An annotation to set on every container (KEY=VALUE; repeatable).
    #[arg(long = "annotate", value_name = "KEY=VALUE")]
    annotate: Vec<String>,
    /// Answer this event with an error (repeatable).
    #[arg(long = "fail-on", value_name = "EVENT")]
    fail_on: Vec<String>,
    /// Answer this event only after a delay (EVENT=DURATION, e.g. CreateContainer=3s).
    #[arg(long = "delay-on", value_name = "EVENT=DURATION")]
    delay_on: Vec<String>,
    /// Append one JSON line per request received to this file.
    #[arg(long = "event-log")]
    event_log: Option<PathBuf>,
    /// Once container NAME has started, ask the runtime to evict it.
    #[arg(long = "evict-on-start", value_name = "NAME")]
    evict_on_start: Option<String>,
    /// Once container NAME has started, ask the runtime to set its memory limit
    /// (NAME=BYTES).
    #[arg(long = "update-memory-on-start", value_name = "NAME=BYTES")]
    update_memory_on_start: Option<String>,
}

struct Plugin {
    args: NriPluginArgs,
    events: i32,
    env: Vec<api::KeyValue>,
    devices: Vec<api::LinuxDevice>,
    mounts: Vec<api::Mount>,
    annotations: std::collections::HashMap<String, String>,
    fail_on: Vec<String>,
    delay_on: Vec<(String, Duration)>,
    log: Option<Mutex<std::fs::File>>,
    stub: OnceLock<Arc<Stub>>,
}

fn event_name(e: api::Event) -> &'static str {
    stub::method(e)
}

fn parse_events(s: &str) -> anyhow::Result<i32> {
    let mut mask = 0;
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if name.eq_ignore_ascii_case("all") {
            return Ok(0);
        }
        let e = (1..api::Event::Last as i32)
            .filter_map(|n| api::Event::try_from(n).ok())
            .find(|e| event_name(*e).eq_ignore_ascii_case(name))
            .ok_or_else(|| anyhow::anyhow!("unknown NRI event {name:?}"))?;
        mask |= stub::bit(e);
    }
    Ok(mask)
}

fn key_value(s: &str, what: &str) -> anyhow::Result<(String, String)> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| anyhow::anyhow!("{what} {s:?}: expected KEY=VALUE"))
}

/// The NRI device entry of a host device node.
fn device(path: &std::path::Path) -> anyhow::Result<api::LinuxDevice> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let md =
        std::fs::metadata(path).map_err(|e| anyhow::anyhow!("device {}: {e}", path.display()))?;
    let kind = if md.file_type().is_char_device() {
        "c"
    } else if md.file_type().is_block_device() {
        "b"
    } else {
        anyhow::bail!("{} is not a device node", path.display());
    };
    let rdev = md.rdev();
    Ok(api::LinuxDevice {
        path: path.display().to_string(),
        r#type: kind.into(),
        major: libc::major(rdev) as i64,
        minor: libc::minor(rdev) as i64,
        file_mode: Some(api::OptionalFileMode {
            value: md.mode() & 0o777,
        }),
        uid: None,
        gid: None,
    })
}

fn pod_json(p: &api::PodSandbox) -> serde_json::Value {
    let linux = p.linux.clone().unwrap_or_default();
    serde_json::json!({
        "id": p.id, "name": p.name, "namespace": p.namespace, "uid": p.uid,
        "labels": p.labels, "annotations": p.annotations, "pid": p.pid,
        "runtime_handler": p.runtime_handler, "ips": p.ips,
        "cgroup_parent": linux.cgroup_parent,
        "namespaces": linux.namespaces.iter().map(|n| serde_json::json!({"type": n.r#type, "path": n.path})).collect::<Vec<_>>(),
    })
}

fn container_json(c: &api::Container) -> serde_json::Value {
    let linux = c.linux.clone().unwrap_or_default();
    serde_json::json!({
        "id": c.id, "name": c.name, "pod_sandbox_id": c.pod_sandbox_id, "state": c.state,
        "labels": c.labels, "annotations": c.annotations, "pid": c.pid, "args": c.args,
        "env": c.env, "cgroups_path": linux.cgroups_path,
        "namespaces": linux.namespaces.iter().map(|n| serde_json::json!({"type": n.r#type, "path": n.path})).collect::<Vec<_>>(),
    })
}

impl Plugin {
    fn record(&self, line: serde_json::Value) {
        if let Some(f) = &self.log {
            // One write per event: JSON's Display writes piece by piece, and on an
            // unbuffered file that was a hundred system calls in every event's round trip.
            let mut text = line.to_string();
            text.push('\n');
            let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
            let _ = f.write_all(text.as_bytes());
        }
    }

    async fn handle(self: Arc<Self>, req: Request) -> Result<Reply, String> {
        let (event, line) = match &req {
            Request::Configure(c) => (
                "Configure",
                serde_json::json!({"event": "Configure", "config": c.config, "runtime": c.runtime_name}),
            ),
            Request::Synchronize(s) => (
                "Synchronize",
                serde_json::json!({"event": "Synchronize",
                    "pods": s.pods.iter().map(pod_json).collect::<Vec<_>>(),
                    "containers": s.containers.iter().map(container_json).collect::<Vec<_>>()}),
            ),
            Request::Pod(e, p) => (
                event_name(*e),
                serde_json::json!({"event": event_name(*e), "pod": pod_json(p)}),
            ),
            Request::Container(e, r) => (
                event_name(*e),
                serde_json::json!({"event": event_name(*e),
                    "pod": pod_json(&r.pod.clone().unwrap_or_default()),
                    "container": container_json(&r.container.clone().unwrap_or_default())}),
            ),
            Request::UpdateContainer(r) => (
                "UpdateContainer",
                serde_json::json!({"event": "UpdateContainer",
                    "pod": pod_json(&r.pod.clone().unwrap_or_default()),
                    "container": container_json(&r.container.clone().unwrap_or_default())}),
            ),
            Request::Shutdown => ("Shutdown", serde_json::json!({"event": "Shutdown"})),
        };
        self.record(line);
        if let Some((_, d)) = self
            .delay_on
            .iter()
            .find(|(e, _)| e.eq_ignore_ascii_case(event))
        {
            tokio::time::sleep(*d).await;
        }
        if self.fail_on.iter().any(|e| e.eq_ignore_ascii_case(event)) {
            return Err(format!("{event} refused by nri-plugin --fail-on"));
        }
        Ok(match req {
            Request::Configure(_) => Reply::Configure(api::ConfigureResponse {
                events: self.events,
            }),
            Request::Synchronize(_) => Reply::Synchronize(Default::default()),
            Request::Container(api::Event::CreateContainer, _) => {
                Reply::CreateContainer(Box::new(api::CreateContainerResponse {
                    adjust: Some(api::ContainerAdjustment {
                        annotations: self.annotations.clone(),
                        env: self.env.clone(),
                        mounts: self.mounts.clone(),
                        linux: (!self.devices.is_empty()).then(|| api::LinuxContainerAdjustment {
                            devices: self.devices.clone(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }))
            }
            Request::Container(api::Event::PostStartContainer, r) => {
                self.after_start(r.container.unwrap_or_default());
                Reply::Empty
            }
            Request::Container(api::Event::StopContainer, _) => {
                Reply::StopContainer(Default::default())
            }
            Request::UpdateContainer(_) => Reply::UpdateContainer(Default::default()),
            _ => Reply::Empty,
        })
    }

    /// Unsolicited updates and evictions go after the event's answer, as the runtime
    /// relays one event at a time.
    fn after_start(self: &Arc<Self>, c: api::Container) {
        let mut req = api::UpdateContainersRequest::default();
        if self.args.evict_on_start.as_deref() == Some(c.name.as_str()) {
            req.evict.push(api::ContainerEviction {
                container_id: c.id.clone(),
                reason: "evicted by nri-plugin --evict-on-start".into(),
            });
        }
        if let Some((name, bytes)) = self
            .args
            .update_memory_on_start
            .as_deref()
            .and_then(|s| s.split_once('='))
            && name == c.name
            && let Ok(bytes) = bytes.parse::<i64>()
        {
            req.update.push(api::ContainerUpdate {
                container_id: c.id.clone(),
                linux: Some(api::LinuxContainerUpdate {
                    resources: Some(api::LinuxResources {
                        memory: Some(api::LinuxMemory {
                            limit: Some(api::OptionalInt64 { value: bytes }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                }),
                ignore_failure: false,
            });
        }
        if req.update.is_empty() && req.evict.is_empty() {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let Some(stub) = me.stub.get() else { return };
            let result = stub.update_containers(req).await;
            me.record(serde_json::json!({"event": "UpdateContainersDone", "container": c.name, "result": format!("{result:?}")}));
        });
    }
}

pub async fn run(args: NriPluginArgs) -> anyhow::Result<()> {
    let name = args
        .name
        .clone()
        .or_else(|| std::env::var("NRI_PLUGIN_NAME").ok())
        .unwrap_or_else(|| "nodus-example".into());
    let idx = args
        .idx
        .clone()
        .or_else(|| std::env::var("NRI_PLUGIN_IDX").ok())
        .unwrap_or_else(|| "50".into());
    let events = parse_events(&args.events)?;
    let env = args
        .inject_env
        .iter()
        .map(|s| key_value(s, "--inject-env").map(|(key, value)| api::KeyValue { key, value }))
        .collect::<anyhow::Result<_>>()?;
    let annotations = args
        .annotate
        .iter()
        .map(|s| key_value(s, "--annotate"))
        .collect::<anyhow::Result<_>>()?;
    let devices = args
        .inject_device
        .iter()
        .map(|p| device(p))
        .collect::<anyhow::Result<_>>()?;
    let mounts = args
        .inject_mount
        .iter()
        .map(|s| {
            let (src, dst) = s.split_once(':').ok_or_else(|| {
                anyhow::anyhow!("--inject-mount {s:?}: expected SOURCE:DESTINATION")
            })?;
            Ok(api::Mount {
                destination: dst.into(),
                r#type: "bind".into(),
                source: src.into(),
                options: vec!["rbind".into(), "ro".into()],
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let delay_on = args
        .delay_on
        .iter()
        .map(|s| {
            let (e, d) = key_value(s, "--delay-on")?;
            let d = nodus_k8s::duration::parse_duration(&d).map_err(anyhow::Error::msg)?;
            Ok((e, d))
        })
        .collect::<anyhow::Result<_>>()?;
    let log = match &args.event_log {
        Some(p) => Some(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| anyhow::anyhow!("opening {}: {e}", p.display()))?,
        )),
        None => None,
    };
    let plugin = Arc::new(Plugin {
        fail_on: args.fail_on.clone(),
        args,
        events,
        env,
        devices,
        mounts,
        annotations,
        delay_on,
        log,
        stub: OnceLock::new(),
    });
    let stream = stub::connect(&plugin.args.socket)
        .await
        .map_err(|e| anyhow::anyhow!("connecting to {}: {e}", plugin.args.socket.display()))?;
    let handler: stub::Handler = {
        let plugin = Arc::clone(&plugin);
        Arc::new(move |req| Box::pin(Arc::clone(&plugin).handle(req)))
    };
    let s = Arc::new(
        Stub::start(stream, &name, &idx, handler)
            .await
            .map_err(anyhow::Error::msg)?,
    );
    let _ = plugin.stub.set(Arc::clone(&s));
    tracing::info!(plugin = %format!("{idx}-{name}"), "registered with the runtime");
    s.closed().await;
    tracing::info!("the runtime closed the connection");
    Ok(())
}
