//! Creates and deletes the cgroup set of N pods under a scratch root on this machine and
//! prints the time taken: `cargo run -p nodus-cgroups --example cgroup_churn -- 100`.
//! Needs root. Everything it creates is removed before it exits.

use nodus_cgroups::Resources;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(100);
    let m = nodus_cgroups::detect();
    let root = format!("nodus-churn-{}", std::process::id());
    m.create(&format!("{root}/kubepods/burstable"), &Resources::default())?;
    let pod = |i: usize| format!("{root}/kubepods/burstable/pod{i:04}");
    let r = Resources {
        cpu_shares: Some(102),
        cpu_quota: Some(50_000),
        cpu_period: Some(100_000),
        memory_limit: Some(64 << 20),
        pids_limit: Some(1024),
        ..Default::default()
    };
    let t = Instant::now();
    for i in 0..n {
        m.create(&pod(i), &r)?;
    }
    let created = t.elapsed();
    let t = Instant::now();
    for i in 0..n {
        m.delete(&pod(i))?;
    }
    let deleted = t.elapsed();
    m.delete(&root)?;
    println!(
        "{n} pod cgroups: create {:?} ({:?}/pod), delete {:?} ({:?}/pod)",
        created,
        created / n.max(1) as u32,
        deleted,
        deleted / n.max(1) as u32
    );
    Ok(())
}
