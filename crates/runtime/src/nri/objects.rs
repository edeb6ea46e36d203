//! The NRI view of the runtime's pods and containers: `PodSandbox` from a sandbox record,
//! `Container` from a container record and its OCI spec (args, env, mounts, hooks, Linux
//! namespaces, devices, resources, cgroup path, rlimits, user: what the container runs
//! with, as containerd hands plugins the spec's values).

use crate::state::{ContainerRecord, ContainerState, SandboxRecord};
use cri::nri as api;
use serde_json::Value;

/// The pod a sandbox record describes.
pub(crate) fn pod(rec: &SandboxRecord) -> api::PodSandbox {
    let cfg = rec.config();
    let meta = cfg.metadata.clone().unwrap_or_default();
    let mut namespaces = Vec::new();
    for (kind, path) in [
        ("network", &rec.netns),
        ("ipc", &rec.ipc_ns),
        ("uts", &rec.uts_ns),
        ("pid", &rec.pid_ns),
        ("user", &rec.user_ns),
    ] {
        if let Some(p) = path {
            namespaces.push(api::LinuxNamespace {
                r#type: kind.to_string(),
                path: p.display().to_string(),
            });
        }
    }
    let cgroup_parent = cfg
        .linux
        .as_ref()
        .map(|l| l.cgroup_parent.clone())
        .unwrap_or_default();
    api::PodSandbox {
        id: rec.id.clone(),
        name: meta.name,
        uid: meta.uid,
        namespace: meta.namespace,
        labels: cfg.labels.clone(),
        annotations: cfg.annotations.clone(),
        runtime_handler: rec.handler.clone(),
        linux: Some(api::LinuxPodSandbox {
            cgroup_parent: cgroup_parent.clone(),
            cgroups_path: cgroup_parent,
            namespaces,
            ..Default::default()
        }),
        pid: rec.pid_init.unwrap_or(0),
        ips: rec
            .ip
            .iter()
            .chain(rec.additional_ips.iter())
            .cloned()
            .collect(),
    }
}

pub(crate) fn state(s: ContainerState) -> api::ContainerState {
    match s {
        ContainerState::Created => api::ContainerState::ContainerCreated,
        ContainerState::Running => api::ContainerState::ContainerRunning,
        ContainerState::Exited => api::ContainerState::ContainerStopped,
        ContainerState::Unknown => api::ContainerState::ContainerUnknown,
    }
}

/// The container a record describes, with what its bundle's spec runs.
pub(crate) fn container(rec: &ContainerRecord) -> api::Container {
    with_record(spec_view(rec), rec)
}

