//! The per-container shim against the real runc: bundles built by hand from the host's
//! static busybox, the shim started through `spawn` (this test binary doubles as the shim
//! executable, see `shim_hook`), the container started with `runc start` as the daemon
//! would, then what a user sees: CRI log lines, exit.json, attach, TTY, log rotation, OOM.

use std::ffi::{CStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use nodus_runtime::shim::{
    self, AttachEvent, ExitStatus, InitStatus, ShimArgs, ShimClient, ShimError, SpawnedShim,
};
use serde_json::json;

const RUNC: &str = "/usr/sbin/runc";

// ---------------------------------------------------------------------------------------
// This test binary is also the shim: `spawn` runs `<exe> shim …`, and the hook below runs
// before libtest's main to serve that (and `spawn-helper`, a process that spawns a shim
// and exits at once).

#[used]
#[unsafe(link_section = ".init_array")]
static SHIM_HOOK: extern "C" fn(
    libc::c_int,
    *const *const libc::c_char,
    *const *const libc::c_char,
) = shim_hook;

extern "C" fn shim_hook(
    argc: libc::c_int,
    argv: *const *const libc::c_char,
    _envp: *const *const libc::c_char,
) {
    if argc < 2 || argv.is_null() {
        return;
    }
    // SAFETY: the C runtime passes argc valid NUL-terminated strings in argv.
    let args: Vec<OsString> = (0..argc as usize)
        .map(|i| unsafe {
            use std::os::unix::ffi::OsStrExt;
            std::ffi::OsStr::from_bytes(CStr::from_ptr(*argv.add(i)).to_bytes()).to_os_string()
        })
        .collect();
    // `spawn` always passes `--id` first; a bare `shim` is libtest's name filter.
    if args.get(2).and_then(|a| a.to_str()) != Some("--id") {
        return;
    }
    match args[1].to_str() {
        Some("shim") => {
            let args = shim::parse_args(&args[1..]).unwrap_or_else(|e| e.exit());
            let code = shim::main(args);
            std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
        }
        Some("spawn-helper") => {
            let args = shim::parse_args(&args[1..]).unwrap_or_else(|e| e.exit());
            let exe = std::env::current_exe().expect("current exe");
            match shim::spawn(&exe, &args) {
                Ok(s) => {
                    println!("{} {}", s.shim_pid, s.init_pid);
                    std::process::exit(0)
                }
                Err(e) => {
                    println!("error {e}");
                    std::process::exit(1)
                }
            }
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------

fn have_root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root && std::env::var_os("NODUS_TEST_REQUIRE_ROOT").is_some() {
        panic!("this test needs root and NODUS_TEST_REQUIRE_ROOT is set");
    }
    if root && !Path::new(RUNC).exists() {
        panic!("{RUNC} is missing: install Debian's runc");
    }
    root
}

/// One container under test: its bundle, runc root and shim state dir, removed (container,
/// cgroup, shim) on drop, also when the test panics.
struct Case {
    dir: tempfile::TempDir,
    id: String,
    cgroup: String,
    state: PathBuf,
    shim_pid: Option<i32>,
}

struct Opts<'a> {
    args: &'a [&'a str],
    tty: bool,
    stdin: bool,
    stdin_once: bool,
    memory_limit: Option<i64>,
}

impl Default for Opts<'_> {
    fn default() -> Self {
        Opts {
            args: &["true"],
            tty: false,
            stdin: false,
            stdin_once: false,
            memory_limit: None,
        }
    }
}

