//! Thin, safe wrappers over the few system calls the shim needs that std does not offer:
//! pipes, poll, signalfd, subreaper, fd passing, terminal size, and Unix socket paths longer
//! than `sun_path`.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A pipe whose two ends are close-on-exec: `(read, write)`.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub(crate) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor has no memory-safety requirements.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    Ok(())
}

pub(crate) fn set_cloexec(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: as above.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    let flags = if on {
        flags | libc::FD_CLOEXEC
    } else {
        flags & !libc::FD_CLOEXEC
    };
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, flags) })?;
    Ok(())
}

/// `read(2)` on a raw descriptor, retrying on EINTR.
pub(crate) fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// `write(2)` on a raw descriptor, retrying on EINTR.
pub(crate) fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for reads of `buf.len()` bytes.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// `poll(2)`, retrying on EINTR. `timeout_ms < 0` waits forever.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    loop {
        // SAFETY: `fds` is a valid slice of pollfd structures.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

pub(crate) fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// Blocks SIGCHLD for this (single-threaded) process and returns a non-blocking signalfd
/// that becomes readable when a child changes state.
pub(crate) fn sigchld_fd() -> io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data; the calls only read/write the local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        cvt(libc::sigprocmask(
            libc::SIG_BLOCK,
            &set,
            std::ptr::null_mut(),
        ))?;
        let fd = cvt(libc::signalfd(
            -1,
            &set,
            libc::SFD_NONBLOCK | libc::SFD_CLOEXEC,
        ))?;
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Empties a signalfd (its content is not needed: the caller reaps with waitpid).
pub(crate) fn drain_signalfd(fd: RawFd) {
    let mut buf = [0u8; std::mem::size_of::<libc::signalfd_siginfo>() * 4];
    while matches!(read(fd, &mut buf), Ok(n) if n > 0) {}
}

pub(crate) fn ignore_sigpipe() {
    // SAFETY: installing SIG_IGN has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Makes this process the reaper of its orphaned descendants (the container's init, whose
/// parent `runc create` exits, is re-parented here).
pub(crate) fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    cvt(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) })?;
    Ok(())
}

/// Receives one file descriptor sent with SCM_RIGHTS (runc's `--console-socket` protocol:
/// the payload is the terminal's name, the ancillary data the pty master).
pub(crate) fn recv_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut data = [0u8; 4096];
    match recv_with_fd(sock.as_raw_fd(), &mut data)? {
        Received { fd: Some(fd), .. } => Ok(fd),
        Received { len, .. } => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("console socket message ({len} bytes) carried no file descriptor"),
        )),
    }
}

/// One message taken by [`recv_with_fd`].
pub(crate) struct Received {
    /// Bytes of payload; 0 with no descriptor on a stream or seqpacket socket is the peer
    /// gone.
    pub len: usize,
    /// The first descriptor the message carried (close-on-exec; any others are closed).
    pub fd: Option<OwnedFd>,
    /// The payload was longer than the buffer (seqpacket/datagram: the rest is lost).
    pub truncated: bool,
}

/// `recvmsg(2)` of one message and the descriptors sent with it (SCM_RIGHTS), retrying
/// on EINTR.
pub(crate) fn recv_with_fd(sock: RawFd, data: &mut [u8]) -> io::Result<Received> {
    // Room for one cmsghdr carrying up to 4 fds (one is expected; extras are closed).
    let mut cmsg = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; every pointer in it refers to live local buffers.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cmsg) as _;
        let n = loop {
            let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n >= 0 {
                break n as usize;
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        };
        let mut received: Vec<OwnedFd> = Vec::new();
        let mut hdr = libc::CMSG_FIRSTHDR(&msg);
        while !hdr.is_null() {
            if (*hdr).cmsg_level == libc::SOL_SOCKET && (*hdr).cmsg_type == libc::SCM_RIGHTS {
                let payload = (*hdr).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let count = payload / std::mem::size_of::<libc::c_int>();
                let ptr = libc::CMSG_DATA(hdr) as *const libc::c_int;
                for i in 0..count {
                    received.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(ptr.add(i))));
                }
            }
            hdr = libc::CMSG_NXTHDR(&msg, hdr);
        }
        Ok(Received {
            len: n,
            fd: (!received.is_empty()).then(|| received.swap_remove(0)),
            truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
        })
    }
}

