//! libnftables loaded at run time (`dlopen("libnftables.so.1")`), so a sync is one library
//! call in this process instead of a fork and exec of `nft` per transaction. Nothing links
//! against it at build time: a node without the library falls back to `nft -f`.
//!
//! All of the proxy's unsafe FFI lives here. A [`Context`] owns one `struct nft_ctx` (and
//! its netlink socket, opened in the network namespace of the thread that creates it) for
//! the life of the backend.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::ptr::NonNull;
use std::sync::OnceLock;

/// The library's soname as Debian's `libnftables1` ships it.
const SONAME: &CStr = c"libnftables.so.1";
/// `NFT_CTX_DEFAULT`: a context that talks to the kernel (not a dry-run parser).
const NFT_CTX_DEFAULT: u32 = 0;

type CtxNew = unsafe extern "C" fn(u32) -> *mut c_void;
type CtxFree = unsafe extern "C" fn(*mut c_void);
type CtxBuffer = unsafe extern "C" fn(*mut c_void) -> c_int;
type CtxGetBuffer = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type RunCmd = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;
type SetDryRun = unsafe extern "C" fn(*mut c_void, bool);

/// The entry points this module calls, resolved once per process.
struct Api {
    ctx_new: CtxNew,
    ctx_free: CtxFree,
    buffer_output: CtxBuffer,
    buffer_error: CtxBuffer,
    get_output: CtxGetBuffer,
    get_error: CtxGetBuffer,
    run_cmd: RunCmd,
    set_dry_run: SetDryRun,
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc, valid until the
    // next dl* call on this thread; it is copied before that.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null and NUL-terminated, see above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Looks `name` up in `lib`; `T` must be the symbol's C function pointer type.
///
/// # Safety
/// `lib` is a live handle from dlopen and `T` is a function pointer type matching the
/// symbol's real signature.
unsafe fn symbol<T: Copy>(lib: *mut c_void, name: &CStr) -> Result<T, String> {
    // SAFETY: lib is a live handle and name is NUL-terminated (caller's contract).
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        return Err(format!("{}: {}", name.to_string_lossy(), dl_error()));
    }
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: p is the non-null address of a function whose signature is T (caller's
    // contract); function and data pointers have the same size on every Linux target.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

fn load() -> Result<Api, String> {
    // SAFETY: dlopen with a constant NUL-terminated name. The handle is never closed: the
    // library keeps process-wide state (its gmp allocator hooks) that must outlive every
    // context, and unloading it would gain nothing for a long-running proxy.
    let lib = unsafe { libc::dlopen(SONAME.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        return Err(dl_error());
    }
    // SAFETY: each type matches the prototype in nftables/libnftables.h (1.0.x):
    // nft_ctx_new(uint32_t), nft_ctx_free(ctx), nft_ctx_buffer_{output,error}(ctx) -> int,
    // nft_ctx_get_{output,error}_buffer(ctx) -> const char *, and
    // nft_run_cmd_from_buffer(ctx, const char *) -> int, nft_ctx_set_dry_run(ctx, bool).
    unsafe {
        Ok(Api {
            ctx_new: symbol(lib, c"nft_ctx_new")?,
            ctx_free: symbol(lib, c"nft_ctx_free")?,
            buffer_output: symbol(lib, c"nft_ctx_buffer_output")?,
            buffer_error: symbol(lib, c"nft_ctx_buffer_error")?,
            get_output: symbol(lib, c"nft_ctx_get_output_buffer")?,
            get_error: symbol(lib, c"nft_ctx_get_error_buffer")?,
            run_cmd: symbol(lib, c"nft_run_cmd_from_buffer")?,
            set_dry_run: symbol(lib, c"nft_ctx_set_dry_run")?,
        })
    }
}

fn api() -> Result<&'static Api, String> {
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Whether libnftables can be loaded in this process.
pub fn available() -> bool {
    api().is_ok()
}

/// One libnftables context: its own netlink socket and object cache.
pub struct Context {
    api: &'static Api,
    ctx: NonNull<c_void>,
}

// SAFETY: the context is only ever used through `&mut self` (one thread at a time), and
// libnftables keeps no thread-local state tied to the creating thread; the netlink socket
// stays bound to the namespace it was opened in, whichever thread uses it.
unsafe impl Send for Context {}

impl Context {
    /// Loads the library (once per process) and opens a context whose output and error
    /// messages are captured instead of written to this process's stdout and stderr.
    pub fn new() -> Result<Context, String> {
        let api = api()?;
        // SAFETY: ctx_new has the declared signature; NFT_CTX_DEFAULT is a valid flag set.
        let raw = unsafe { (api.ctx_new)(NFT_CTX_DEFAULT) };
        let ctx = NonNull::new(raw).ok_or("nft_ctx_new failed")?;
        let c = Context { api, ctx };
        // SAFETY: c.ctx is a live context from nft_ctx_new, freed only in Drop.
        let (out, err) = unsafe {
            (
                (api.buffer_output)(c.ctx.as_ptr()),
                (api.buffer_error)(c.ctx.as_ptr()),
            )
        };
        if out != 0 || err != 0 {
            return Err("cannot buffer libnftables output".into());
        }
        Ok(c)
    }

    /// Takes what the library buffered since the last call (it rewinds the buffer).
    fn take(&mut self, get: CtxGetBuffer) -> String {
        // SAFETY: self.ctx is live and buffering was enabled in new(); the returned pointer
        // is NULL or a NUL-terminated string owned by the context, valid until the next
        // library call on it, and copied here before any.
        let p = unsafe { get(self.ctx.as_ptr()) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null and NUL-terminated, see above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Runs `cmds` (nft syntax, several lines) as one transaction, like `nft -f`. `Ok`
    /// carries what a listing printed; `Err` the library's error text.
    pub fn run(&mut self, cmds: &str) -> Result<String, String> {
        let text = CString::new(cmds).map_err(|_| "rule text contains a NUL byte".to_string())?;
        // SAFETY: self.ctx is live; text is NUL-terminated and outlives the call.
        let rc = unsafe { (self.api.run_cmd)(self.ctx.as_ptr(), text.as_ptr()) };
        // Both buffers are drained after every command so one run's messages never leak
        // into the next one's.
        let out = self.take(self.api.get_output);
        let err = self.take(self.api.get_error);
        if rc == 0 {
            Ok(out)
        } else if err.trim().is_empty() {
            Err(format!("libnftables failed ({rc})"))
        } else {
            Err(err.trim().to_string())
        }
    }
}

impl Context {
    /// Runs `cmds` as a dry run (`nft -c`): parsed, evaluated against the context's cache
    /// (filling it) and checked by the kernel, which aborts the batch, so nothing changes.
    pub fn check(&mut self, cmds: &str) -> Result<(), String> {
        // SAFETY: self.ctx is live; set_dry_run only flips a flag in it.
        unsafe { (self.api.set_dry_run)(self.ctx.as_ptr(), true) };
        let r = self.run(cmds).map(|_| ());
        // SAFETY: as above.
        unsafe { (self.api.set_dry_run)(self.ctx.as_ptr(), false) };
        r
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: self.ctx came from nft_ctx_new and is freed exactly once, here.
        unsafe { (self.api.ctx_free)(self.ctx.as_ptr()) }
    }
}
