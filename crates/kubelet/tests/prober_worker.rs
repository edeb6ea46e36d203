//! Probe workers driven through the public ProbeManager against local HTTP and TCP
//! servers: thresholds, initial delay, startup gating, hold after a liveness failure,
//! container replacement, readiness in the pod status, worker lifetime.

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStatus, HTTPGetAction, Pod, PodSpec, PodStatus, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use nodus_kubelet::prober::{PodStatusProvider, ProbeManager, ProbeResult, ProbeType, ProbeUpdate};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

const WAIT: Duration = Duration::from_secs(30);
const UID: &str = "pod-uid-1";

#[derive(Default)]
struct Statuses(Mutex<HashMap<String, PodStatus>>);

impl PodStatusProvider for Statuses {
    fn pod_status(&self, pod_uid: &str) -> Option<PodStatus> {
        self.0.lock().unwrap().get(pod_uid).cloned()
    }
}

impl Statuses {
    fn set(&self, status: PodStatus) {
        self.0.lock().unwrap().insert(UID.to_string(), status);
    }
    fn update(&self, f: impl FnOnce(&mut PodStatus)) {
        let mut m = self.0.lock().unwrap();
        if let Some(s) = m.get_mut(UID) {
            f(s);
        }
    }
}

/// An HTTP server whose /healthz answers with a settable status code and counts requests.
struct Health {
    code: Arc<AtomicU16>,
    hits: Arc<AtomicUsize>,
    user_agent: Arc<Mutex<String>>,
    port: u16,
}

async fn health_server() -> Health {
    let code = Arc::new(AtomicU16::new(200));
    let hits = Arc::new(AtomicUsize::new(0));
    let user_agent = Arc::new(Mutex::new(String::new()));
    let (c, h, ua) = (code.clone(), hits.clone(), user_agent.clone());
    let app = Router::new().route(
        "/healthz",
        get(move |headers: HeaderMap| {
            let (c, h, ua) = (c.clone(), h.clone(), ua.clone());
            async move {
                h.fetch_add(1, Ordering::SeqCst);
                *ua.lock().unwrap() = headers
                    .get("user-agent")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let code = StatusCode::from_u16(c.load(Ordering::SeqCst)).unwrap();
                (code, "ok")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Health {
        code,
        hits,
        user_agent,
        port,
    }
}

fn http_probe(port: IntOrString, period: i32, failure: i32, success: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/healthz".into()),
            port,
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failure),
        success_threshold: Some(success),
        timeout_seconds: Some(1),
        ..Default::default()
    }
}

fn pod_with(container: Container) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some(UID.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn started_ago(secs: i64) -> Time {
    let now = nodus_kubelet::config::now_timestamp();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second() - secs).unwrap())
}

fn running(name: &str, id: &str, started: bool, started_at: Time) -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some("127.0.0.1".into()),
        container_statuses: Some(vec![ContainerStatus {
            name: name.into(),
            container_id: Some(format!("containerd://{id}")),
            started: Some(started),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(started_at),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

fn manager(statuses: Arc<Statuses>) -> (ProbeManager, UnboundedReceiver<ProbeUpdate>) {
    let rt = nodus_kubelet::cri::connect(
        "unix:///nonexistent/nodus-test.sock",
        Duration::from_secs(1),
    )
    .unwrap();
    ProbeManager::new(rt.runtime, statuses)
}

async fn next_update(
    rx: &mut UnboundedReceiver<ProbeUpdate>,
    probe: ProbeType,
    result: ProbeResult,
) -> ProbeUpdate {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(u)) if u.probe == probe && u.result == result => return u,
            Ok(Some(_)) => continue,
            Ok(None) => panic!("probe update stream ended"),
            Err(_) => panic!("no {probe:?} {result:?} update within {WAIT:?}"),
        }
    }
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn readiness_starts_not_ready_and_turns_ready_by_named_port() {
    let server = health_server().await;
    let container = Container {
        name: "app".into(),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: i32::from(server.port),
            ..Default::default()
        }]),
        readiness_probe: Some(http_probe(IntOrString::String("http".into()), 1, 3, 1)),
        ..Default::default()
    };
    let pod = pod_with(container);
    let statuses = Arc::new(Statuses::default());
    statuses.set(running("app", "c1", true, started_ago(3600)));
    let (pm, mut rx) = manager(statuses.clone());
    pm.add_pod(&pod);
    pm.add_pod(&pod);
    assert_eq!(pm.worker_count(), 1, "add_pod is idempotent");

    let u = next_update(&mut rx, ProbeType::Readiness, ProbeResult::Failure).await;
    assert_eq!(
        (
            u.pod_uid.as_str(),
            u.container_name.as_str(),
            u.container_id.as_str()
        ),
        (UID, "app", "c1")
    );
    next_update(&mut rx, ProbeType::Readiness, ProbeResult::Success).await;
    assert_eq!(
        pm.result(ProbeType::Readiness, "containerd://c1"),
        Some(ProbeResult::Success)
    );
    assert_eq!(
        pm.result(ProbeType::Readiness, "c1"),
        Some(ProbeResult::Success)
    );
    assert_eq!(*server.user_agent.lock().unwrap(), "kube-probe/1.33");

    let mut status = statuses.pod_status(UID).unwrap();
    status.container_statuses.as_mut().unwrap()[0].ready = false;
    pm.update_pod_status(&pod, &mut status);
    let cs = &status.container_statuses.unwrap()[0];
    assert!(cs.ready);
    assert_eq!(cs.started, Some(true));

    // Failing readiness needs failureThreshold (3) failures in a row to flip.
    let before = server.hits.load(Ordering::SeqCst);
    server.code.store(503, Ordering::SeqCst);
    next_update(&mut rx, ProbeType::Readiness, ProbeResult::Failure).await;
    assert!(server.hits.load(Ordering::SeqCst) - before >= 3);
    assert_eq!(
        pm.last_message(ProbeType::Readiness, "c1").as_deref(),
        Some("Readiness probe failed: HTTP probe failed with statuscode: 503")
    );
    let mut status = statuses.pod_status(UID).unwrap();
    pm.update_pod_status(&pod, &mut status);
    assert!(!status.container_statuses.unwrap()[0].ready);
}

