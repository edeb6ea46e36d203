//! Resource usage: stats (containers) and statsp (pods). The table samples twice,
//! `--seconds` apart, for the CPU percentage.

use crate::format::{Output, human_size4, table, trunc13, write_message};
use crate::util::{io, parse_labels};
use crate::{Clients, CrictlError, rpc};
use clap::Args;
use cri::runtime::v1::{
    ContainerStats, ContainerStatsFilter, ListContainerStatsRequest, ListContainerStatsResponse,
    ListPodSandboxStatsRequest, ListPodSandboxStatsResponse, PodSandboxStats,
    PodSandboxStatsFilter,
};
use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

#[derive(Debug, Args, Clone)]
pub struct StatsArgs {
    /// Container id (same as --id).
    #[arg(value_name = "ID")]
    pub container: Option<String>,
    /// Show all containers (default shows just running).
    #[arg(short, long)]
    pub all: bool,
    /// Filter by container id.
    #[arg(long)]
    pub id: Option<String>,
    /// Filter by pod id.
    #[arg(short, long)]
    pub pod: Option<String>,
    /// Filter by key=value label.
    #[arg(long = "label")]
    pub label: Vec<String>,
    /// Output format: json, yaml or table.
    #[arg(short, long)]
    pub output: Option<String>,
    /// Sample duration for CPU usage in seconds.
    #[arg(short, long, default_value_t = 1)]
    pub seconds: u64,
    /// Watch resources (until interrupted).
    #[arg(short, long)]
    pub watch: bool,
}

#[derive(Debug, Args, Clone)]
pub struct StatspArgs {
    /// Pod id (same as --id).
    #[arg(value_name = "ID")]
    pub pod: Option<String>,
    /// Filter by pod id.
    #[arg(long)]
    pub id: Option<String>,
    /// Filter by key=value label.
    #[arg(long = "label")]
    pub label: Vec<String>,
    /// Output format: json, yaml or table.
    #[arg(short, long)]
    pub output: Option<String>,
    /// Sample duration for CPU usage in seconds.
    #[arg(short, long, default_value_t = 1)]
    pub seconds: u64,
    /// Watch pod resources (until interrupted).
    #[arg(short, long)]
    pub watch: bool,
}

const CLEAR_SCREEN: &str = "\x1b[2J\x1b[H";

fn id_of_container(s: &ContainerStats) -> &str {
    s.attributes.as_ref().map(|a| a.id.as_str()).unwrap_or("")
}

fn id_of_pod(s: &PodSandboxStats) -> &str {
    s.attributes.as_ref().map(|a| a.id.as_str()).unwrap_or("")
}

fn cpu_percent(cpu: u64, old_cpu: u64, ts: i64, old_ts: i64) -> Result<f64, CrictlError> {
    if cpu == 0 {
        return Ok(0.0);
    }
    let duration = ts - old_ts;
    if duration == 0 {
        return Err(CrictlError::Other(
            "cpu stat is not updated during sample".into(),
        ));
    }
    Ok(cpu.wrapping_sub(old_cpu) as i64 as f64 / duration as f64 * 100.0)
}

/// The `crictl stats` table from two samples.
pub fn container_stats_table(
    old: &[ContainerStats],
    new: &[ContainerStats],
    all: bool,
) -> Result<String, CrictlError> {
    let old: HashMap<&str, &ContainerStats> = old.iter().map(|s| (id_of_container(s), s)).collect();
    let mut rows = vec![
        ["CONTAINER", "NAME", "CPU %", "MEM", "DISK", "INODES"]
            .map(String::from)
            .to_vec(),
    ];
    for s in new {
        let id = id_of_container(s);
        let name = s
            .attributes
            .as_ref()
            .and_then(|a| a.metadata.as_ref())
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let cpu_of = |s: &ContainerStats| {
            let c = s.cpu.as_ref();
            (
                c.and_then(|c| c.usage_core_nano_seconds.as_ref())
                    .map(|v| v.value)
                    .unwrap_or(0),
                c.map(|c| c.timestamp).unwrap_or(0),
            )
        };
        let (cpu, ts) = cpu_of(s);
        let mem = s
            .memory
            .as_ref()
            .and_then(|m| m.working_set_bytes.as_ref())
            .map(|v| v.value)
            .unwrap_or(0);
        let wl = s.writable_layer.as_ref();
        let disk = wl
            .and_then(|w| w.used_bytes.as_ref())
            .map(|v| v.value)
            .unwrap_or(0);
        let inodes = wl
            .and_then(|w| w.inodes_used.as_ref())
            .map(|v| v.value)
            .unwrap_or(0);
        if !all && cpu == 0 && mem == 0 {
            // Not running.
            continue;
        }
        let Some(o) = old.get(id) else {
            // Appeared during the sample.
            continue;
        };
        let (old_cpu, old_ts) = cpu_of(o);
        let pct = cpu_percent(cpu, old_cpu, ts, old_ts)?;
        rows.push(vec![
            trunc13(id),
            name,
            format!("{pct:.2}"),
            human_size4(mem),
            human_size4(disk),
            inodes.to_string(),
        ]);
    }
    Ok(table(&rows))
}

