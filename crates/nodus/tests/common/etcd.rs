//! Control planes as host processes on free 127.0.0.1 ports against a real etcd member
//! (Debian's, [`EtcdServer`]), driven by the real kubectl; each process and etcd stopped by
//! PID on drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A `nodus control-plane` process, killed (SIGKILL) by PID and reaped on drop.
pub struct Killer {
    pub child: Child,
    /// Its stderr (the log).
    pub log: PathBuf,
}

impl Killer {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it with `signal` and waits for it to exit.
    pub fn signal(&mut self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap_or_else(|e| panic!("kill {pid}: {e}"));
        let _ = self.child.wait();
    }
}

impl Drop for Killer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `nodus control-plane` on `port` with its objects in `etcd`, plus `extra` flags; its log
/// goes to `<dir>.log`. Returns once it printed its startup line.
pub fn control_plane(dir: &Path, port: u16, etcd: &str, extra: &[&str]) -> Killer {
    let log = dir.with_extension("log");
    let err = std::fs::File::create(&log).expect("log file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args(["control-plane", "--data-dir"])
        .arg(dir)
        .args(["--secure-port", &port.to_string()])
        .args(["--etcd-servers", etcd, "--request-timeout", "10s"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .expect("nodus control-plane starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read");
    let k = Killer { child, log };
    assert!(
        line.contains("API server at"),
        "startup line: {line:?}\n{}",
        k.log()
    );
    k
}

/// kubectl as the admin: (success, stdout, stderr).
pub fn kubectl(
    kubeconfig: &Path,
    home: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String, String) {
    let mut c = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=30s")
        .args(args)
        .env("HOME", home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    if let Some(mut i) = c.stdin.take() {
        let _ = i.write_all(stdin.unwrap_or("").as_bytes());
    }
    let out = c.wait_with_output().expect("kubectl output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A request to etcd's own JSON gateway (`/v3/...`), as etcdctl would make it.
pub fn etcd_http(port: u16, path: &str, body: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("etcd");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

pub fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}
