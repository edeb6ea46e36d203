//! One connected NRI plugin, as the runtime sees it: its connection (the mux's two ttrpc
//! connections), its name and index, the events it subscribed to, and — for a pre-installed
//! plugin — the process the runtime started. Registration and configuration follow
//! containerd/nri: the plugin calls `Runtime.RegisterPlugin` within the registration
//! timeout, then the runtime calls `Plugin.Configure` and learns the plugin's event mask.

use super::config::NriOptions;
use super::ttrpc::{self, CallError, Client};
use cri::nri as api;
use prost::Message as _;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::net::UnixStream;

pub(crate) const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
pub(crate) const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
/// The containerd/nri API version this runtime speaks.
pub(crate) const NRI_VERSION: &str = "v0.10.0";

/// Every event a plugin may subscribe to (upstream's ValidEvents).
pub(crate) const VALID_EVENTS: i32 = (1 << (api::Event::Last as i32 - 1)) - 1;

/// The bit of `event` in an event mask.
pub fn bit(event: api::Event) -> i32 {
    1 << (event as i32 - 1)
}

/// An event's method on the plugin service.
pub fn method(event: api::Event) -> &'static str {
    use api::Event as E;
    match event {
        E::RunPodSandbox => "RunPodSandbox",
        E::StopPodSandbox => "StopPodSandbox",
        E::RemovePodSandbox => "RemovePodSandbox",
        E::CreateContainer => "CreateContainer",
        E::PostCreateContainer => "PostCreateContainer",
        E::StartContainer => "StartContainer",
        E::PostStartContainer => "PostStartContainer",
        E::UpdateContainer => "UpdateContainer",
        E::PostUpdateContainer => "PostUpdateContainer",
        E::StopContainer => "StopContainer",
        E::RemoveContainer => "RemoveContainer",
        E::UpdatePodSandbox => "UpdatePodSandbox",
        E::PostUpdatePodSandbox => "PostUpdatePodSandbox",
        E::ValidateContainerAdjustment => "ValidateContainerAdjustment",
        E::Unknown | E::Last => "StateChange",
    }
}

/// containerd/nri's CheckPluginIndex: two digits.
pub(crate) fn check_index(idx: &str) -> Result<(), String> {
    if idx.len() != 2 || !idx.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("invalid plugin index {idx:?}, must be 2 digits"));
    }
    Ok(())
}

/// containerd/nri's CheckPluginName: letters, digits, `-_.+`.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("invalid plugin name: name is empty".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.+".contains(*c)))
    {
        return Err(format!(
            "invalid plugin name {name:?}: contains invalid character {c:?}"
        ));
    }
    Ok(())
}

/// How a plugin came to be connected.
pub(crate) enum Origin {
    /// Connected to the NRI socket on its own.
    External,
    /// Started by the runtime from the plugin directory, with its index, name and config.
    Launched {
        idx: String,
        base: String,
        config: String,
        child: Box<tokio::process::Child>,
    },
}

pub(crate) struct Plugin {
    pub(crate) idx: String,
    pub(crate) base: String,
    pub(crate) events: i32,
    pub(crate) pid: Option<i32>,
    client: Client,
    child: Mutex<Option<tokio::process::Child>>,
}

impl Plugin {
    pub(crate) fn name(&self) -> String {
        format!("{}-{}", self.idx, self.base)
    }

    pub(crate) fn subscribed(&self, event: api::Event) -> bool {
        self.events & bit(event) != 0
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    pub(crate) async fn closed(&self) {
        self.client.closed().await
    }

    pub(crate) async fn call<Q: prost::Message, A: prost::Message + Default>(
        &self,
        method: &str,
        req: &Q,
        timeout: Duration,
    ) -> Result<A, CallError> {
        self.client.call(PLUGIN_SERVICE, method, req, timeout).await
    }

    /// Disconnects the plugin and, when the runtime started it, kills it.
    pub(crate) async fn stop(&self) {
        self.client.close().await;
        let child = self.child.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut c) = child {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }
}

/// What the runtime service answers a plugin: its UpdateContainers requests.
pub(crate) trait RuntimeService: Send + Sync + 'static {
    fn update_containers(
        self: Arc<Self>,
        plugin: String,
        req: api::UpdateContainersRequest,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = api::UpdateContainersResponse> + Send>>;
}

/// The configuration file of plugin `idx-base`: `<idx>-<base>.conf`, else `<base>.conf`.
pub(crate) fn plugin_config(
    dir: &std::path::Path,
    idx: &str,
    base: &str,
) -> Result<String, String> {
    for f in [format!("{idx}-{base}.conf"), format!("{base}.conf")] {
        match std::fs::read_to_string(dir.join(&f)) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(format!(
                    "failed to read configuration for plugin \"{idx}-{base}\": {e}"
                ));
            }
        }
    }
    Ok(String::new())
}