/// `sendmsg(2)` of `data` with the descriptor `fd` (SCM_RIGHTS); a peer that is gone is
/// EPIPE, never SIGPIPE.
pub(crate) fn send_with_fd(sock: RawFd, data: &[u8], fd: RawFd) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cmsg = [0u64; 4];
    // SAFETY: msghdr and the control buffer are plain local data, large enough for one
    // cmsghdr with one int (CMSG_SPACE(4) is 24 bytes on 64-bit Linux).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as _;
        let hdr = libc::CMSG_FIRSTHDR(&msg);
        (*hdr).cmsg_level = libc::SOL_SOCKET;
        (*hdr).cmsg_type = libc::SCM_RIGHTS;
        (*hdr).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(hdr) as *mut libc::c_int, fd);
        loop {
            let n = libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
            if n >= 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

/// A connected pair of close-on-exec `SOCK_SEQPACKET` Unix sockets (messages keep their
/// boundaries, and the peer's close is seen by both reads and writes).
pub(crate) fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid two-element array for socketpair to fill.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: socketpair succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Writes `argv` (NUL-separated) over this process's command line in place, so that
/// `/proc/self/cmdline` (what `ps` shows) names it: a process forked without an exec
/// otherwise shows its parent's. The original arguments' bytes are all the room there is
/// (`prctl(PR_SET_MM)` could point the kernel elsewhere but needs CAP_SYS_RESOURCE, which
/// a container-hosted node may lack): what does not fit is cut, the rest is NULs.
pub(crate) fn set_cmdline(argv: &[u8]) -> io::Result<()> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the parenthesised command name start with the third, the state; the
    // 48th and 49th are where the kernel put the arguments.
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "unexpected /proc/self/stat");
    let mut fields = stat.rsplit_once(')').ok_or_else(bad)?.1.split_whitespace();
    let arg_start: usize = fields
        .nth(45)
        .and_then(|f| f.parse().ok())
        .ok_or_else(bad)?;
    let arg_end: usize = fields.next().and_then(|f| f.parse().ok()).ok_or_else(bad)?;
    let room = arg_end
        .checked_sub(arg_start)
        .filter(|&r| r > 0)
        .ok_or_else(bad)?;
    let n = argv.len().min(room - 1);
    // SAFETY: [arg_start, arg_end) is this process's own argument area on its stack,
    // writable and alive for the process's life; nothing reads it concurrently (the
    // process is single-threaded) and std keeps only raw pointers into it.
    unsafe {
        let dst = arg_start as *mut u8;
        std::ptr::copy_nonoverlapping(argv.as_ptr(), dst, n);
        std::ptr::write_bytes(dst.add(n), 0, room - n);
    }
    Ok(())
}

/// Sets the window size of a terminal (`TIOCSWINSZ`).
pub(crate) fn set_winsize(fd: RawFd, width: u16, height: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: height,
        ws_col: width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize structure, which `ws` is.
    cvt(unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) })?;
    Ok(())
}

/// The longest path `sockaddr_un` holds (108 bytes including the terminating NUL).
const SUN_PATH_MAX: usize = 107;

/// Runs `f` with a path naming the same file as `path` but short enough for `sockaddr_un`:
/// the path itself when it fits, else `/proc/self/fd/<dirfd>/<name>` through an `O_PATH`
/// descriptor of the parent directory (which lives as long as `f` runs).
fn with_socket_path<T>(path: &Path, f: impl FnOnce(&Path) -> io::Result<T>) -> io::Result<T> {
    if path.as_os_str().len() <= SUN_PATH_MAX {
        return f(path);
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return f(path);
    };
    let dir = File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)?;
    let mut short = OsString::from(format!("/proc/self/fd/{}/", dir.as_raw_fd())).into_vec();
    short.extend_from_slice(name.as_bytes());
    let short = PathBuf::from(OsString::from_vec(short));
    f(&short)
}

pub(crate) fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    with_socket_path(path, |p| UnixListener::bind(p))
}

pub(crate) fn connect_unix(path: &Path) -> io::Result<UnixStream> {
    with_socket_path(path, |p| UnixStream::connect(p))
}

/// The number of threads of this process (0 when unknown): the entries of
/// `/proc/self/task`, which the kernel lists without computing the memory figures that
/// make `/proc/self/status` costly to read.
pub(crate) fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Whether `pid` names a live (not zombie) process.
pub(crate) fn process_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may itself hold ") ".
    match stat.rfind(')') {
        Some(i) => !matches!(
            stat[i + 1..].trim_start().chars().next(),
            Some('Z' | 'X') | None
        ),
        None => false,
    }
}

