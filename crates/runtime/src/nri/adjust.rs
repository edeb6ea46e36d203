//! CreateContainer adjustments: merging the answers of every plugin in index order into one
//! [`api::ContainerAdjustment`], with upstream's ownership rules — a plugin claims each
//! field (or each entry of a map or list field: an env variable, a mount destination, a
//! device path) it sets, and a second plugin setting a claimed field is an error naming
//! both (`plugins "10-b" and "00-a" both tried to set Env FOO`); a key prefixed with `-`
//! removes the entry and releases it. Then the merged adjustment applied to the OCI spec.

use cri::nri as api;
use serde_json::{Value, json};
use std::collections::HashMap;

/// Upstream's `Field` names, as conflict errors spell them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Field {
    Annotations,
    Mounts,
    Devices,
    Env,
    Args,
    MemLimit,
    MemReservation,
    MemSwapLimit,
    MemSwappiness,
    MemDisableOomKiller,
    CpuShares,
    CpuQuota,
    CpuPeriod,
    CpuRealtimeRuntime,
    CpuRealtimePeriod,
    CpuSetCpus,
    CpuSetMems,
    PidsLimit,
    HugepageLimits,
    CgroupsUnified,
    CgroupsPath,
    OomScoreAdj,
    Rlimits,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Annotations => "Annotations",
            Field::Mounts => "Mounts",
            Field::Devices => "Devices",
            Field::Env => "Env",
            Field::Args => "Args",
            Field::MemLimit => "MemLimit",
            Field::MemReservation => "MemReservation",
            Field::MemSwapLimit => "MemSwapLimit",
            Field::MemSwappiness => "MemSwappiness",
            Field::MemDisableOomKiller => "MemDisableOomKiller",
            Field::CpuShares => "CPUShares",
            Field::CpuQuota => "CPUQuota",
            Field::CpuPeriod => "CPUPeriod",
            Field::CpuRealtimeRuntime => "CPURealtimeRuntime",
            Field::CpuRealtimePeriod => "CPURealtimePeriod",
            Field::CpuSetCpus => "CPUSetCPUs",
            Field::CpuSetMems => "CPUSetMems",
            Field::PidsLimit => "PidsLimit",
            Field::HugepageLimits => "HugepageLimits",
            Field::CgroupsUnified => "CgroupsUnified",
            Field::CgroupsPath => "CgroupsPath",
            Field::OomScoreAdj => "OomScoreAdj",
            Field::Rlimits => "Rlimits",
        }
    }
}

/// Whether `key` is marked for removal (`-key`), and the key itself.
fn removal(key: &str) -> (&str, bool) {
    match key.strip_prefix('-') {
        Some(k) => (k, true),
        None => (key, false),
    }
}

/// The adjustment of one container being created, as the plugins answer one by one.
#[derive(Default)]
pub(crate) struct Merge {
    /// (field, entry) → the plugin that set it; a plugin that removed an entry holds it as
    /// `-plugin` (it may set it again, nobody else may).
    owners: HashMap<(Field, String), String>,
    pub(crate) adjust: api::ContainerAdjustment,
}

impl Merge {
    fn claim(&mut self, field: Field, key: &str, plugin: &str) -> Result<(), String> {
        if let Some(other) = self.owners.get(&(field, key.to_string())) {
            let (other, cleared) = removal(other);
            if !(cleared && other == plugin) {
                return Err(format!(
                    "plugins {plugin:?} and {other:?} both tried to set {} {key}",
                    field.name()
                ));
            }
        }
        self.owners
            .insert((field, key.to_string()), plugin.to_string());
        Ok(())
    }

    fn clear(&mut self, field: Field, key: &str, plugin: &str) {
        self.owners
            .insert((field, key.to_string()), format!("-{plugin}"));
    }