/// Sets up a plugin connection: serves the runtime service, waits for the plugin's
/// registration and configures it.
pub(crate) async fn connect<R: RuntimeService>(
    stream: UnixStream,
    origin: Origin,
    opts: &NriOptions,
    runtime: Weak<R>,
) -> Result<Plugin, String> {
    let pid = stream.peer_cred().ok().and_then(|c| c.pid());
    let (plugin_conn, runtime_conn, demux) = super::mux::split(stream);
    let (client, answers) = Client::new(plugin_conn);
    let (reg_tx, reg_rx) = tokio::sync::oneshot::channel::<api::RegisterPluginRequest>();
    let reg_tx = Arc::new(Mutex::new(Some(reg_tx)));
    let name_slot: Arc<Mutex<String>> = Default::default();
    let handler: ttrpc::Handler = {
        let name_slot = Arc::clone(&name_slot);
        Arc::new(move |service, method, payload| {
            let (reg_tx, runtime, name_slot) =
                (Arc::clone(&reg_tx), runtime.clone(), Arc::clone(&name_slot));
            Box::pin(async move {
                if service != RUNTIME_SERVICE {
                    return Err((
                        tonic::Code::Unimplemented,
                        format!("unknown service {service}"),
                    ));
                }
                match method.as_str() {
                    "RegisterPlugin" => {
                        let req: api::RegisterPluginRequest = ttrpc::decode(payload)?;
                        let tx = reg_tx.lock().unwrap_or_else(|p| p.into_inner()).take();
                        match tx {
                            Some(tx) => {
                                let _ = tx.send(req);
                                Ok(api::Empty {}.encode_to_vec())
                            }
                            None => Err((
                                tonic::Code::AlreadyExists,
                                "plugin already registered".to_string(),
                            )),
                        }
                    }
                    "UpdateContainers" => {
                        let req: api::UpdateContainersRequest = ttrpc::decode(payload)?;
                        let Some(rt) = runtime.upgrade() else {
                            return Err((tonic::Code::Unavailable, "runtime stopping".into()));
                        };
                        let name = name_slot.lock().unwrap_or_else(|p| p.into_inner()).clone();
                        Ok(rt.update_containers(name, req).await.encode_to_vec())
                    }
                    m => Err((
                        tonic::Code::Unimplemented,
                        format!("{RUNTIME_SERVICE}.{m} is not implemented"),
                    )),
                }
            })
        })
    };
    demux.start(answers, ttrpc::serve(runtime_conn, handler));

    let reg = tokio::select! {
        r = tokio::time::timeout(opts.registration_timeout, reg_rx) => match r {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => return Err("failed to register plugin, connection closed".into()),
            Err(_) => {
                client.close().await;
                return Err("plugin registration timed out".into());
            }
        },
        _ = client.closed() => return Err("failed to register plugin, connection closed".into()),
    };
    let (idx, base, config, child) = match origin {
        Origin::External => {
            let check = check_name(&reg.plugin_name)
                .map_err(|e| format!("plugin registered with an invalid name: {e}"))
                .and_then(|_| {
                    check_index(&reg.plugin_idx).map_err(|e| {
                        format!(
                            "plugin {:?} registered with an invalid index: {e}",
                            reg.plugin_name
                        )
                    })
                });
            if let Err(e) = check {
                client.close().await;
                return Err(e);
            }
            (reg.plugin_idx, reg.plugin_name, String::new(), None)
        }
        Origin::Launched {
            idx,
            base,
            config,
            child,
        } => (idx, base, config, Some(*child)),
    };
    *name_slot.lock().unwrap_or_else(|p| p.into_inner()) = format!("{idx}-{base}");
    let configure = api::ConfigureRequest {
        config,
        runtime_name: "nodus".into(),
        runtime_version: env!("CARGO_PKG_VERSION").into(),
        registration_timeout: opts.registration_timeout.as_millis() as i64,
        request_timeout: opts.request_timeout.as_millis() as i64,
        nri_version: NRI_VERSION.into(),
    };
    let plugin = Plugin {
        idx,
        base,
        events: 0,
        pid,
        client,
        child: Mutex::new(child),
    };
    let answer: Result<api::ConfigureResponse, _> = plugin
        .call("Configure", &configure, opts.request_timeout)
        .await;
    let events = match answer {
        Ok(a) if a.events == 0 => VALID_EVENTS,
        Ok(a) if a.events & !VALID_EVENTS != 0 => {
            plugin.stop().await;
            return Err(format!(
                "invalid plugin events: 0x{:x}",
                a.events & !VALID_EVENTS
            ));
        }
        Ok(a) => a.events,
        Err(e) => {
            plugin.stop().await;
            return Err(format!("failed to configure plugin: {e}"));
        }
    };
    Ok(Plugin { events, ..plugin })
}

/// A runtime service that refuses plugins' updates (for [`measure_round_trips`]).
struct NoUpdates;