/// The `crictl statsp` table from two samples.
pub fn pod_stats_table(
    old: &[PodSandboxStats],
    new: &[PodSandboxStats],
) -> Result<String, CrictlError> {
    let old: HashMap<&str, &PodSandboxStats> = old.iter().map(|s| (id_of_pod(s), s)).collect();
    let mut rows = vec![["POD", "POD ID", "CPU %", "MEM"].map(String::from).to_vec()];
    let usage = |s: &PodSandboxStats| -> Result<(u64, u64, i64), CrictlError> {
        match (&s.linux, &s.windows) {
            (Some(_), Some(_)) => Err(CrictlError::Other(format!(
                "pod {:?} has both linux and windows stats which is not supported",
                trunc13(id_of_pod(s))
            ))),
            (Some(l), None) => Ok((
                l.cpu
                    .as_ref()
                    .and_then(|c| c.usage_core_nano_seconds.as_ref())
                    .map(|v| v.value)
                    .unwrap_or(0),
                l.memory
                    .as_ref()
                    .and_then(|m| m.working_set_bytes.as_ref())
                    .map(|v| v.value)
                    .unwrap_or(0),
                l.cpu.as_ref().map(|c| c.timestamp).unwrap_or(0),
            )),
            (None, Some(w)) => Ok((
                w.cpu
                    .as_ref()
                    .and_then(|c| c.usage_core_nano_seconds.as_ref())
                    .map(|v| v.value)
                    .unwrap_or(0),
                w.memory
                    .as_ref()
                    .and_then(|m| m.working_set_bytes.as_ref())
                    .map(|v| v.value)
                    .unwrap_or(0),
                w.cpu.as_ref().map(|c| c.timestamp).unwrap_or(0),
            )),
            (None, None) => Ok((0, 0, 0)),
        }
    };
    for s in new {
        let id = id_of_pod(s);
        let (cpu, mem, ts) = usage(s)?;
        if cpu == 0 && mem == 0 {
            continue;
        }
        let Some(o) = old.get(id) else { continue };
        let (old_cpu, _, old_ts) = usage(o)?;
        let pct = cpu_percent(cpu, old_cpu, ts, old_ts)?;
        let name = s
            .attributes
            .as_ref()
            .and_then(|a| a.metadata.as_ref())
            .map(|m| m.name.clone())
            .unwrap_or_default();
        rows.push(vec![
            name,
            trunc13(id),
            format!("{pct:.2}"),
            human_size4(mem),
        ]);
    }
    Ok(table(&rows))
}

async fn container_stats(
    c: &Clients,
    filter: &ContainerStatsFilter,
) -> Result<Vec<ContainerStats>, CrictlError> {
    let mut stats = c
        .runtime
        .clone()
        .list_container_stats(ListContainerStatsRequest {
            filter: Some(filter.clone()),
        })
        .await
        .map_err(rpc("get container stats"))?
        .into_inner()
        .stats;
    stats.sort_by(|a, b| id_of_container(a).cmp(id_of_container(b)));
    Ok(stats)
}

async fn pod_stats(
    c: &Clients,
    filter: &PodSandboxStatsFilter,
) -> Result<Vec<PodSandboxStats>, CrictlError> {
    let mut stats = c
        .runtime
        .clone()
        .list_pod_sandbox_stats(ListPodSandboxStatsRequest {
            filter: Some(filter.clone()),
        })
        .await
        .map_err(rpc("get pod stats: list pod sandbox stats"))?
        .into_inner()
        .stats;
    stats.sort_by(|a, b| id_of_pod(a).cmp(id_of_pod(b)));
    Ok(stats)
}

/// Runs `frame` once, or every half second until interrupted with `--watch`.
async fn display<F, Fut>(watch: bool, mut frame: F) -> Result<(), CrictlError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), CrictlError>>,
{
    if !watch {
        return frame().await;
    }
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => return Ok(()),
            r = async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                frame().await
            } => r?,
        }
    }
}

pub async fn stats(
    c: &Clients,
    a: StatsArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    let output = Output::parse(a.output.as_deref(), Output::Table)?;
    let filter = ContainerStatsFilter {
        id: a.id.clone().or(a.container.clone()).unwrap_or_default(),
        pod_sandbox_id: a.pod.clone().unwrap_or_default(),
        label_selector: parse_labels(&a.label)?,
    };
    let out = &std::sync::Mutex::new(out);
    let filter = &filter;
    let (all, watch, seconds) = (a.all, a.watch, a.seconds);
    display(watch, || async move {
        let first = container_stats(c, filter).await?;
        if output != Output::Table {
            let resp = ListContainerStatsResponse { stats: first };
            let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
            return write_message(
                &mut **o,
                output,
                "runtime.v1.ListContainerStatsResponse",
                &resp,
            )
            .map_err(io);
        }
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let second = container_stats(c, filter).await?;
        let text = container_stats_table(&first, &second, all)?;
        let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
        if watch {
            write!(o, "{CLEAR_SCREEN}").map_err(io)?;
        }
        write!(o, "{text}").map_err(io)?;
        o.flush().map_err(io)
    })
    .await
}