/// Drops this process's page-table entries for its read-only file mappings that hold no
/// private copy of any page (program and library text, read-only data; not the relocated
/// RELRO pages, which are private copies). The pages stay in the page cache, shared with
/// every process that maps them, and read back unchanged from the file when touched again:
/// nothing is lost, and an idle shim's RSS is what its loop uses rather than everything
/// that start-up and the kernel's fault-around mapped.
/// Leaves the process that started the shim: forks, the first process exits at once (its
/// starter reaps it), and the second goes on in a session of its own, re-parented to the
/// nearest subreaper or init — so it outlives the runtime daemon and the daemon never has
/// to reap it (containerd's shims detach themselves the same way). Done here rather than
/// in the daemon because forking the daemon copies its page tables twice, while this
/// process has only just been exec'd. Call while the process is single-threaded.
pub(crate) fn detach() -> io::Result<()> {
    // SAFETY: the process is single-threaded, so fork duplicates the only thread; the
    // parent only exits.
    match unsafe { libc::fork() } {
        -1 => return Err(io::Error::last_os_error()),
        0 => {}
        // SAFETY: exits the first process without running anything else.
        _ => unsafe { libc::_exit(0) },
    }
    // SAFETY: plain syscall; the child of a fork is never a process-group leader.
    if unsafe { libc::setsid() } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Moves the descriptor `fd` (a standard stream the starter put a pipe on) above the
/// standard ones, close-on-exec, and puts `/dev/null` in its place; returns the new
/// descriptor.
pub(crate) fn take_std_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl on a descriptor number; the result is checked.
    let moved = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if moved < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `moved` was just created by F_DUPFD_CLOEXEC and is owned by nobody else.
    let moved = unsafe { OwnedFd::from_raw_fd(moved) };
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    // SAFETY: dup2 onto a standard descriptor number this process owns.
    if unsafe { libc::dup2(null.as_raw_fd(), fd) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(moved)
}

/// This process's clean file mappings, when found once before its shims were forked.
static CLEAN_FILE_MAPPINGS: std::sync::OnceLock<Vec<(usize, usize)>> = std::sync::OnceLock::new();

/// Finds this process's clean file mappings (see [`trim_file_rss`]) once, for every shim
/// forked from it later: reading `/proc/self/smaps` makes the kernel walk every page table
/// (about half a millisecond per shim), and a forked shim has the same mappings.
pub(crate) fn remember_clean_file_mappings() {
    CLEAN_FILE_MAPPINGS.get_or_init(clean_file_mappings);
}

/// Drops this process's page-table entries of its private, read-only file mappings that
/// hold no copied-on-write page (the binary's text and read-only data): every such page
/// reads back unchanged from the file, and the pages touched once while starting stop
/// counting in the shim's resident set.
pub(crate) fn trim_file_rss() {
    let found;
    let ranges = match CLEAN_FILE_MAPPINGS.get() {
        Some(r) => r,
        None => {
            found = clean_file_mappings();
            &found
        }
    };
    for &(start, end) in ranges {
        // SAFETY: the range is a private, read-only file mapping of this process without
        // any anonymous (copied-on-write) page — found in this process, or in the fork
        // server before it forked this one; a read-only mapping gains no such page, and
        // nothing unmaps the binary in between. MADV_DONTNEED only drops page-table
        // entries, and every page reads back unchanged from the file on the next access.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
}

/// The ranges [`trim_file_rss`] may drop, read from `/proc/self/smaps`.
fn clean_file_mappings() -> Vec<(usize, usize)> {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return Vec::new();
    };
    let mut candidates: Vec<(usize, usize)> = Vec::new();
    let mut current: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        let mut f = line.split_ascii_whitespace();
        let Some(first) = f.next() else {
            continue;
        };
        if let Some((start, end)) = first.split_once('-') {
            // A mapping header: "start-end perms offset dev inode [path]".
            current = None;
            let perms = f.next().unwrap_or("");
            let path = f.nth(3).unwrap_or("");
            let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            ) else {
                continue;
            };
            if perms.starts_with('r')
                && !perms.contains('w')
                && perms.ends_with('p')
                && path.starts_with('/')
            {
                current = Some((start, end));
            }
        } else if first == "Anonymous:"
            && let Some(range) = current.take()
            && f.next() == Some("0")
        {
            candidates.push(range);
        }
    }
    candidates
}
