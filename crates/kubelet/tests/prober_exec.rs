//! Exec probes and exec hooks through the CRI `ExecSync` call, against a fake runtime that
//! serves only that method on a Unix socket.

use cri::runtime::v1::{ExecSyncRequest, ExecSyncResponse};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStatus, ExecAction,
    LifecycleHandler, Pod, PodSpec, PodStatus, Probe,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nodus_kubelet::prober::handler::{HandlerResult, Outcome};
use nodus_kubelet::prober::{PodStatusProvider, ProbeManager, ProbeResult, ProbeType};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Answers by the command's first word: `true` exits 0 with output, `false` exits 1 with
/// stderr, `hang` outlives its timeout, anything else is an unknown container.
#[derive(Clone, Default)]
struct FakeRuntime {
    requests: Arc<Mutex<Vec<ExecSyncRequest>>>,
}

impl tonic::server::NamedService for FakeRuntime {
    const NAME: &'static str = "runtime.v1.RuntimeService";
}

struct ExecSync(Arc<Mutex<Vec<ExecSyncRequest>>>);

impl tonic::server::UnaryService<ExecSyncRequest> for ExecSync {
    type Response = ExecSyncResponse;
    type Future = std::future::Ready<Result<tonic::Response<ExecSyncResponse>, tonic::Status>>;
    fn call(&mut self, req: tonic::Request<ExecSyncRequest>) -> Self::Future {
        let req = req.into_inner();
        self.0.lock().unwrap().push(req.clone());
        let reply = |stdout: &str, stderr: &str, exit_code| {
            Ok(tonic::Response::new(ExecSyncResponse {
                stdout: stdout.as_bytes().to_vec(),
                stderr: stderr.as_bytes().to_vec(),
                exit_code,
            }))
        };
        std::future::ready(match req.cmd.first().map(String::as_str) {
            Some("true") => reply("all good\n", "", 0),
            Some("false") => reply("partial\n", "bad\n", 1),
            Some("hang") => Err(tonic::Status::deadline_exceeded("command timed out")),
            _ => Err(tonic::Status::not_found("container not found")),
        })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for FakeRuntime {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;
    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let requests = self.requests.clone();
        Box::pin(async move {
            if req.uri().path() != "/runtime.v1.RuntimeService/ExecSync" {
                return Ok(tonic::Status::unimplemented("fake runtime").into_http());
            }
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                ExecSyncResponse,
                ExecSyncRequest,
            >::default());
            Ok(grpc.unary(ExecSync(requests), req).await)
        })
    }
}

struct Fake {
    _dir: tempfile::TempDir,
    runtime: nodus_kubelet::cri::RuntimeClient,
    requests: Arc<Mutex<Vec<ExecSyncRequest>>>,
}

async fn fake_runtime() -> Fake {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("cri.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    let svc = FakeRuntime::default();
    let requests = svc.requests.clone();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await;
    });
    let rt = nodus_kubelet::cri::connect(
        &format!("unix://{}", sock.display()),
        Duration::from_secs(5),
    )
    .unwrap();
    Fake {
        _dir: dir,
        runtime: rt.runtime,
        requests,
    }
}

fn cmd(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn exec_probe_outcomes() {
    let fake = fake_runtime().await;
    let probe = |words: &'static [&'static str]| {
        let rt = fake.runtime.clone();
        async move {
            nodus_kubelet::prober::exec::probe(
                &rt,
                "containerd://abc",
                &cmd(words),
                Duration::from_secs(3),
            )
            .await
        }
    };
    assert_eq!(
        probe(&["true"]).await,
        Ok(HandlerResult::new(Outcome::Success, "all good\n"))
    );
    assert_eq!(
        probe(&["false", "x"]).await,
        Ok(HandlerResult::new(Outcome::Failure, "partial\nbad\n"))
    );
    assert_eq!(
        probe(&["hang", "10"]).await,
        Ok(HandlerResult::new(
            Outcome::Failure,
            "command \"hang 10\" timed out"
        ))
    );
    let err = probe(&["nope"]).await.unwrap_err();
    assert!(err.contains("container not found"), "{err}");

    let reqs = fake.requests.lock().unwrap();
    assert_eq!(
        reqs[0].container_id, "abc",
        "the runtime prefix is stripped"
    );
    assert_eq!(reqs[0].timeout, 3);
    assert_eq!(reqs[1].cmd, cmd(&["false", "x"]));
}

struct Statuses(Mutex<Option<PodStatus>>);

impl PodStatusProvider for Statuses {
    fn pod_status(&self, _: &str) -> Option<PodStatus> {
        self.0.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn failing_exec_liveness_probe_reports_its_output() {
    let fake = fake_runtime().await;
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            namespace: Some("ns".into()),
            uid: Some("u1".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                liveness_probe: Some(Probe {
                    exec: Some(ExecAction {
                        command: Some(cmd(&["false"])),
                    }),
                    period_seconds: Some(1),
                    failure_threshold: Some(1),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let status = PodStatus {
        phase: Some("Running".into()),
        container_statuses: Some(vec![ContainerStatus {
            name: "c".into(),
            container_id: Some("nodus://cid".into()),
            started: Some(true),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning { started_at: None }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let (pm, mut rx) = ProbeManager::new(
        fake.runtime.clone(),
        Arc::new(Statuses(Mutex::new(Some(status)))),
    );
    pm.add_pod(&pod);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let u = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .expect("no liveness failure")
            .expect("stream ended");
        if u.probe == ProbeType::Liveness && u.result == ProbeResult::Failure {
            assert_eq!(u.container_id, "cid");
            break;
        }
    }
    assert_eq!(
        pm.last_message(ProbeType::Liveness, "nodus://cid")
            .as_deref(),
        Some("Liveness probe failed: partial\nbad\n")
    );
}

#[tokio::test]
async fn exec_hooks_fail_with_upstreams_message() {
    let fake = fake_runtime().await;
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            namespace: Some("ns".into()),
            uid: Some("uid".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let container = Container {
        name: "c".into(),
        ..Default::default()
    };
    let hook = |words: &[&str]| LifecycleHandler {
        exec: Some(ExecAction {
            command: Some(cmd(words)),
        }),
        ..Default::default()
    };
    let run = |h: LifecycleHandler| {
        let rt = fake.runtime.clone();
        let (pod, container) = (pod.clone(), container.clone());
        async move {
            nodus_kubelet::lifecycle::run_handler(
                &rt,
                &pod,
                &container,
                "cid",
                &h,
                None,
                Duration::from_secs(30),
            )
            .await
        }
    };
    assert!(run(hook(&["true"])).await.is_ok());
    let err = run(hook(&["false", "now"])).await.unwrap_err().to_string();
    assert_eq!(
        err,
        "Exec lifecycle hook ([false now]) for Container \"c\" in Pod \"p_ns(uid)\" failed - error: command 'false now' exited with 1: bad\n, message: \"partial\\nbad\\n\""
    );
    let err = run(hook(&["hang"])).await.unwrap_err().to_string();
    assert!(
        err.ends_with("failed - error: command \"hang\" timed out, message: \"\""),
        "{err}"
    );
    assert_eq!(fake.requests.lock().unwrap()[0].timeout, 30);
}