pub async fn statsp(
    c: &Clients,
    a: StatspArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    let output = Output::parse(a.output.as_deref(), Output::Table)?;
    let filter = PodSandboxStatsFilter {
        id: a.id.clone().or(a.pod.clone()).unwrap_or_default(),
        label_selector: parse_labels(&a.label)?,
    };
    let out = &std::sync::Mutex::new(out);
    let filter = &filter;
    let (watch, seconds) = (a.watch, a.seconds);
    display(watch, || async move {
        let first = pod_stats(c, filter).await?;
        if output != Output::Table {
            let resp = ListPodSandboxStatsResponse { stats: first };
            let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
            return write_message(
                &mut **o,
                output,
                "runtime.v1.ListPodSandboxStatsResponse",
                &resp,
            )
            .map_err(io);
        }
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let second = pod_stats(c, filter).await?;
        let text = pod_stats_table(&first, &second)?;
        let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
        if watch {
            write!(o, "{CLEAR_SCREEN}").map_err(io)?;
        }
        write!(o, "{text}").map_err(io)?;
        o.flush().map_err(io)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use cri::runtime::v1::{
        ContainerAttributes, ContainerMetadata, CpuUsage, LinuxPodSandboxStats, MemoryUsage,
        PodSandboxAttributes, PodSandboxMetadata, UInt64Value,
    };

    fn cstats(id: &str, cpu: u64, ts: i64, mem: u64) -> ContainerStats {
        ContainerStats {
            attributes: Some(ContainerAttributes {
                id: id.into(),
                metadata: Some(ContainerMetadata {
                    name: format!("n-{id}"),
                    attempt: 0,
                }),
                ..Default::default()
            }),
            cpu: Some(CpuUsage {
                timestamp: ts,
                usage_core_nano_seconds: Some(UInt64Value { value: cpu }),
                ..Default::default()
            }),
            memory: Some(MemoryUsage {
                timestamp: ts,
                working_set_bytes: Some(UInt64Value { value: mem }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn container_table_computes_cpu_and_skips_idle() {
        let old = vec![
            cstats("aaaaaaaaaaaaaaaa", 1_000_000_000, 1_000_000_000, 0),
            cstats("bbbb", 0, 0, 0),
        ];
        let new = vec![
            cstats("aaaaaaaaaaaaaaaa", 1_250_000_000, 2_000_000_000, 4_261_550),
            cstats("bbbb", 0, 0, 0),
            cstats("cccc", 5, 5, 5),
        ];
        let t = container_stats_table(&old, &new, false).unwrap();
        let lines: Vec<Vec<&str>> = t
            .lines()
            .map(|l| {
                l.split("  ")
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .collect();
        assert_eq!(
            lines[0],
            ["CONTAINER", "NAME", "CPU %", "MEM", "DISK", "INODES"]
        );
        assert_eq!(
            lines[1],
            [
                "aaaaaaaaaaaaa",
                "n-aaaaaaaaaaaaaaaa",
                "25.00",
                "4.262MB",
                "0B",
                "0"
            ]
        );
        assert_eq!(lines.len(), 2, "idle and new containers are skipped: {t}");
        let t = container_stats_table(&old, &new, true).unwrap();
        assert!(t.contains("bbbb"), "{t}");
        assert!(
            container_stats_table(&[cstats("x", 1, 5, 1)], &[cstats("x", 2, 5, 1)], false).is_err()
        );
        // Header only when there is nothing to show.
        assert_eq!(
            container_stats_table(&[], &[], false).unwrap().trim_end(),
            "CONTAINER           NAME                CPU %               MEM                 DISK                INODES"
        );
    }

    #[test]
    fn pod_table() {
        let p = |cpu: u64, ts: i64| PodSandboxStats {
            attributes: Some(PodSandboxAttributes {
                id: "0123456789abcdef".into(),
                metadata: Some(PodSandboxMetadata {
                    name: "web".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            linux: Some(LinuxPodSandboxStats {
                cpu: Some(CpuUsage {
                    timestamp: ts,
                    usage_core_nano_seconds: Some(UInt64Value { value: cpu }),
                    ..Default::default()
                }),
                memory: Some(MemoryUsage {
                    working_set_bytes: Some(UInt64Value { value: 1536 }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            windows: None,
        };
        let t = pod_stats_table(&[p(0, 0)], &[p(500_000_000, 1_000_000_000)]).unwrap();
        let row: Vec<&str> = t.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(row, ["web", "0123456789abc", "50.00", "1.536kB"]);
        assert!(t.starts_with("POD                 POD ID              CPU %               MEM"));
    }
}