impl Case {
    fn new(name: &str, opts: &Opts<'_>) -> Case {
        let dir = tempfile::Builder::new()
            .prefix("nodus-shim-test-")
            .tempdir()
            .unwrap();
        let suffix: u32 = rand::random();
        let id = format!("nodus-shim-{name}-{suffix:08x}");
        let case = Case {
            cgroup: format!("/nodus-shim-test-{name}-{suffix:08x}"),
            id,
            state: dir.path().join("state"),
            dir,
            shim_pid: None,
        };
        let bundle = case.bundle();
        let bin = bundle.join("rootfs/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::copy("/bin/busybox", bin.join("busybox")).unwrap();
        for applet in [
            "sh", "echo", "sleep", "cat", "head", "tr", "printf", "stty", "kill", "true", "yes",
        ] {
            std::fs::hard_link(bin.join("busybox"), bin.join(applet)).unwrap();
        }
        let out = Command::new(RUNC)
            .arg("spec")
            .current_dir(&bundle)
            .output()
            .unwrap();
        assert!(out.status.success(), "runc spec: {out:?}");
        let path = bundle.join("config.json");
        let mut spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        spec["process"]["args"] = json!(opts.args);
        spec["process"]["terminal"] = json!(opts.tty);
        spec["process"]["env"] = json!(["PATH=/bin", "TERM=xterm"]);
        // This machine cannot lower oom_score_adj: never ask for less than we have.
        let own: i64 = std::fs::read_to_string("/proc/self/oom_score_adj")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let wanted = spec["process"]["oomScoreAdj"].as_i64().unwrap_or(own);
        spec["process"]["oomScoreAdj"] = json!(wanted.max(own));
        spec["linux"]["cgroupsPath"] = json!(case.cgroup);
        if let Some(limit) = opts.memory_limit {
            spec["linux"]["resources"]["memory"] = json!({"limit": limit, "swap": limit});
        }
        std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        case
    }

    fn bundle(&self) -> PathBuf {
        self.dir.path().join("bundle")
    }
    fn state(&self) -> PathBuf {
        self.state.clone()
    }

    /// A state dir whose socket paths do not fit in `sockaddr_un` (108 bytes).
    fn with_long_state_dir(mut self) -> Case {
        self.state = self.dir.path().join("x".repeat(100)).join("state");
        self
    }
    fn runc_root(&self) -> PathBuf {
        self.dir.path().join("runc")
    }
    fn log_path(&self) -> PathBuf {
        self.dir.path().join("logs/pod/ctr/0.log")
    }

    fn shim_args(&self, opts: &Opts<'_>) -> ShimArgs {
        ShimArgs {
            id: self.id.clone(),
            bundle: self.bundle(),
            runtime: RUNC.into(),
            runtime_root: self.runc_root(),
            state_dir: self.state(),
            log_path: Some(self.log_path()),
            tty: opts.tty,
            stdin: opts.stdin,
            stdin_once: opts.stdin_once,
            start: false,
            systemd_cgroup: false,
            runtime_args: Vec::new(),
            // Resolved by the caller, as the daemon does for every shim it starts.
            oom_file: shim::cgroup::oom_file(&self.bundle(), &self.id),
            mount_ns: None,
        }
    }

    fn spawn(&mut self, opts: &Opts<'_>) -> Result<SpawnedShim, ShimError> {
        let exe = std::env::current_exe().unwrap();
        let r = shim::spawn(&exe, &self.shim_args(opts));
        self.shim_pid = shim::shim_pid(&self.state());
        r
    }

    fn runc(&self, args: &[&str]) -> std::process::Output {
        Command::new(RUNC)
            .arg("--root")
            .arg(self.runc_root())
            .args(args)
            .output()
            .unwrap()
    }

    fn start(&self) {
        let out = self.runc(&["start", &self.id]);
        assert!(
            out.status.success(),
            "runc start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn wait_exit(&self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = shim::read_exit(&self.state()) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "no exit.json; shim.log: {}",
                std::fs::read_to_string(self.state().join("shim.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The CRI log as (stream, tag, content) records, checking each line's format.
    fn log_records(&self, path: &Path) -> Vec<(String, String, String)> {
        let text = std::fs::read_to_string(path).unwrap();
        text.split_terminator('\n')
            .map(|line| {
                let mut parts = line.splitn(4, ' ');
                let ts = parts.next().unwrap();
                assert!(ts.ends_with('Z'), "timestamp not UTC: {line:?}");
                chrono::DateTime::parse_from_rfc3339(ts)
                    .unwrap_or_else(|e| panic!("bad timestamp in {line:?}: {e}"));
                let stream = parts.next().unwrap().to_string();
                let tag = parts.next().unwrap().to_string();
                assert!(stream == "stdout" || stream == "stderr", "{line:?}");
                assert!(tag == "F" || tag == "P", "{line:?}");
                (stream, tag, parts.next().unwrap_or("").to_string())
            })
            .collect()
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = self.runc(&["delete", "-f", &self.id]);
        if let Some(pid) = self.shim_pid.or_else(|| shim::shim_pid(&self.state())) {
            // Only the shim this case started, and only if it is still that process.
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline
                .windows(self.id.len())
                .any(|w| w == self.id.as_bytes())
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
            if let Ok(entries) = std::fs::read_dir(root) {
                for e in entries.flatten() {
                    let _ = std::fs::remove_dir(e.path().join(self.cgroup.trim_start_matches('/')));
                }
            }
            let _ = std::fs::remove_dir(Path::new(root).join(self.cgroup.trim_start_matches('/')));
        }
    }
}

fn rec(stream: &str, tag: &str, content: &str) -> (String, String, String) {
    (stream.into(), tag.into(), content.into())
}

fn vm_rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

#[test]
fn shim_logs_lines_and_records_exit_code() {
    if !have_root() {
        return;
    }
    let script = "echo hello; echo err >&2; head -c 20000 /dev/zero | tr '\\0' a; echo; \
                  printf 'no newline'; exit 3";
    let opts = Opts {
        args: &["sh", "-c", script],
        ..Opts::default()
    };
    let mut case = Case::new("log", &opts);
    let spawned = case.spawn(&opts).expect("spawn");
    assert!(spawned.init_pid > 0 && spawned.shim_pid > 0);
    assert!(shim::shim_alive(&case.state()));
    let init = std::fs::read_to_string(case.state().join("init.pid")).unwrap();
    assert_eq!(init.trim(), spawned.init_pid.to_string());
    // Informational (measured, not asserted): the shim trims its RSS once it is idle.
    std::thread::sleep(Duration::from_millis(100));
    if let Some(kib) = vm_rss_kib(spawned.shim_pid) {
        eprintln!("idle shim VmRSS: {kib} kB");
    }
    let state = ShimClient::connect(&case.state()).unwrap().state().unwrap();
    assert_eq!(state.init_pid, spawned.init_pid);
    assert_eq!(state.status, InitStatus::Running);

    case.start();
    let exit = case.wait_exit();
    assert_eq!(exit.exit_code, 3);
    assert_eq!(exit.signal, None);
    assert!(!exit.oom_killed);
    let records = case.log_records(&case.log_path());
    let long = "a".repeat(20000);
    let mut stdout: Vec<_> = records
        .iter()
        .filter(|r| r.0 == "stdout")
        .cloned()
        .collect();
    let stderr: Vec<_> = records
        .iter()
        .filter(|r| r.0 == "stderr")
        .cloned()
        .collect();
    assert_eq!(stderr, vec![rec("stderr", "F", "err")]);
    assert_eq!(stdout.remove(0), rec("stdout", "F", "hello"));
    assert_eq!(stdout.remove(0), rec("stdout", "P", &long[..16384]));
    assert_eq!(stdout.remove(0), rec("stdout", "F", &long[16384..]));
    assert_eq!(stdout.remove(0), rec("stdout", "P", "no newline"));
    assert!(stdout.is_empty(), "{stdout:?}");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(case.log_path()).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o640);
    // The shim is gone once exit.json is there.
    let deadline = Instant::now() + Duration::from_secs(5);
    while shim::shim_alive(&case.state()) {
        assert!(Instant::now() < deadline, "shim still alive after exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn shim_signalled_init_exits_128_plus_signal() {
    if !have_root() {
        return;
    }
    // PID 1 of a pid namespace cannot SIGKILL itself; the kill comes from outside, as
    // the daemon's StopContainer does.
    let opts = Opts {
        args: &["sleep", "30"],
        ..Opts::default()
    };
    let mut case = Case::new("sig", &opts);
    case.spawn(&opts).expect("spawn");
    case.start();
    let out = case.runc(&["kill", &case.id, "KILL"]);
    assert!(out.status.success(), "runc kill: {out:?}");
    let exit = case.wait_exit();
    assert_eq!((exit.exit_code, exit.signal), (137, Some(9)));
    assert!(!exit.oom_killed);
}

#[test]
fn shim_create_failure_returns_the_runtime_error() {
    if !have_root() {
        return;
    }
    let opts = Opts {
        args: &["/bin/no-such-binary"],
        ..Opts::default()
    };
    let mut case = Case::new("fail", &opts);
    let err = case.spawn(&opts).expect_err("create must fail");
    let msg = err.to_string();
    assert!(matches!(err, ShimError::Create(_)), "{err:?}");
    assert!(msg.contains("no-such-binary"), "{msg}");
    assert!(!shim::shim_alive(&case.state()));
    assert!(shim::read_exit(&case.state()).is_none());
}

#[test]
fn shim_outlives_the_process_that_spawned_it() {
    if !have_root() {
        return;
    }
    let opts = Opts {
        args: &["sh", "-c", "sleep 0.3; echo survived"],
        ..Opts::default()
    };
    let mut case = Case::new("orphan", &opts);
    let args = case.shim_args(&opts);
    let out = Command::new(std::env::current_exe().unwrap())
        .arg("spawn-helper")
        .args(args.to_args())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "helper: {text}");
    let pids: Vec<i32> = text
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    case.shim_pid = Some(pids[0]);
    // The helper has exited (and was reaped by `output`): the shim lives on.
    assert!(shim::shim_alive(&case.state()));
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pids[0])).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    let (ppid, sid): (i32, i32) = (fields[1].parse().unwrap(), fields[3].parse().unwrap());
    assert_ne!(ppid, std::process::id() as i32);
    assert_eq!(sid, pids[0], "the shim leads its own session");
    case.start();
    assert_eq!(case.wait_exit().exit_code, 0);
    let records = case.log_records(&case.log_path());
    assert_eq!(records, vec![rec("stdout", "F", "survived")]);
}

#[test]
fn shim_attach_broadcasts_output_and_stdin_once_closes_stdin() {
    if !have_root() {
        return;
    }
    let opts = Opts {
        args: &["cat"],
        stdin: true,
        stdin_once: true,
        ..Opts::default()
    };
    let mut case = Case::new("attach", &opts).with_long_state_dir();
    case.spawn(&opts).expect("spawn");
    let mut writer = ShimClient::connect(&case.state())
        .unwrap()
        .attach(true)
        .unwrap();
    let mut watcher = ShimClient::connect(&case.state())
        .unwrap()
        .attach(false)
        .unwrap();
    // A resize on a container without a terminal is refused with a reason.
    let err = ShimClient::connect(&case.state())
        .unwrap()
        .resize(80, 24)
        .unwrap_err();
    assert!(err.to_string().contains("no terminal"), "{err}");
    case.start();
    writer.send_stdin(b"ping\n").unwrap();
    for client in [&mut writer, &mut watcher] {
        let mut got = Vec::new();
        while got != b"ping\n" {
            match client.recv().unwrap() {
                Some(AttachEvent::Stdout(b)) => got.extend(b),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    // The first stdin client going away closes stdin: cat ends.
    writer.close_stdin().unwrap();
    let mut events = Vec::new();
    while let Some(ev) = watcher.recv().unwrap() {
        events.push(ev);
    }
    assert!(events.contains(&AttachEvent::StdoutClosed), "{events:?}");
    assert!(events.contains(&AttachEvent::StderrClosed), "{events:?}");
    match events.last() {
        Some(AttachEvent::Exit(e)) => assert_eq!(e.exit_code, 0),
        other => panic!("no exit frame: {other:?}"),
    }
    assert_eq!(case.wait_exit().exit_code, 0);
    assert_eq!(
        case.log_records(&case.log_path()),
        vec![rec("stdout", "F", "ping")]
    );
}

#[test]
fn shim_tty_resize_and_log_reopen() {
    if !have_root() {
        return;
    }
    let opts = Opts {
        args: &[
            "sh",
            "-c",
            "read x; stty size; read y; echo second-$y; exit 5",
        ],
        tty: true,
        stdin: true,
        ..Opts::default()
    };
    let mut case = Case::new("tty", &opts).with_long_state_dir();
    case.spawn(&opts).expect("spawn");
    let mut ctl = ShimClient::connect(&case.state()).unwrap();
    ctl.resize(123, 45).unwrap();
    let mut att = ShimClient::connect(&case.state())
        .unwrap()
        .attach(true)
        .unwrap();
    case.start();
    att.send_stdin(b"go\n").unwrap();
    let mut out = Vec::new();
    while !String::from_utf8_lossy(&out).contains("45 123\r\n") {
        match att.recv().unwrap() {
            Some(AttachEvent::Stdout(b)) => out.extend(b),
            other => panic!(
                "unexpected {other:?} after {:?}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
    // Rotation: rename the file, ask for a reopen, later output goes to a new file.
    let rotated = case.log_path().with_extension("log.1");
    std::fs::rename(case.log_path(), &rotated).unwrap();
    ctl.reopen_log().unwrap();
    att.resize(100, 30).unwrap();
    att.send_stdin(b"x\n").unwrap();
    let exit = case.wait_exit();
    assert_eq!(exit.exit_code, 5);
    let old = case.log_records(&rotated);
    assert!(old.contains(&rec("stdout", "F", "go")), "{old:?}");
    assert!(old.contains(&rec("stdout", "F", "45 123")), "{old:?}");
    let new = case.log_records(&case.log_path());
    assert!(new.contains(&rec("stdout", "F", "second-x")), "{new:?}");
    assert!(new.iter().all(|r| r.0 == "stdout"), "{new:?}");
}

#[test]
fn shim_oom_kill_is_reported() {
    if !have_root() {
        return;
    }
    let opts = Opts {
        args: &[
            "sh",
            "-c",
            "x=$(head -c 67108864 /dev/zero | tr '\\0' a); echo survived",
        ],
        memory_limit: Some(16 * 1024 * 1024),
        ..Opts::default()
    };
    let mut case = Case::new("oom", &opts);
    case.spawn(&opts).expect("spawn");
    case.start();
    let exit = case.wait_exit();
    assert!(exit.oom_killed, "{exit:?}");
    assert_eq!(exit.exit_code, 137, "{exit:?}");
}

#[test]
fn shim_slow_attach_client_does_not_block_the_container() {
    if !have_root() {
        return;
    }
    let opts = Opts {
        args: &["sh", "-c", "yes 0123456789 | head -n 200000"],
        ..Opts::default()
    };
    let mut case = Case::new("slow", &opts);
    case.spawn(&opts).expect("spawn");
    // Attached, but reads nothing until the container is done.
    let mut idle = ShimClient::connect(&case.state())
        .unwrap()
        .attach(false)
        .unwrap();
    case.start();
    assert_eq!(case.wait_exit().exit_code, 0);
    let records = case.log_records(&case.log_path());
    assert_eq!(records.len(), 200_000);
    assert!(
        records
            .iter()
            .all(|r| *r == rec("stdout", "F", "0123456789"))
    );
    let mut got = 0;
    loop {
        match idle.recv() {
            Ok(Some(AttachEvent::Stdout(b))) => got += b.len(),
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    assert!(
        got < 200_000 * 11,
        "the slow client was sent everything: {got} bytes"
    );
}

#[test]
fn shim_dead_is_detected() {
    if !have_root() {
        return;
    }
    let opts = Opts {
        args: &["sleep", "30"],
        ..Opts::default()
    };
    let mut case = Case::new("dead", &opts);
    let spawned = case.spawn(&opts).expect("spawn");
    assert!(shim::shim_alive(&case.state()));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(spawned.shim_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while shim::shim_alive(&case.state()) {
        assert!(
            Instant::now() < deadline,
            "killed shim still reported alive"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(shim::read_exit(&case.state()).is_none());
    assert!(ShimClient::connect(&case.state()).is_err());
}