#[tokio::test]
async fn liveness_failure_holds_until_the_container_is_replaced() {
    let server = health_server().await;
    server.code.store(500, Ordering::SeqCst);
    let container = Container {
        name: "app".into(),
        liveness_probe: Some(http_probe(
            IntOrString::Int(i32::from(server.port)),
            1,
            2,
            1,
        )),
        ..Default::default()
    };
    let pod = pod_with(container);
    let statuses = Arc::new(Statuses::default());
    statuses.set(running("app", "c1", true, started_ago(3600)));
    let (pm, mut rx) = manager(statuses.clone());
    pm.add_pod(&pod);

    // Alive until proven otherwise.
    next_update(&mut rx, ProbeType::Liveness, ProbeResult::Success).await;
    let u = next_update(&mut rx, ProbeType::Liveness, ProbeResult::Failure).await;
    assert_eq!(u.container_id, "c1");
    assert!(
        server.hits.load(Ordering::SeqCst) >= 2,
        "failureThreshold is 2"
    );
    assert_eq!(
        pm.last_message(ProbeType::Liveness, "c1").as_deref(),
        Some("Liveness probe failed: HTTP probe failed with statuscode: 500")
    );

    // On hold: no more probes of this container.
    let held = server.hits.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(
        server.hits.load(Ordering::SeqCst),
        held,
        "probed a container on hold"
    );
    assert_eq!(
        pm.result(ProbeType::Liveness, "c1"),
        Some(ProbeResult::Failure)
    );

    // The kubelet restarted the container: a new id resumes probing from "alive".
    server.code.store(200, Ordering::SeqCst);
    statuses.set(running("app", "c2", true, started_ago(3600)));
    let u = next_update(&mut rx, ProbeType::Liveness, ProbeResult::Success).await;
    assert_eq!(u.container_id, "c2");
    wait_until("probing resumes", || {
        server.hits.load(Ordering::SeqCst) > held
    })
    .await;
    assert_eq!(
        pm.result(ProbeType::Liveness, "c1"),
        None,
        "old container's result dropped"
    );
}

