//! Usage statistics of one cgroup: CPU time and throttling, memory usage and working set
//! (usage − inactive file, the figure the kubelet evicts on), OOM kills, process count and,
//! where the kernel has them, pressure stall (PSI) figures.

use std::path::Path;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuStats {
    /// Cumulative CPU time in nanoseconds.
    pub usage_ns: u64,
    /// CFS periods that elapsed while the cgroup had a quota and runnable tasks (`nr_periods`).
    pub periods: u64,
    /// Periods in which the cgroup hit its quota (`nr_throttled`).
    pub throttled_periods: u64,
    /// Total time throttled (`throttled_time`, or v2 `throttled_usec` × 1000).
    pub throttled_ns: u64,
}

/// One line of a PSI file: the share of wall time (percent) some/all tasks stalled over the
/// last 10, 60 and 300 seconds, and the total stall time in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PsiLine {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    pub total_us: u64,
}

/// A `*.pressure` file. `full` is absent from `cpu.pressure` on older kernels.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pressure {
    pub some: PsiLine,
    pub full: Option<PsiLine>,
}

/// PSI of a cgroup (cgroup v2 `cpu.pressure`, `memory.pressure`, `io.pressure`); each is None
/// when the kernel does not provide it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PsiStats {
    pub cpu: Option<Pressure>,
    pub memory: Option<Pressure>,
    pub io: Option<Pressure>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub usage_bytes: u64,
    pub working_set_bytes: u64,
    pub rss_bytes: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
    /// The limit, when one is set (None for "max"/unlimited).
    pub limit_bytes: Option<u64>,
    pub oom_kills: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub cpu: CpuStats,
    pub memory: MemoryStats,
    /// Processes and threads in the cgroup (`pids.current`), when the pids controller is there.
    pub pids: Option<u64>,
    pub psi: PsiStats,
}

/// Parses a PSI file (`some avg10=0.00 avg60=0.00 avg300=0.00 total=0`, then `full …`).
pub fn parse_pressure(text: &str) -> Option<Pressure> {
    let mut some = None;
    let mut full = None;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let kind = it.next();
        let mut l = PsiLine::default();
        for kv in it {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            match k {
                "avg10" => l.avg10 = v.parse().ok()?,
                "avg60" => l.avg60 = v.parse().ok()?,
                "avg300" => l.avg300 = v.parse().ok()?,
                "total" => l.total_us = v.parse().ok()?,
                _ => {}
            }
        }
        match kind {
            Some("some") => some = Some(l),
            Some("full") => full = Some(l),
            _ => {}
        }
    }
    Some(Pressure { some: some?, full })
}

/// The `*.pressure` file `file` of `dir`, when the kernel has it.
pub(crate) fn pressure(dir: &Path, file: &str) -> Option<Pressure> {
    std::fs::read_to_string(dir.join(file))
        .ok()
        .and_then(|t| parse_pressure(&t))
}

#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("cgroup {0} does not exist")]
    NotFound(String),
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

pub(crate) fn read(p: &Path) -> Result<String, StatsError> {
    std::fs::read_to_string(p).map_err(|source| StatsError::Io {
        path: p.display().to_string(),
        source,
    })
}

