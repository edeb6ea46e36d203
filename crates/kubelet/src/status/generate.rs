//! Computing a pod's API status from its spec, the runtime's view and the sync's reasons.

use crate::kuberuntime::{ContainerInfo, RuntimePod, Waiting};
use crate::volumes;
use cri::runtime::v1 as pb;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, ContainerUser, HostIP, LinuxContainerUser, Pod,
    PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::collections::HashMap;
use std::path::Path;

fn time(ns: i64) -> Option<Time> {
    if ns <= 0 {
        return None;
    }
    Timestamp::from_nanosecond(ns as i128).ok().map(Time)
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// The API state of one runtime container instance.
fn state_of(c: &ContainerInfo, container_id: String, message: String) -> ContainerState {
    match c.state {
        pb::ContainerState::ContainerRunning => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: time(c.started_at),
            }),
            ..Default::default()
        },
        pb::ContainerState::ContainerExited => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: c.exit_code,
                reason: Some(if c.reason.is_empty() {
                    if c.exit_code == 0 {
                        "Completed"
                    } else {
                        "Error"
                    }
                    .to_string()
                } else {
                    c.reason.clone()
                }),
                message: if message.is_empty() {
                    None
                } else {
                    Some(message)
                },
                started_at: time(c.started_at),
                finished_at: time(c.finished_at),
                container_id: Some(container_id),
                signal: None,
            }),
            ..Default::default()
        },
        _ => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ContainerCreating".into()),
                message: None,
            }),
            ..Default::default()
        },
    }
}

fn container_statuses(
    root: &Path,
    uid: &str,
    specs: &[Container],
    rp: &RuntimePod,
    reasons: &HashMap<String, Waiting>,
    id_of: &dyn Fn(&str) -> String,
    default_waiting: &str,
) -> Vec<ContainerStatus> {
    specs
        .iter()
        .map(|c| {
            let mut all = rp.all_of(&c.name);
            let current = all.next();
            let previous = all.next();
            let mut st = ContainerStatus {
                name: c.name.clone(),
                image: c.image.clone().unwrap_or_default(),
                image_id: String::new(),
                ready: false,
                restart_count: current.map(|x| x.restart_count).unwrap_or(0),
                started: Some(false),
                ..Default::default()
            };
            match current {
                Some(cur) => {
                    let msg = termination_message(root, uid, cur);
                    st.state = Some(state_of(cur, id_of(&cur.id), msg));
                    st.container_id = Some(id_of(&cur.id));
                    st.image_id = if cur.image_ref.is_empty() {
                        cur.image_id.clone()
                    } else {
                        cur.image_ref.clone()
                    };
                    if let Some(prev) =
                        previous.filter(|p| p.state == pb::ContainerState::ContainerExited)
                    {
                        st.last_state = Some(state_of(
                            prev,
                            id_of(&prev.id),
                            termination_message(root, uid, prev),
                        ));
                    }
                    if cur.state == pb::ContainerState::ContainerRunning {
                        st.started = Some(true);
                    }
                    st.user = cur.user.as_ref().map(container_user);
                }
                None => {
                    st.state = Some(ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(default_waiting.into()),
                            message: None,
                        }),
                        ..Default::default()
                    });
                }
            }
            // A sync error overrides a non-running state: the container waits, and what it
            // was before becomes lastState (CrashLoopBackOff over a terminated container).
            let running = current.is_some_and(|c| c.state == pb::ContainerState::ContainerRunning);
            if let Some(w) = reasons.get(&c.name)
                && !running
            {
                if let Some(old) = st.state.take()
                    && old.terminated.is_some()
                {
                    st.last_state = Some(old);
                }
                st.state = Some(ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(w.reason.clone()),
                        message: if w.message.is_empty() {
                            None
                        } else {
                            Some(w.message.clone())
                        },
                    }),
                    ..Default::default()
                });
            }
            st
        })
        .collect()
}

/// The runtime's ContainerUser as the API's `status.containerStatuses[].user`.
fn container_user(u: &pb::LinuxContainerUser) -> ContainerUser {
    ContainerUser {
        linux: Some(LinuxContainerUser {
            uid: u.uid,
            gid: u.gid,
            supplemental_groups: Some(u.supplemental_groups.clone()),
        }),
    }
}

fn termination_message(root: &Path, uid: &str, c: &ContainerInfo) -> String {
    if c.state != pb::ContainerState::ContainerExited {
        return String::new();
    }
    let m = volumes::read_termination_message(root, uid, &c.name, c.restart_count);
    if !m.is_empty() {
        return m;
    }
    c.message.clone()
}

fn is_running(s: &ContainerStatus) -> bool {
    s.state.as_ref().is_some_and(|x| x.running.is_some())
}