impl RuntimeService for NoUpdates {
    fn update_containers(
        self: Arc<Self>,
        _plugin: String,
        req: api::UpdateContainersRequest,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = api::UpdateContainersResponse> + Send>>
    {
        Box::pin(async move { api::UpdateContainersResponse { failed: req.update } })
    }
}

/// For the benchmark: registers and configures the plugin connected on `stream` as the
/// runtime does, then times `n` runs of `events` (container events, one round trip each,
/// carrying `container`) — the raw cost of the events, without the runtime's work around
/// them.
pub async fn measure_round_trips(
    stream: UnixStream,
    opts: &NriOptions,
    pod: api::PodSandbox,
    container: api::Container,
    events: &[api::Event],
    n: usize,
) -> Result<Vec<Duration>, String> {
    let keep = Arc::new(NoUpdates);
    let p = connect(stream, Origin::External, opts, Arc::downgrade(&keep)).await?;
    let req = api::ContainerRequest {
        pod: Some(pod),
        container: Some(container),
    };
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = std::time::Instant::now();
        for e in events {
            // Every answer decodes as Empty (unknown fields are skipped).
            let _: api::Empty = p
                .call(method(*e), &req, opts.request_timeout)
                .await
                .map_err(|e| e.to_string())?;
        }
        out.push(t.elapsed());
    }
    p.stop().await;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(registration: Duration) -> NriOptions {
        NriOptions {
            socket: "/nonexistent".into(),
            plugin_path: "/nonexistent".into(),
            plugin_config_path: "/nonexistent".into(),
            registration_timeout: registration,
            request_timeout: Duration::from_secs(5),
        }
    }

    /// A stub plugin answering Configure with `events` and every event with an empty reply.
    fn stub_handler(events: i32) -> super::super::stub::Handler {
        use super::super::stub::{Reply, Request};
        Arc::new(move |req| {
            Box::pin(async move {
                Ok(match req {
                    Request::Configure(_) => Reply::Configure(api::ConfigureResponse { events }),
                    _ => Reply::Empty,
                })
            })
        })
    }

    #[tokio::test]
    async fn a_stub_plugin_registers_is_configured_and_answers_events() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let keep = Arc::new(NoUpdates);
        let o = opts(Duration::from_secs(5));
        let mask = bit(api::Event::CreateContainer) | bit(api::Event::StartContainer);
        let (p, stub) = tokio::join!(
            connect(ours, Origin::External, &o, Arc::downgrade(&keep)),
            super::super::stub::Stub::start(theirs, "demo", "07", stub_handler(mask))
        );
        let (p, _stub) = (p.unwrap(), stub.unwrap());
        assert_eq!(p.name(), "07-demo");
        assert!(p.subscribed(api::Event::CreateContainer));
        assert!(!p.subscribed(api::Event::RunPodSandbox));
        let _: api::Empty = p
            .call(
                "PostCreateContainer",
                &api::ContainerRequest::default(),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        // The runtime disconnecting ends the plugin's side too.
        p.stop().await;
        tokio::time::timeout(Duration::from_secs(5), _stub.closed())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn bad_event_masks_names_and_silent_plugins_are_refused() {
        let keep = Arc::new(NoUpdates);
        let o = opts(Duration::from_secs(5));
        // Events beyond the valid ones.
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (p, _s) = tokio::join!(
            connect(ours, Origin::External, &o, Arc::downgrade(&keep)),
            super::super::stub::Stub::start(theirs, "demo", "07", stub_handler(1 << 20))
        );
        assert_eq!(p.err().unwrap(), "invalid plugin events: 0x100000");
        // An index that is not two digits.
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (p, _s) = tokio::join!(
            connect(ours, Origin::External, &o, Arc::downgrade(&keep)),
            super::super::stub::Stub::start(theirs, "demo", "7", stub_handler(0))
        );
        assert!(p.err().unwrap().contains("invalid plugin index \"7\""));
        // A peer that never registers.
        let (ours, _silent) = UnixStream::pair().unwrap();
        let p = connect(
            ours,
            Origin::External,
            &opts(Duration::from_millis(100)),
            Arc::downgrade(&keep),
        )
        .await;
        assert_eq!(p.err().unwrap(), "plugin registration timed out");
    }

    #[test]
    fn names_indices_and_event_bits_as_upstream() {
        assert!(check_index("05").is_ok());
        assert_eq!(
            check_index("5").unwrap_err(),
            "invalid plugin index \"5\", must be 2 digits"
        );
        assert!(check_name("my-plugin_1.0+x").is_ok());
        assert!(check_name("bad/name").unwrap_err().contains("'/'"));
        assert_eq!(bit(api::Event::RunPodSandbox), 1);
        assert_eq!(bit(api::Event::CreateContainer), 1 << 3);
        assert_eq!(VALID_EVENTS, 0x3fff);
    }
}
