//! Pull + unpack of testkit's ~100 MB multi-layer image from a local registry, cold store,
//! `nodus runtime` vs containerd's CRI plugin, both driven through the same CRI PullImage
//! call. Each run starts a fresh daemon with an empty root; the order alternates so neither
//! always gets the warmer page cache. Reports the median, min and max wall time of the RPC
//! and the daemon's peak RSS (VmHWM) after the pull.

use anyhow::{Context, Result, bail};
use cri::runtime::v1 as pb;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use testkit::daemon::Daemon;
use testkit::{CertsD, Containerd, Registry};

struct Sample {
    secs: f64,
    peak_rss_kib: u64,
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

async fn timed_pull(endpoint: &str, image: &str) -> Result<f64> {
    let c = nodus_crictl::connect(endpoint, None, Duration::from_secs(10)).await?;
    // Flush earlier runs' dirty pages so they are not charged to this one.
    let _ = Command::new("sync").status();
    let start = Instant::now();
    c.image
        .clone()
        .pull_image(pb::PullImageRequest {
            image: Some(pb::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        })
        .await
        .with_context(|| format!("PullImage {image} on {endpoint}"))?;
    Ok(start.elapsed().as_secs_f64())
}

async fn run_nodus(bin: &Path, certs: &Path, image: &str) -> Result<Sample> {
    let dir = tempfile::Builder::new().prefix("bench-nodus-").tempdir()?;
    let sock = dir.path().join("nodus.sock");
    let cfg = dir.path().join("runtime.toml");
    std::fs::write(
        &cfg,
        format!(
            "registry-config-dir = \"{}\"\n{}",
            certs.display(),
            testkit::runtime_config::private_nri(dir.path(), "")
        ),
    )?;
    let mut cmd = Command::new(bin);
    cmd.arg("runtime")
        .arg("--listen")
        .arg(&sock)
        .arg("--root-dir")
        .arg(dir.path().join("root"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--config")
        .arg(&cfg)
        .env("NODUS_LOG", "warn");
    let mut d = Daemon::spawn(
        "nodus-runtime",
        cmd,
        &dir.path().join("log"),
        Duration::from_secs(5),
    )?;
    d.wait_ready(Duration::from_secs(30), || {
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    })?;
    let secs = timed_pull(&format!("unix://{}", sock.display()), image).await?;
    let rss = peak_rss_kib(d.pid());
    d.stop();
    Ok(Sample {
        secs,
        peak_rss_kib: rss,
    })
}

async fn run_containerd(certs: &Path, image: &str) -> Result<Sample> {
    let c = Containerd::start(Some(certs))?;
    let secs = timed_pull(&c.endpoint(), image).await?;
    let rss = peak_rss_kib(c.pid());
    Ok(Sample {
        secs,
        peak_rss_kib: rss,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn summary(name: &str, s: &[Sample]) -> (String, f64) {
    let t: Vec<f64> = s.iter().map(|x| x.secs).collect();
    let med = median(t.clone());
    let min = t.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = t.iter().cloned().fold(0.0, f64::max);
    let rss = median(s.iter().map(|x| x.peak_rss_kib as f64).collect()) / 1024.0;
    (
        format!("| {name} | {med:.3} s | {min:.3} s | {max:.3} s | {rss:.1} MiB |"),
        med,
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut runs = 7usize;
    let mut write: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => runs = args.next().context("--runs N")?.parse()?,
            "--write" => write = Some(args.next().context("--write FILE")?.into()),
            other => bail!("unknown argument {other:?}"),
        }
    }
    let bin =
        PathBuf::from(std::env::var("NODUS_BIN").context("set NODUS_BIN to the nodus binary")?);
    let image = testkit::image::large_image();
    let compressed: u64 = image.layers.iter().map(|l| l.size()).sum();
    let uncompressed: u64 = image.layers.iter().map(|l| l.uncompressed_size).sum();
    let reg = Registry::start()?;
    reg.push("bench/large", "1", &image).await?;
    let certs = CertsD::new()?;
    certs.add(&reg.host(), Some(&format!("http://{}", reg.host())), &[])?;
    let name = format!("{}/bench/large:1", reg.host());

    // One untimed pull each warms the registry's page cache and the binaries.
    run_nodus(&bin, certs.path(), &name).await?;
    run_containerd(certs.path(), &name).await?;

    let (mut n, mut c) = (Vec::new(), Vec::new());
    for i in 0..runs {
        if i % 2 == 0 {
            n.push(run_nodus(&bin, certs.path(), &name).await?);
            c.push(run_containerd(certs.path(), &name).await?);
        } else {
            c.push(run_containerd(certs.path(), &name).await?);
            n.push(run_nodus(&bin, certs.path(), &name).await?);
        }
        eprintln!(
            "run {}: nodus {:.3}s, containerd {:.3}s",
            i + 1,
            n.last().map(|s| s.secs).unwrap_or(0.0),
            c.last().map(|s| s.secs).unwrap_or(0.0)
        );
    }
    let (nl, nm) = summary("nodus runtime", &n);
    let (cl, cm) = summary(&format!("containerd {}", containerd_version()), &c);
    let date = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let body = format!(
        "Image: testkit `large_image()`, {} layers, {:.1} MB compressed (gzip), {:.1} MB \
         uncompressed, ~4,000 files; served by docker-registry on 127.0.0.1; cold store each \
         run (fresh daemon, empty root); CRI PullImage wall time including unpack. {runs} \
         runs each, order alternating; {date}; {} cores.\n\n\
         | runtime | median | min | max | daemon peak RSS (median) |\n| --- | --- | --- | --- | --- |\n{nl}\n{cl}\n\n\
         nodus / containerd median: **{:.2}×** ({}).\n",
        image.layers.len(),
        compressed as f64 / 1e6,
        uncompressed as f64 / 1e6,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        nm / cm,
        if nm <= cm {
            "nodus is faster"
        } else {
            "nodus is slower"
        },
    );
    println!("{body}");
    if let Some(p) = write {
        nodus_bench::write_section(
            &p,
            "image-pull",
            "## Image pull + unpack (`bash bench/image-pull.sh`)",
            &body,
        )?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

fn containerd_version() -> String {
    Command::new("containerd")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(2)
                .map(str::to_string)
        })
        .unwrap_or_default()
}
