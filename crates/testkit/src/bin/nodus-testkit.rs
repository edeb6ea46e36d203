//! `nodus-testkit`: testkit's fixtures from the command line, for the demo script and
//! benchmarks that are shell scripts.
//!
//! ```text
//! nodus-testkit registry [--push IMAGE=REPO:TAG]... [--ready-file F]
//!     starts a real docker-registry on 127.0.0.1, pushes the named ready-made images,
//!     writes "HOST" to F (or stdout) and serves until SIGTERM/SIGINT or stdin closes.
//! nodus-testkit archive IMAGE FILE NAME
//!     writes a ready-made image as an OCI archive named NAME.
//! ```
//! IMAGE is one of: busybox, whiteout, large.

use anyhow::{Context, Result, bail};
use testkit::Registry;
use testkit::image::{busybox, large_image, whiteout_image};

fn image(name: &str) -> Result<testkit::Image> {
    Ok(match name {
        "busybox" => busybox(),
        "web" => testkit::image::busybox::web(),
        "whiteout" => whiteout_image(),
        "large" => large_image(),
        other => bail!("unknown image {other:?}: use busybox, web, whiteout or large"),
    })
}

async fn registry(args: &[String]) -> Result<()> {
    let mut pushes = Vec::new();
    let mut ready = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--push" => {
                let v = it.next().context("--push needs IMAGE=REPO:TAG")?;
                let (img, target) = v.split_once('=').context("--push needs IMAGE=REPO:TAG")?;
                let (repo, tag) = target.rsplit_once(':').context("--push needs REPO:TAG")?;
                pushes.push((img.to_string(), repo.to_string(), tag.to_string()));
            }
            "--ready-file" => ready = Some(it.next().context("--ready-file needs a path")?.clone()),
            other => bail!("unknown argument {other:?}"),
        }
    }
    let reg = Registry::start()?;
    for (img, repo, tag) in &pushes {
        let i = image(img)?;
        reg.push(repo, tag, &i).await?;
        eprintln!("pushed {img} as {}/{repo}:{tag}", reg.host());
    }
    match ready {
        Some(f) => std::fs::write(&f, reg.host()).with_context(|| format!("writing {f}"))?,
        None => println!("{}", reg.host()),
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stdin_closed = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    });
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = stdin_closed => {}
    }
    drop(reg);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("registry") => registry(&args[1..]).await,
        Some("archive") if args.len() == 4 => {
            image(&args[1])?.write_oci_archive(std::path::Path::new(&args[2]), &args[3])
        }
        _ => bail!(
            "usage: nodus-testkit registry [--push IMAGE=REPO:TAG]... [--ready-file F] | archive IMAGE FILE NAME"
        ),
    }
}