    /// Adds plugin `plugin`'s answer; `container` is updated so the next plugin sees what
    /// the ones before it changed, as upstream passes it on.
    pub(crate) fn add(
        &mut self,
        a: api::ContainerAdjustment,
        plugin: &str,
        container: &mut api::Container,
    ) -> Result<(), String> {
        // Annotations.
        let mut del: Vec<String> = Vec::new();
        for k in a.annotations.keys() {
            if let (key, true) = removal(k) {
                self.clear(Field::Annotations, key, plugin);
                container.annotations.remove(key);
                self.adjust.annotations.remove(key);
                del.push(key.to_string());
            }
        }
        for (k, v) in &a.annotations {
            if k.starts_with('-') {
                continue;
            }
            self.claim(Field::Annotations, k, plugin)?;
            container.annotations.insert(k.clone(), v.clone());
            self.adjust.annotations.insert(k.clone(), v.clone());
            del.retain(|d| d != k);
        }
        for k in del {
            self.adjust
                .annotations
                .insert(format!("-{k}"), String::new());
        }
        // Mounts, by destination.
        for m in &a.mounts {
            let (dst, marked) = removal(&m.destination);
            let dst = dst.to_string();
            self.adjust.mounts.retain(|x| x.destination != dst);
            container.mounts.retain(|x| x.destination != dst);
            if marked {
                self.clear(Field::Mounts, &dst, plugin);
                self.adjust.mounts.push(m.clone());
            } else {
                self.claim(Field::Mounts, &dst, plugin)?;
                self.adjust.mounts.push(m.clone());
                container.mounts.push(m.clone());
            }
        }
        // Environment, by name.
        for e in &a.env {
            let (key, marked) = removal(&e.key);
            let key = key.to_string();
            self.adjust.env.retain(|x| removal(&x.key).0 != key);
            container
                .env
                .retain(|x| x.split_once('=').map_or(x.as_str(), |(k, _)| k) != key);
            if marked {
                self.clear(Field::Env, &key, plugin);
            } else {
                self.claim(Field::Env, &key, plugin)?;
                container.env.push(format!("{key}={}", e.value));
            }
            self.adjust.env.push(e.clone());
        }
        if !a.args.is_empty() {
            let mut args = a.args.clone();
            if args[0].is_empty() {
                self.clear(Field::Args, "", plugin);
                args.remove(0);
            }
            self.claim(Field::Args, "", plugin)?;
            container.args = args.clone();
            self.adjust.args = args;
        }
        if let Some(h) = a.hooks {
            // Hooks accumulate: every plugin's run, none conflicts.
            let mine = self.adjust.hooks.get_or_insert_with(Default::default);
            let theirs = container.hooks.get_or_insert_with(Default::default);
            for (dst, ctr, add) in [
                (&mut mine.prestart, &mut theirs.prestart, h.prestart),
                (
                    &mut mine.create_runtime,
                    &mut theirs.create_runtime,
                    h.create_runtime,
                ),
                (
                    &mut mine.create_container,
                    &mut theirs.create_container,
                    h.create_container,
                ),
                (
                    &mut mine.start_container,
                    &mut theirs.start_container,
                    h.start_container,
                ),
                (&mut mine.poststart, &mut theirs.poststart, h.poststart),
                (&mut mine.poststop, &mut theirs.poststop, h.poststop),
            ] {
                dst.extend(add.iter().cloned());
                ctr.extend(add);
            }
        }
        for r in &a.rlimits {
            self.claim(Field::Rlimits, &r.r#type, plugin)?;
            self.adjust.rlimits.retain(|x| x.r#type != r.r#type);
            self.adjust.rlimits.push(r.clone());
            container.rlimits.retain(|x| x.r#type != r.r#type);
            container.rlimits.push(r.clone());
        }
        if let Some(d) = a.cdi_devices.first() {
            return Err(format!(
                "plugin {plugin:?} asked for CDI device {:?}: this runtime does not resolve CDI devices; inject the device itself (linux.devices)",
                d.name
            ));
        }
        if let Some(l) = a.linux {
            self.add_linux(l, plugin, container)?;
        }
        Ok(())
    }

    fn add_linux(
        &mut self,
        l: api::LinuxContainerAdjustment,
        plugin: &str,
        container: &mut api::Container,
    ) -> Result<(), String> {
        let mine = self.adjust.linux.get_or_insert_with(Default::default);
        let mut claims: Vec<(Field, String, bool)> = Vec::new();
        let theirs = container.linux.get_or_insert_with(Default::default);
        for d in &l.devices {
            let (path, marked) = removal(&d.path);
            let path = path.to_string();
            mine.devices.retain(|x| removal(&x.path).0 != path);
            theirs.devices.retain(|x| x.path != path);
            mine.devices.push(d.clone());
            if !marked {
                theirs.devices.push(d.clone());
            }
            claims.push((Field::Devices, path, marked));
        }
        if !l.cgroups_path.is_empty() {
            mine.cgroups_path = l.cgroups_path.clone();
            theirs.cgroups_path = l.cgroups_path.clone();
            claims.push((Field::CgroupsPath, String::new(), false));
        }
        if let Some(o) = l.oom_score_adj {
            mine.oom_score_adj = Some(o);
            theirs.oom_score_adj = Some(o);
            claims.push((Field::OomScoreAdj, String::new(), false));
        }
        if let Some(r) = l.resources {
            let dst = mine.resources.get_or_insert_with(Default::default);
            let ctr = theirs.resources.get_or_insert_with(Default::default);
            merge_resources(dst, ctr, r, &mut claims);
        }
        for (field, key, marked) in claims {
            if marked {
                self.clear(field, &key, plugin);
            } else {
                self.claim(field, &key, plugin)?;
            }
        }
        Ok(())
    }
}

/// Copies the resource fields `r` sets into `dst` (the merged adjustment) and `ctr` (the
/// container as the next plugin sees it), noting each as a claim.
fn merge_resources(
    dst: &mut api::LinuxResources,
    ctr: &mut api::LinuxResources,
    r: api::LinuxResources,
    claims: &mut Vec<(Field, String, bool)>,
) {
    macro_rules! simple {
        ($group:ident, $field:ident, $name:expr) => {
            if let Some(v) = r.$group.as_ref().and_then(|g| g.$field.clone()) {
                dst.$group.get_or_insert_with(Default::default).$field = Some(v.clone());
                ctr.$group.get_or_insert_with(Default::default).$field = Some(v);
                claims.push(($name, String::new(), false));
            }
        };
    }
    simple!(memory, limit, Field::MemLimit);
    simple!(memory, reservation, Field::MemReservation);
    simple!(memory, swap, Field::MemSwapLimit);
    simple!(memory, swappiness, Field::MemSwappiness);
    simple!(memory, disable_oom_killer, Field::MemDisableOomKiller);
    simple!(cpu, shares, Field::CpuShares);
    simple!(cpu, quota, Field::CpuQuota);
    simple!(cpu, period, Field::CpuPeriod);
    simple!(cpu, realtime_runtime, Field::CpuRealtimeRuntime);
    simple!(cpu, realtime_period, Field::CpuRealtimePeriod);
    if let Some(cpu) = &r.cpu {
        for (v, field, set) in [
            (
                &cpu.cpus,
                Field::CpuSetCpus,
                (|c: &mut api::LinuxCpu, v: &str| c.cpus = v.to_string()) as fn(&mut _, &str),
            ),
            (&cpu.mems, Field::CpuSetMems, |c, v| c.mems = v.to_string()),
        ] {
            if !v.is_empty() {
                set(dst.cpu.get_or_insert_with(Default::default), v);
                set(ctr.cpu.get_or_insert_with(Default::default), v);
                claims.push((field, String::new(), false));
            }
        }
    }
    if let Some(p) = r.pids {
        dst.pids = Some(p);
        ctr.pids = Some(p);
        claims.push((Field::PidsLimit, String::new(), false));
    }
    for h in r.hugepage_limits {
        dst.hugepage_limits.retain(|x| x.page_size != h.page_size);
        ctr.hugepage_limits.retain(|x| x.page_size != h.page_size);
        claims.push((Field::HugepageLimits, h.page_size.clone(), false));
        dst.hugepage_limits.push(h.clone());
        ctr.hugepage_limits.push(h);
    }
    for (k, v) in r.unified {
        let (key, marked) = removal(&k);
        claims.push((Field::CgroupsUnified, key.to_string(), marked));
        if marked {
            ctr.unified.remove(key);
        } else {
            ctr.unified.insert(k.clone(), v.clone());
        }
        dst.unified.insert(k, v);
    }
}

fn device_type(t: &str) -> &str {
    if t.is_empty() { "c" } else { t }
}

/// Applies a merged adjustment to an OCI spec (as JSON).
pub(crate) fn apply(spec: &mut Value, a: &api::ContainerAdjustment) -> Result<(), String> {
    if !spec.is_object() {
        return Err("the OCI spec is not an object".into());
    }
    // Annotations.
    for (k, v) in &a.annotations {
        let anns = spec["annotations"].as_object_mut().map(|_| ()).is_some();
        if !anns {
            spec["annotations"] = json!({});
        }
        let (key, marked) = removal(k);
        let m = spec["annotations"].as_object_mut().expect("object");
        if marked {
            m.remove(key);
        } else {
            m.insert(key.to_string(), json!(v));
        }
    }
    // Mounts, replacing any at the same destination.
    if !a.mounts.is_empty() {
        let mut mounts: Vec<Value> = spec["mounts"].as_array().cloned().unwrap_or_default();
        for m in &a.mounts {
            let (dst, marked) = removal(&m.destination);
            mounts.retain(|x| x["destination"].as_str() != Some(dst));
            if !marked {
                let mut o = json!({"destination": dst, "source": m.source, "options": m.options});
                if !m.r#type.is_empty() {
                    o["type"] = json!(m.r#type);
                }
                mounts.push(o);
            }
        }
        // Parents before children, as containerd sorts them, so a mount is not hidden
        // under one mounted after it.
        mounts.sort_by_key(|m| {
            std::path::Path::new(m["destination"].as_str().unwrap_or_default())
                .components()
                .count()
        });
        spec["mounts"] = json!(mounts);
    }
    // Environment.
    if !a.env.is_empty() {
        let mut env: Vec<String> = spec["process"]["env"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        for e in &a.env {
            let (key, marked) = removal(&e.key);
            env.retain(|x| x.split_once('=').map_or(x.as_str(), |(k, _)| k) != key);
            if !marked {
                env.push(format!("{key}={}", e.value));
            }
        }
        spec["process"]["env"] = json!(env);
    }
    if !a.args.is_empty() {
        spec["process"]["args"] = json!(a.args);
    }
    if let Some(h) = &a.hooks {
        for (name, list) in [
            ("prestart", &h.prestart),
            ("createRuntime", &h.create_runtime),
            ("createContainer", &h.create_container),
            ("startContainer", &h.start_container),
            ("poststart", &h.poststart),
            ("poststop", &h.poststop),
        ] {
            if list.is_empty() {
                continue;
            }
            let mut all: Vec<Value> = spec["hooks"][name].as_array().cloned().unwrap_or_default();
            for hook in list {
                let mut o = json!({"path": hook.path});
                if !hook.args.is_empty() {
                    o["args"] = json!(hook.args);
                }
                if !hook.env.is_empty() {
                    o["env"] = json!(hook.env);
                }
                if let Some(t) = hook.timeout {
                    o["timeout"] = json!(t.value);
                }
                all.push(o);
            }
            spec["hooks"][name] = json!(all);
        }
    }
    if !a.rlimits.is_empty() {
        let mut rl: Vec<Value> = spec["process"]["rlimits"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for r in &a.rlimits {
            rl.retain(|x| x["type"].as_str() != Some(r.r#type.as_str()));
            rl.push(json!({"type": r.r#type, "hard": r.hard, "soft": r.soft}));
        }
        spec["process"]["rlimits"] = json!(rl);
    }
    if let Some(l) = &a.linux {
        apply_linux(spec, l)?;
    }
    Ok(())
}

fn apply_linux(spec: &mut Value, l: &api::LinuxContainerAdjustment) -> Result<(), String> {
    for d in &l.devices {
        let (path, marked) = removal(&d.path);
        let mut devs: Vec<Value> = spec["linux"]["devices"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        devs.retain(|x| x["path"].as_str() != Some(path));
        let mut rules: Vec<Value> = spec["linux"]["resources"]["devices"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !marked {
            let t = device_type(&d.r#type);
            if !matches!(t, "c" | "b" | "u" | "p") {
                return Err(format!("device {path}: unknown type {t:?} (c, b, u or p)"));
            }
            let mut o = json!({"path": path, "type": t, "major": d.major, "minor": d.minor});
            if let Some(m) = d.file_mode {
                o["fileMode"] = json!(m.value);
            }
            if let Some(u) = d.uid {
                o["uid"] = json!(u.value);
            }
            if let Some(g) = d.gid {
                o["gid"] = json!(g.value);
            }
            devs.push(o);
            // As containerd: an injected device is also allowed in the device cgroup.
            rules.push(json!({"allow": true, "type": t, "major": d.major, "minor": d.minor, "access": "rwm"}));
        }
        spec["linux"]["devices"] = json!(devs);
        spec["linux"]["resources"]["devices"] = json!(rules);
    }
    if !l.cgroups_path.is_empty() {
        spec["linux"]["cgroupsPath"] = json!(l.cgroups_path);
    }
    if let Some(o) = l.oom_score_adj {
        spec["process"]["oomScoreAdj"] = json!(o.value);
    }
    if let Some(r) = &l.resources {
        let res = &mut spec["linux"]["resources"];
        if let Some(m) = &r.memory {
            for (k, v) in [
                ("limit", m.limit.map(|x| json!(x.value))),
                ("reservation", m.reservation.map(|x| json!(x.value))),
                ("swap", m.swap.map(|x| json!(x.value))),
                ("swappiness", m.swappiness.map(|x| json!(x.value))),
                (
                    "disableOOMKiller",
                    m.disable_oom_killer.map(|x| json!(x.value)),
                ),
            ] {
                if let Some(v) = v {
                    res["memory"][k] = v;
                }
            }
        }
        if let Some(c) = &r.cpu {
            for (k, v) in [
                ("shares", c.shares.map(|x| json!(x.value))),
                ("quota", c.quota.map(|x| json!(x.value))),
                ("period", c.period.map(|x| json!(x.value))),
                (
                    "realtimeRuntime",
                    c.realtime_runtime.map(|x| json!(x.value)),
                ),
                ("realtimePeriod", c.realtime_period.map(|x| json!(x.value))),
                ("cpus", (!c.cpus.is_empty()).then(|| json!(c.cpus))),
                ("mems", (!c.mems.is_empty()).then(|| json!(c.mems))),
            ] {
                if let Some(v) = v {
                    res["cpu"][k] = v;
                }
            }
        }
        if let Some(p) = r.pids {
            res["pids"]["limit"] = json!(p.limit);
        }
        if !r.hugepage_limits.is_empty() {
            let mut hp: Vec<Value> = res["hugepageLimits"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for h in &r.hugepage_limits {
                hp.retain(|x| x["pageSize"].as_str() != Some(h.page_size.as_str()));
                hp.push(json!({"pageSize": h.page_size, "limit": h.limit}));
            }
            res["hugepageLimits"] = json!(hp);
        }
        for (k, v) in &r.unified {
            let (key, marked) = removal(k);
            if !res["unified"].is_object() {
                res["unified"] = json!({});
            }
            let u = res["unified"].as_object_mut().expect("object");
            if marked {
                u.remove(key);
            } else {
                u.insert(key.to_string(), json!(v));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str, v: &str) -> api::KeyValue {
        api::KeyValue {
            key: k.into(),
            value: v.into(),
        }
    }

    fn adj_env(kv: &[(&str, &str)]) -> api::ContainerAdjustment {
        api::ContainerAdjustment {
            env: kv.iter().map(|(k, v)| env(k, v)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn two_plugins_setting_one_env_variable_conflict_naming_both() {
        let mut c = api::Container {
            env: vec!["PATH=/bin".into(), "A=0".into()],
            ..Default::default()
        };
        let mut m = Merge::default();
        m.add(adj_env(&[("A", "1")]), "00-first", &mut c).unwrap();
        assert_eq!(c.env, vec!["PATH=/bin", "A=1"]);
        m.add(adj_env(&[("B", "2")]), "10-second", &mut c).unwrap();
        let err = m
            .add(adj_env(&[("A", "3")]), "10-second", &mut c)
            .unwrap_err();
        assert_eq!(
            err,
            r#"plugins "10-second" and "00-first" both tried to set Env A"#
        );
    }

    #[test]
    fn a_removed_entry_may_be_set_again_by_its_remover_only() {
        let mut c = api::Container::default();
        let mut m = Merge::default();
        m.add(adj_env(&[("-A", "")]), "00-a", &mut c).unwrap();
        m.add(adj_env(&[("A", "again")]), "00-a", &mut c).unwrap();
        let err = m.add(adj_env(&[("A", "x")]), "20-c", &mut c).unwrap_err();
        assert!(err.contains(r#""20-c" and "00-a""#), "{err}");
    }

    #[test]
    fn simple_fields_conflict_and_hooks_accumulate() {
        let mem = |limit| api::ContainerAdjustment {
            linux: Some(api::LinuxContainerAdjustment {
                resources: Some(api::LinuxResources {
                    memory: Some(api::LinuxMemory {
                        limit: Some(api::OptionalInt64 { value: limit }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                oom_score_adj: Some(api::OptionalInt { value: 500 }),
                ..Default::default()
            }),
            hooks: Some(api::Hooks {
                prestart: vec![api::Hook {
                    path: "/bin/true".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut c = api::Container::default();
        let mut m = Merge::default();
        m.add(mem(1 << 20), "00-a", &mut c).unwrap();
        let err = m.add(mem(2 << 20), "10-b", &mut c).unwrap_err();
        assert!(
            err == r#"plugins "10-b" and "00-a" both tried to set MemLimit "#
                || err == r#"plugins "10-b" and "00-a" both tried to set OomScoreAdj "#,
            "{err}"
        );
        assert_eq!(m.adjust.hooks.as_ref().unwrap().prestart.len(), 2);
    }

    #[test]
    fn adjustments_reach_the_spec() {
        let mut spec = json!({
            "process": {"args": ["sh"], "env": ["PATH=/bin", "DROP=1"]},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"resources": {"memory": {"limit": 100}}}
        });
        let mut m = Merge::default();
        let mut c = api::Container::default();
        let a = api::ContainerAdjustment {
            annotations: [("k".to_string(), "v".to_string())].into(),
            env: vec![env("INJECTED", "yes"), env("-DROP", "")],
            mounts: vec![api::Mount {
                destination: "/data".into(),
                r#type: "bind".into(),
                source: "/tmp".into(),
                options: vec!["rbind".into(), "ro".into()],
            }],
            rlimits: vec![api::PosixRlimit {
                r#type: "RLIMIT_NOFILE".into(),
                hard: 4096,
                soft: 1024,
            }],
            linux: Some(api::LinuxContainerAdjustment {
                devices: vec![api::LinuxDevice {
                    path: "/dev/nodus-null".into(),
                    r#type: "c".into(),
                    major: 1,
                    minor: 3,
                    ..Default::default()
                }],
                cgroups_path: "/custom/path".into(),
                oom_score_adj: Some(api::OptionalInt { value: 123 }),
                resources: Some(api::LinuxResources {
                    cpu: Some(api::LinuxCpu {
                        cpus: "0".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        m.add(a, "00-x", &mut c).unwrap();
        apply(&mut spec, &m.adjust).unwrap();
        assert_eq!(spec["process"]["env"], json!(["PATH=/bin", "INJECTED=yes"]));
        assert_eq!(spec["annotations"]["k"], "v");
        assert_eq!(spec["mounts"][1]["destination"], "/data");
        assert_eq!(spec["process"]["rlimits"][0]["soft"], 1024);
        assert_eq!(spec["linux"]["devices"][0]["major"], 1);
        assert_eq!(spec["linux"]["resources"]["devices"][0]["allow"], true);
        assert_eq!(spec["linux"]["cgroupsPath"], "/custom/path");
        assert_eq!(spec["process"]["oomScoreAdj"], 123);
        assert_eq!(spec["linux"]["resources"]["cpu"]["cpus"], "0");
        assert_eq!(spec["linux"]["resources"]["memory"]["limit"], 100);
        // The container the next plugin sees has them too.
        assert!(c.env.contains(&"INJECTED=yes".to_string()));
        assert_eq!(c.linux.unwrap().cgroups_path, "/custom/path");
    }

    #[test]
    fn cdi_devices_are_refused_clearly() {
        let a = api::ContainerAdjustment {
            cdi_devices: vec![api::CdiDevice {
                name: "vendor.com/gpu=0".into(),
            }],
            ..Default::default()
        };
        let err = Merge::default()
            .add(a, "00-x", &mut Default::default())
            .unwrap_err();
        assert!(err.contains("vendor.com/gpu=0"), "{err}");
    }
}