fn terminated_code(s: &ContainerStatus) -> Option<i32> {
    s.state
        .as_ref()
        .and_then(|x| x.terminated.as_ref())
        .map(|t| t.exit_code)
}

/// upstream's getPhase.
pub fn pod_phase(pod: &Pod, init: &[ContainerStatus], app: &[ContainerStatus]) -> String {
    let spec = pod.spec.clone().unwrap_or_default();
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let mut pending_init = 0;
    let mut failed_init = 0;
    for c in spec.init_containers.iter().flatten() {
        let Some(s) = init.iter().find(|s| s.name == c.name) else {
            pending_init += 1;
            continue;
        };
        if c.restart_policy.as_deref() == Some("Always") {
            if !is_running(s) {
                pending_init += 1;
            }
            continue;
        }
        let state = s.state.clone().unwrap_or_default();
        if state.running.is_some() {
            pending_init += 1;
        } else if let Some(t) = state.terminated {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else if state.waiting.is_some() {
            match s.last_state.as_ref().and_then(|l| l.terminated.as_ref()) {
                Some(t) if t.exit_code != 0 => failed_init += 1,
                Some(_) => {}
                None => pending_init += 1,
            }
        } else {
            pending_init += 1;
        }
    }
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for c in &spec.containers {
        let Some(s) = app.iter().find(|s| s.name == c.name) else {
            unknown += 1;
            continue;
        };
        let state = s.state.clone().unwrap_or_default();
        if state.running.is_some() {
            running += 1;
        } else if let Some(t) = state.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if state.waiting.is_some() {
            if s.last_state
                .as_ref()
                .and_then(|l| l.terminated.as_ref())
                .is_some()
            {
                stopped += 1;
            } else {
                waiting += 1;
            }
        } else {
            unknown += 1;
        }
    }
    if failed_init > 0 && policy == "Never" {
        return "Failed".into();
    }
    let phase = if pending_init > 0 || failed_init > 0 || waiting > 0 {
        "Pending"
    } else if running > 0 && unknown == 0 {
        "Running"
    } else if running == 0 && stopped > 0 && unknown == 0 {
        match policy {
            "Always" => "Running",
            _ if stopped == succeeded => "Succeeded",
            "Never" => "Failed",
            _ => "Running",
        }
    } else {
        "Pending"
    };
    phase.into()
}

fn condition(type_: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: if ok { None } else { reason.map(Into::into) },
        message: if ok { None } else { message },
        last_transition_time: Some(now()),
        last_probe_time: None,
        observed_generation: None,
    }
}

/// Builds the API status of `pod` from the runtime's view and the last sync's reasons.
pub fn generate_pod_status(
    root: &Path,
    pod: &Pod,
    rp: &RuntimePod,
    reasons: &HashMap<String, Waiting>,
    id_of: &dyn Fn(&str) -> String,
    host_ips: &[String],
) -> PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let inits = spec.init_containers.clone().unwrap_or_default();
    let init_statuses =
        container_statuses(root, &uid, &inits, rp, reasons, id_of, "PodInitializing");
    let initialized_all = inits.iter().all(|c| {
        init_statuses.iter().any(|s| {
            s.name == c.name
                && if c.restart_policy.as_deref() == Some("Always") {
                    is_running(s)
                } else {
                    terminated_code(s) == Some(0)
                        || (s.state.as_ref().is_some_and(|x| x.waiting.is_none())
                            && s.last_state
                                .as_ref()
                                .and_then(|l| l.terminated.as_ref())
                                .is_some_and(|t| t.exit_code == 0))
                }
        })
    });
    let default_waiting = if initialized_all {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    let app_statuses = container_statuses(
        root,
        &uid,
        &spec.containers,
        rp,
        reasons,
        id_of,
        default_waiting,
    );
    // Every ephemeral container the spec names, waiting until the runtime has it.
    let ephemeral: Vec<Container> = crate::kuberuntime::sync_pod::ephemeral_containers(pod)
        .into_iter()
        .map(|(c, _)| c)
        .collect();
    let ephemeral_statuses = container_statuses(
        root,
        &uid,
        &ephemeral,
        rp,
        reasons,
        id_of,
        "ContainerCreating",
    );
    let phase = pod_phase(pod, &init_statuses, &app_statuses);
    let ips = if spec.host_network.unwrap_or(false) {
        host_ips.to_vec()
    } else {
        rp.ips()
    };
    let sandbox_ready = rp.sandboxes.first().is_some_and(|s| s.ready)
        && (spec.host_network.unwrap_or(false) || !ips.is_empty());
    let terminal = phase == "Succeeded" || phase == "Failed";

    let not_init: Vec<String> = inits
        .iter()
        .filter(|c| {
            !init_statuses.iter().any(|s| {
                s.name == c.name
                    && (terminated_code(s) == Some(0)
                        || (c.restart_policy.as_deref() == Some("Always") && is_running(s)))
            })
        })
        .map(|c| c.name.clone())
        .collect();
    let mut conditions = vec![condition(
        "PodReadyToStartContainers",
        sandbox_ready,
        None,
        None,
    )];
    let initialized = initialized_all || (terminal && not_init.is_empty());
    conditions.push(condition(
        "Initialized",
        initialized,
        Some("ContainersNotInitialized"),
        Some(format!(
            "containers with incomplete status: [{}]",
            not_init.join(" ")
        )),
    ));
    // Ready is settled later by the prober's view; here: running and not terminal.
    conditions.push(condition(
        "ContainersReady",
        false,
        Some("ContainersNotReady"),
        None,
    ));
    conditions.push(condition("Ready", false, Some("ContainersNotReady"), None));
    conditions.push(condition("PodScheduled", true, None, None));
    let start_time = rp
        .sandboxes
        .last()
        .and_then(|s| time(s.created_at))
        .or_else(|| Some(now()));
    let _ = terminal;
    PodStatus {
        phase: Some(phase),
        conditions: Some(conditions),
        host_ip: host_ips.first().cloned(),
        host_ips: Some(
            host_ips
                .iter()
                .map(|ip| HostIP { ip: ip.clone() })
                .collect(),
        ),
        pod_ip: ips.first().cloned(),
        pod_ips: Some(ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect()),
        start_time,
        init_container_statuses: if inits.is_empty() {
            None
        } else {
            Some(init_statuses)
        },
        container_statuses: Some(app_statuses),
        ephemeral_container_statuses: if ephemeral.is_empty() {
            None
        } else {
            Some(ephemeral_statuses)
        },
        qos_class: Some(nodus_k8s::qos::pod_qos_class(&spec).as_str().to_string()),
        ..Default::default()
    }
}