#[tokio::test]
async fn startup_probe_gates_readiness_and_liveness() {
    let server = health_server().await;
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    drop(tcp);
    let container = Container {
        name: "app".into(),
        startup_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(i32::from(tcp_port)),
                ..Default::default()
            }),
            period_seconds: Some(1),
            failure_threshold: Some(30),
            ..Default::default()
        }),
        readiness_probe: Some(http_probe(
            IntOrString::Int(i32::from(server.port)),
            1,
            1,
            1,
        )),
        liveness_probe: Some(http_probe(
            IntOrString::Int(i32::from(server.port)),
            1,
            1,
            1,
        )),
        ..Default::default()
    };
    let pod = pod_with(container);
    let statuses = Arc::new(Statuses::default());
    statuses.set(running("app", "c1", false, started_ago(3600)));
    let (pm, mut rx) = manager(statuses.clone());
    pm.add_pod(&pod);
    assert_eq!(pm.worker_count(), 3);

    next_update(&mut rx, ProbeType::Startup, ProbeResult::Unknown).await;
    wait_until("a failed startup probe", || {
        pm.last_message(ProbeType::Startup, "c1").is_some()
    })
    .await;
    assert_eq!(
        pm.last_message(ProbeType::Startup, "c1"),
        Some(format!(
            "Startup probe failed: dial tcp 127.0.0.1:{tcp_port}: connect: connection refused"
        ))
    );
    // Not started: neither ready nor probed for readiness or liveness.
    let mut status = statuses.pod_status(UID).unwrap();
    pm.update_pod_status(&pod, &mut status);
    let cs = &status.container_statuses.unwrap()[0];
    assert_eq!((cs.started, cs.ready), (Some(false), false));
    assert_eq!(server.hits.load(Ordering::SeqCst), 0);

    // The port opens: startup succeeds.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", tcp_port))
        .await
        .unwrap();
    next_update(&mut rx, ProbeType::Startup, ProbeResult::Success).await;
    let mut status = statuses.pod_status(UID).unwrap();
    pm.update_pod_status(&pod, &mut status);
    assert_eq!(
        status.container_statuses.as_ref().unwrap()[0].started,
        Some(true)
    );
    // The kubelet publishes started=true; readiness and liveness begin.
    statuses.set(status);
    next_update(&mut rx, ProbeType::Readiness, ProbeResult::Success).await;
    wait_until("liveness probes", || {
        server.hits.load(Ordering::SeqCst) >= 2
    })
    .await;
    drop(listener);
}

#[tokio::test]
async fn initial_delay_and_success_threshold() {
    let server = health_server().await;
    let mut probe = http_probe(IntOrString::Int(i32::from(server.port)), 1, 3, 3);
    probe.initial_delay_seconds = Some(3600);
    let container = Container {
        name: "app".into(),
        readiness_probe: Some(probe),
        ..Default::default()
    };
    let pod = pod_with(container.clone());
    let statuses = Arc::new(Statuses::default());
    // Started just now: an hour of initial delay keeps the probe quiet.
    statuses.set(running("app", "c1", true, started_ago(0)));
    let (pm, mut rx) = manager(statuses.clone());
    pm.add_pod(&pod);
    next_update(&mut rx, ProbeType::Readiness, ProbeResult::Failure).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        server.hits.load(Ordering::SeqCst),
        0,
        "probed during initialDelaySeconds"
    );
    pm.remove_pod(&pod);
    assert_eq!(pm.worker_count(), 0);
    wait_until("the stopped worker clears its result", || {
        pm.result(ProbeType::Readiness, "c1").is_none()
    })
    .await;

    // Same probe, container started long ago: three successes make it ready.
    let pod2 = Pod {
        metadata: ObjectMeta {
            uid: Some(UID.into()),
            ..pod.metadata.clone()
        },
        ..pod.clone()
    };
    statuses.set(running("app", "c2", true, started_ago(7200)));
    pm.add_pod(&pod2);
    next_update(&mut rx, ProbeType::Readiness, ProbeResult::Success).await;
    assert!(
        server.hits.load(Ordering::SeqCst) >= 3,
        "successThreshold is 3"
    );
}

