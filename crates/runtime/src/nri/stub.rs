//! The plugin side of NRI (containerd/nri's `stub`), for plugins written with nodus: connect
//! to the runtime's NRI socket (or use the socket a runtime started the plugin with, fd
//! `NRI_PLUGIN_SOCKET`), register, then answer the runtime's requests with a handler.

use super::mux;
use super::plugin::{PLUGIN_SERVICE, RUNTIME_SERVICE};
use super::ttrpc::{self, Client};
use cri::nri as api;
use prost::Message as _;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixStream;

pub use super::plugin::{bit, method};

/// A request from the runtime.
#[derive(Debug)]
pub enum Request {
    Configure(api::ConfigureRequest),
    Synchronize(Box<api::SynchronizeRequest>),
    /// RunPodSandbox, StopPodSandbox, RemovePodSandbox.
    Pod(api::Event, Box<api::PodSandbox>),
    /// The container events other than UpdateContainer.
    Container(api::Event, Box<api::ContainerRequest>),
    UpdateContainer(Box<api::UpdateContainerRequest>),
    Shutdown,
}

/// The plugin's answer; `Empty` for events plugins only hear about.
#[derive(Debug)]
pub enum Reply {
    Configure(api::ConfigureResponse),
    Synchronize(api::SynchronizeResponse),
    CreateContainer(Box<api::CreateContainerResponse>),
    UpdateContainer(api::UpdateContainerResponse),
    StopContainer(api::StopContainerResponse),
    Empty,
}

pub type Handler = Arc<
    dyn Fn(Request) -> Pin<Box<dyn Future<Output = Result<Reply, String>> + Send>> + Send + Sync,
>;

/// The connection a plugin uses: fd `NRI_PLUGIN_SOCKET` when a runtime started it, else
/// the NRI socket at `socket`.
pub async fn connect(socket: &Path) -> std::io::Result<UnixStream> {
    if let Some(fd) = std::env::var("NRI_PLUGIN_SOCKET")
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    {
        use std::os::fd::FromRawFd as _;
        // SAFETY: the runtime handed this fd to us for exactly this use, and nothing else
        // in the process owns it.
        let s = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
        s.set_nonblocking(true)?;
        return UnixStream::from_std(s);
    }
    UnixStream::connect(socket).await
}

fn event_of(method: &str) -> Option<api::Event> {
    (1..api::Event::Last as i32)
        .filter_map(|n| api::Event::try_from(n).ok())
        .find(|e| super::plugin::method(*e) == method)
}

/// A registered plugin's handle on the runtime.
pub struct Stub {
    runtime: Client,
}

impl Stub {
    /// Registers as `idx-name` on `stream` and serves the runtime's requests with
    /// `handler` in the background.
    pub async fn start(
        stream: UnixStream,
        name: &str,
        idx: &str,
        handler: Handler,
    ) -> Result<Stub, String> {
        let (plugin_conn, runtime_conn, demux) = mux::split(stream);
        let serve: ttrpc::Handler = Arc::new(move |service, method, payload| {
            let handler = Arc::clone(&handler);
            Box::pin(async move {
                if service != PLUGIN_SERVICE {
                    return Err((
                        tonic::Code::Unimplemented,
                        format!("unknown service {service}"),
                    ));
                }
                let req = match method.as_str() {
                    "Configure" => Request::Configure(ttrpc::decode(payload)?),
                    "Synchronize" => Request::Synchronize(Box::new(ttrpc::decode(payload)?)),
                    "Shutdown" => Request::Shutdown,
                    "UpdateContainer" => {
                        Request::UpdateContainer(Box::new(ttrpc::decode(payload)?))
                    }
                    m => match event_of(m) {
                        Some(
                            e @ (api::Event::RunPodSandbox
                            | api::Event::StopPodSandbox
                            | api::Event::RemovePodSandbox),
                        ) => {
                            let r: api::PodSandboxRequest = ttrpc::decode(payload)?;
                            Request::Pod(e, Box::new(r.pod.unwrap_or_default()))
                        }
                        Some(e) => Request::Container(e, Box::new(ttrpc::decode(payload)?)),
                        None => {
                            return Err((
                                tonic::Code::Unimplemented,
                                format!("{PLUGIN_SERVICE}.{m} is not implemented"),
                            ));
                        }
                    },
                };
                let reply = handler(req).await.map_err(|e| (tonic::Code::Unknown, e))?;
                Ok(match reply {
                    Reply::Configure(r) => r.encode_to_vec(),
                    Reply::Synchronize(r) => r.encode_to_vec(),
                    Reply::CreateContainer(r) => r.encode_to_vec(),
                    Reply::UpdateContainer(r) => r.encode_to_vec(),
                    Reply::StopContainer(r) => r.encode_to_vec(),
                    Reply::Empty => Vec::new(),
                })
            })
        });
        let (runtime, answers) = Client::new(runtime_conn);
        demux.start(ttrpc::serve(plugin_conn, serve), answers);
        let _: api::Empty = runtime
            .call(
                RUNTIME_SERVICE,
                "RegisterPlugin",
                &api::RegisterPluginRequest {
                    plugin_name: name.to_string(),
                    plugin_idx: idx.to_string(),
                    nri_version: super::plugin::NRI_VERSION.to_string(),
                },
                Duration::from_secs(5),
            )
            .await
            .map_err(|e| format!("failed to register plugin: {e}"))?;
        Ok(Stub { runtime })
    }

    /// Asks the runtime to update or evict containers; the updates it could not apply.
    pub async fn update_containers(
        &self,
        req: api::UpdateContainersRequest,
    ) -> Result<Vec<api::ContainerUpdate>, String> {
        let a: api::UpdateContainersResponse = self
            .runtime
            .call(
                RUNTIME_SERVICE,
                "UpdateContainers",
                &req,
                Duration::from_secs(30),
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(a.failed)
    }

    /// Resolves when the runtime closed the connection.
    pub async fn closed(&self) {
        self.runtime.closed().await
    }
}