pub(crate) fn read_u64(p: &Path) -> Result<u64, StatsError> {
    Ok(read(p)?.trim().parse().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CgroupError;
    use crate::hierarchy::Hierarchy;

    fn read_stats(h: &Hierarchy, path: &str) -> Result<Stats, CgroupError> {
        crate::for_hierarchy(h.clone()).read_stats(path)
    }

    fn write(p: &Path, s: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    }

    #[test]
    fn v1_working_set_is_usage_minus_inactive_file() {
        let d = tempfile::tempdir().unwrap();
        let h = Hierarchy::v1(d.path());
        let mem = d.path().join("memory/kubepods/c1");
        write(
            &mem.join("memory.stat"),
            "total_inactive_file 100\ntotal_rss 300\ntotal_pgfault 7\n",
        );
        write(&mem.join("memory.usage_in_bytes"), "1000\n");
        write(&mem.join("memory.limit_in_bytes"), "9223372036854771712\n");
        write(
            &mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        );
        write(
            &d.path().join("cpuacct/kubepods/c1/cpuacct.usage"),
            "5000\n",
        );
        write(
            &d.path().join("cpu/kubepods/c1/cpu.stat"),
            "nr_periods 4\nnr_throttled 1\nthrottled_time 9\n",
        );
        let s = read_stats(&h, "/kubepods/c1").unwrap();
        assert_eq!(s.memory.working_set_bytes, 900);
        assert_eq!(s.memory.rss_bytes, 300);
        assert_eq!(s.memory.limit_bytes, None);
        assert_eq!(s.memory.oom_kills, 2);
        assert_eq!(s.cpu.usage_ns, 5000);
        assert_eq!(s.cpu.throttled_periods, 1);
    }

    #[test]
    fn v2_reads_the_unified_files() {
        let d = tempfile::tempdir().unwrap();
        write(&d.path().join("cgroup.controllers"), "cpu memory\n");
        let h = Hierarchy::detect_at(d.path());
        assert!(h.is_v2());
        let c = d.path().join("kubepods/c1");
        write(&c.join("memory.stat"), "anon 50\ninactive_file 20\n");
        write(&c.join("memory.current"), "200\n");
        write(&c.join("memory.max"), "1048576\n");
        write(&c.join("memory.events"), "oom 1\noom_kill 1\n");
        write(
            &c.join("cpu.stat"),
            "usage_usec 3\nnr_throttled 2\nthrottled_usec 4\n",
        );
        let s = read_stats(&h, "kubepods/c1").unwrap();
        assert_eq!(s.memory.working_set_bytes, 180);
        assert_eq!(s.memory.limit_bytes, Some(1048576));
        assert_eq!(s.cpu.usage_ns, 3000);
        assert_eq!(s.cpu.throttled_ns, 4000);
        assert_eq!(s.memory.oom_kills, 1);
    }

    #[test]
    fn missing_cgroup_is_not_found() {
        let d = tempfile::tempdir().unwrap();
        let h = Hierarchy::v1(d.path());
        assert!(matches!(
            read_stats(&h, "nope"),
            Err(CgroupError::Stats(StatsError::NotFound(_)))
        ));
    }

    #[test]
    fn pressure_lines_are_parsed() {
        let p = parse_pressure(
            "some avg10=1.50 avg60=0.25 avg300=0.00 total=12345\n\
             full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n",
        )
        .unwrap();
        assert_eq!(p.some.avg10, 1.5);
        assert_eq!(p.some.avg60, 0.25);
        assert_eq!(p.some.total_us, 12345);
        assert_eq!(p.full.unwrap().total_us, 7);
        let cpu_only = parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=3\n").unwrap();
        assert_eq!(cpu_only.full, None);
        assert_eq!(parse_pressure(""), None);
        assert_eq!(parse_pressure("some avg10=x total=1\n"), None);
    }

    #[test]
    fn v2_psi_and_pids_are_read_when_present() {
        let d = tempfile::tempdir().unwrap();
        write(&d.path().join("cgroup.controllers"), "cpu memory\n");
        let h = Hierarchy::detect_at(d.path());
        let c = d.path().join("p");
        write(&c.join("memory.current"), "0\n");
        write(&c.join("pids.current"), "3\n");
        write(
            &c.join("memory.pressure"),
            "some avg10=2.00 avg60=0.00 avg300=0.00 total=9\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=4\n",
        );
        let s = read_stats(&h, "p").unwrap();
        assert_eq!(s.pids, Some(3));
        assert_eq!(s.psi.memory.unwrap().full.unwrap().avg10, 1.0);
        assert_eq!(s.psi.cpu, None);
        assert_eq!(s.psi.io, None);
    }
}