/// Settles ContainersReady and Ready from the containers' readiness (after the probers
/// have set `ready`), as upstream's GeneratePodReadyCondition.
pub fn set_ready_conditions(pod: &Pod, status: &mut PodStatus) {
    let spec = pod.spec.clone().unwrap_or_default();
    let phase = status.phase.clone().unwrap_or_default();
    let statuses = status.container_statuses.clone().unwrap_or_default();
    let unready: Vec<String> = spec
        .containers
        .iter()
        .filter(|c| !statuses.iter().any(|s| s.name == c.name && s.ready))
        .map(|c| c.name.clone())
        .collect();
    let (ok, reason, message) = if phase == "Succeeded" || phase == "Failed" {
        (false, "PodCompleted", None)
    } else if unready.is_empty() {
        (true, "", None)
    } else {
        (
            false,
            "ContainersNotReady",
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    for c in status.conditions.iter_mut().flatten() {
        if c.type_ == "ContainersReady" || c.type_ == "Ready" {
            *c = condition(&c.type_, ok, Some(reason), message.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn running(user: Option<pb::LinuxContainerUser>) -> ContainerInfo {
        ContainerInfo {
            id: "c1".into(),
            name: "app".into(),
            sandbox_id: "s1".into(),
            state: pb::ContainerState::ContainerRunning,
            created_at: 1,
            started_at: 2,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image: "busybox".into(),
            image_ref: "sha256:abc".into(),
            image_id: "sha256:abc".into(),
            hash: String::new(),
            restart_count: 0,
            init: false,
            annotations: HashMap::new(),
            user,
        }
    }

    fn status_of(c: ContainerInfo) -> ContainerStatus {
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("busybox".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let rp = RuntimePod {
            containers: vec![c],
            ..Default::default()
        };
        let s = generate_pod_status(
            Path::new("/nonexistent"),
            &pod,
            &rp,
            &HashMap::new(),
            &|id| format!("nodus://{id}"),
            &[],
        );
        s.container_statuses.unwrap().remove(0)
    }

    #[test]
    fn container_user_is_reported_only_when_the_runtime_gives_it() {
        let st = status_of(running(Some(pb::LinuxContainerUser {
            uid: 1000,
            gid: 3000,
            supplemental_groups: vec![3000, 4000],
        })));
        assert_eq!(
            st.user,
            Some(ContainerUser {
                linux: Some(LinuxContainerUser {
                    uid: 1000,
                    gid: 3000,
                    supplemental_groups: Some(vec![3000, 4000]),
                })
            })
        );
        assert_eq!(status_of(running(None)).user, None);
    }
}