#[tokio::test]
async fn workers_end_with_the_pod() {
    let server = health_server().await;
    let container = Container {
        name: "app".into(),
        readiness_probe: Some(http_probe(
            IntOrString::Int(i32::from(server.port)),
            1,
            1,
            1,
        )),
        ..Default::default()
    };
    let pod = pod_with(container);
    let statuses = Arc::new(Statuses::default());
    statuses.set(running("app", "c1", true, started_ago(3600)));
    let (pm, mut rx) = manager(statuses.clone());
    pm.add_pod(&pod);
    next_update(&mut rx, ProbeType::Readiness, ProbeResult::Success).await;

    // A pod that finished stops its workers.
    statuses.update(|s| {
        s.phase = Some("Succeeded".into());
        s.container_statuses.as_mut().unwrap()[0].state = Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 0,
                ..Default::default()
            }),
            ..Default::default()
        });
    });
    wait_until("worker exit on Succeeded", || pm.worker_count() == 0).await;
    assert_eq!(pm.result(ProbeType::Readiness, "c1"), None);

    // A terminating pod keeps only its readiness probing.
    let with_liveness = {
        let mut p = pod.clone();
        let c = &mut p.spec.as_mut().unwrap().containers[0];
        c.liveness_probe = c.readiness_probe.clone();
        p
    };
    statuses.set(running("app", "c1", true, started_ago(3600)));
    pm.add_pod(&with_liveness);
    assert_eq!(pm.worker_count(), 2);
    next_update(&mut rx, ProbeType::Liveness, ProbeResult::Success).await;
    next_update(&mut rx, ProbeType::Readiness, ProbeResult::Success).await;
    pm.stop_liveness_and_startup(&with_liveness);
    assert_eq!(pm.worker_count(), 1);
    wait_until("the liveness worker clears its result", || {
        pm.result(ProbeType::Liveness, "c1").is_none()
    })
    .await;
    assert_eq!(
        pm.result(ProbeType::Readiness, "c1"),
        Some(ProbeResult::Success)
    );
    pm.remove_pod(&with_liveness);
    assert_eq!(pm.worker_count(), 0);
    wait_until("the readiness worker clears its result", || {
        pm.result(ProbeType::Readiness, "c1").is_none()
    })
    .await;

    // Removed and added back at once (a manifest moved out and back): probing goes on
    // with a new worker and the old one does not wipe its result.
    pm.add_pod(&pod);
    next_update(&mut rx, ProbeType::Readiness, ProbeResult::Success).await;
    pm.remove_pod(&pod);
    pm.add_pod(&pod);
    assert_eq!(pm.worker_count(), 1);
    next_update(&mut rx, ProbeType::Readiness, ProbeResult::Success).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        pm.result(ProbeType::Readiness, "c1"),
        Some(ProbeResult::Success)
    );
    pm.remove_pod(&pod);

    // cleanup_pods stops workers of pods no longer desired.
    statuses.set(running("app", "c1", true, started_ago(3600)));
    pm.add_pod(&pod);
    assert_eq!(pm.worker_count(), 1);
    pm.cleanup_pods(&HashSet::from([UID.to_string()]));
    assert_eq!(pm.worker_count(), 1);
    pm.cleanup_pods(&HashSet::new());
    wait_until("worker exit on cleanup", || pm.worker_count() == 0).await;
}
