//! `/logs/`: the node's own log files under `/var/log`, read-only (upstream's system log
//! handler, `enableSystemLogHandler`), authorized as `nodes/log`. Directories are listed
//! as links; nothing outside the log directory can be named.

use super::text;
use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::path::{Component, PathBuf};

/// Where the node's logs live.
pub const LOG_DIR: &str = "/var/log";

/// The file or directory `rel` names inside `root`, if it stays inside.
pub fn resolve(root: &std::path::Path, rel: &str) -> Option<PathBuf> {
    let rel = std::path::Path::new(rel.trim_start_matches('/'));
    if rel
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return None;
    }
    let p = root.join(rel);
    // A symlink must not lead out of the directory either.
    let real = std::fs::canonicalize(&p).ok()?;
    let real_root = std::fs::canonicalize(root).ok()?;
    real.starts_with(&real_root).then_some(real)
}

fn serve(rel: &str) -> Response {
    let Some(p) = resolve(std::path::Path::new(LOG_DIR), rel) else {
        return text(StatusCode::NOT_FOUND, "404 page not found\n".into());
    };
    if p.is_dir() {
        let mut names: Vec<String> = std::fs::read_dir(&p)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| {
                let mut n = e.file_name().to_string_lossy().into_owned();
                if e.path().is_dir() {
                    n.push('/');
                }
                n
            })
            .collect();
        names.sort();
        let body: String = names
            .iter()
            .map(|n| format!("<a href=\"{n}\">{n}</a>\n"))
            .collect();
        return (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            format!("<pre>\n{body}</pre>\n"),
        )
            .into_response();
    }
    match std::fs::read(&p) {
        Ok(b) => ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], b).into_response(),
        Err(e) => text(StatusCode::NOT_FOUND, format!("{e}\n")),
    }
}

/// GET /logs/
pub async fn index() -> Response {
    serve("")
}

/// GET /logs/{*path}
pub async fn file(Path(rel): Path<String>) -> Response {
    serve(&rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_log_dir() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a.log"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", d.path().join("out")).unwrap();
        assert!(resolve(d.path(), "a.log").is_some());
        assert!(resolve(d.path(), "../etc/passwd").is_none());
        assert!(resolve(d.path(), "out/passwd").is_none());
        assert!(resolve(d.path(), "").is_some());
    }
}