/// What the container's bundle spec says (read and parsed from `config.json`): the part of
/// the container's NRI view that changes only when the spec is rewritten.
pub(crate) fn spec_view(rec: &ContainerRecord) -> api::Container {
    let spec = std::fs::read(rec.bundle.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .unwrap_or(Value::Null);
    let name = rec.config().metadata.map(|m| m.name).unwrap_or_default();
    from_spec(&rec.id, &rec.sandbox_id, &name, &spec)
}

/// `view` (a [`spec_view`]) with the record's labels, state, pids, times and image.
pub(crate) fn with_record(mut c: api::Container, rec: &ContainerRecord) -> api::Container {
    c.labels = rec.config().labels;
    c.state = state(rec.state) as i32;
    c.pid = rec.init_pid.unwrap_or(0);
    c.created_at = rec.created_at;
    c.started_at = rec.started_at;
    c.finished_at = rec.finished_at;
    c.exit_code = rec.exit_code;
    c.status_reason = rec.reason.clone();
    c.status_message = rec.message.clone();
    c.image = Some(api::Image {
        name: rec.image_ref.clone(),
        digest: String::new(),
        config_digest: rec.image_id.clone(),
    });
    c
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn string_map(v: &Value) -> std::collections::HashMap<String, String> {
    v.as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn hooks(v: &Value) -> Vec<api::Hook> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|h| api::Hook {
                    path: h["path"].as_str().unwrap_or_default().to_string(),
                    args: strings(&h["args"]),
                    env: strings(&h["env"]),
                    timeout: h["timeout"]
                        .as_i64()
                        .map(|value| api::OptionalInt { value }),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn opt_i64(v: &Value) -> Option<api::OptionalInt64> {
    v.as_i64().map(|value| api::OptionalInt64 { value })
}

fn opt_u64(v: &Value) -> Option<api::OptionalUInt64> {
    v.as_u64().map(|value| api::OptionalUInt64 { value })
}

/// The NRI resources of an OCI `linux.resources` object.
pub(crate) fn resources(r: &Value) -> api::LinuxResources {
    api::LinuxResources {
        memory: Some(api::LinuxMemory {
            limit: opt_i64(&r["memory"]["limit"]),
            reservation: opt_i64(&r["memory"]["reservation"]),
            swap: opt_i64(&r["memory"]["swap"]),
            swappiness: opt_u64(&r["memory"]["swappiness"]),
            disable_oom_killer: r["memory"]["disableOOMKiller"]
                .as_bool()
                .map(|value| api::OptionalBool { value }),
            ..Default::default()
        }),
        cpu: Some(api::LinuxCpu {
            shares: opt_u64(&r["cpu"]["shares"]),
            quota: opt_i64(&r["cpu"]["quota"]),
            period: opt_u64(&r["cpu"]["period"]),
            realtime_runtime: opt_i64(&r["cpu"]["realtimeRuntime"]),
            realtime_period: opt_u64(&r["cpu"]["realtimePeriod"]),
            cpus: r["cpu"]["cpus"].as_str().unwrap_or_default().to_string(),
            mems: r["cpu"]["mems"].as_str().unwrap_or_default().to_string(),
        }),
        hugepage_limits: r["hugepageLimits"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|h| api::HugepageLimit {
                        page_size: h["pageSize"].as_str().unwrap_or_default().to_string(),
                        limit: h["limit"].as_u64().unwrap_or(0),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        unified: string_map(&r["unified"]),
        pids: r["pids"]["limit"]
            .as_i64()
            .map(|limit| api::LinuxPids { limit }),
        ..Default::default()
    }
}

/// A container as its OCI spec (JSON) describes it.
pub(crate) fn from_spec(id: &str, sandbox_id: &str, name: &str, spec: &Value) -> api::Container {
    let p = &spec["process"];
    let l = &spec["linux"];
    api::Container {
        id: id.to_string(),
        pod_sandbox_id: sandbox_id.to_string(),
        name: name.to_string(),
        state: api::ContainerState::ContainerCreated as i32,
        annotations: string_map(&spec["annotations"]),
        args: strings(&p["args"]),
        env: strings(&p["env"]),
        mounts: spec["mounts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|m| api::Mount {
                        destination: m["destination"].as_str().unwrap_or_default().to_string(),
                        r#type: m["type"].as_str().unwrap_or_default().to_string(),
                        source: m["source"].as_str().unwrap_or_default().to_string(),
                        options: strings(&m["options"]),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        hooks: Some(api::Hooks {
            prestart: hooks(&spec["hooks"]["prestart"]),
            create_runtime: hooks(&spec["hooks"]["createRuntime"]),
            create_container: hooks(&spec["hooks"]["createContainer"]),
            start_container: hooks(&spec["hooks"]["startContainer"]),
            poststart: hooks(&spec["hooks"]["poststart"]),
            poststop: hooks(&spec["hooks"]["poststop"]),
        }),
        linux: Some(api::LinuxContainer {
            namespaces: l["namespaces"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|n| api::LinuxNamespace {
                            r#type: n["type"].as_str().unwrap_or_default().to_string(),
                            path: n["path"].as_str().unwrap_or_default().to_string(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            devices: l["devices"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|d| api::LinuxDevice {
                            path: d["path"].as_str().unwrap_or_default().to_string(),
                            r#type: d["type"].as_str().unwrap_or_default().to_string(),
                            major: d["major"].as_i64().unwrap_or(0),
                            minor: d["minor"].as_i64().unwrap_or(0),
                            file_mode: d["fileMode"]
                                .as_u64()
                                .map(|m| api::OptionalFileMode { value: m as u32 }),
                            uid: d["uid"]
                                .as_u64()
                                .map(|v| api::OptionalUInt32 { value: v as u32 }),
                            gid: d["gid"]
                                .as_u64()
                                .map(|v| api::OptionalUInt32 { value: v as u32 }),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            resources: Some(resources(&l["resources"])),
            oom_score_adj: p["oomScoreAdj"]
                .as_i64()
                .map(|value| api::OptionalInt { value }),
            cgroups_path: l["cgroupsPath"].as_str().unwrap_or_default().to_string(),
        }),
        rlimits: p["rlimits"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| api::PosixRlimit {
                        r#type: r["type"].as_str().unwrap_or_default().to_string(),
                        hard: r["hard"].as_u64().unwrap_or(0),
                        soft: r["soft"].as_u64().unwrap_or(0),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        user: p["user"].as_object().map(|u| api::User {
            uid: u.get("uid").and_then(Value::as_u64).unwrap_or(0) as u32,
            gid: u.get("gid").and_then(Value::as_u64).unwrap_or(0) as u32,
            additional_gids: u
                .get("additionalGids")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|g| g.as_u64())
                        .map(|g| g as u32)
                        .collect()
                })
                .unwrap_or_default(),
        }),
        ..Default::default()
    }
}
