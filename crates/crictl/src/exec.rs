//! `crictl exec [-i] [-t] [-s] [--timeout N] [-r spdy|websocket] CONTAINER CMD [ARG...]`.
//!
//! Without `--sync` this is the streaming path: the Exec RPC, then the returned URL over
//! SPDY (default) or WebSocket, stdout to standard output, stderr to standard error. A
//! non-zero exit fails with "execing command in container <id>: command terminated with
//! exit code N" (crictl, too, exits 1 then). With `--sync` it is ExecSync: stdout and
//! stderr are printed after the command ended, and a non-zero exit code fails with
//! "non-zero exit code (N)" and `nodus crictl` exits with the command's code N, as crictl.

use crate::stream::{self, Output, StreamError, StreamOptions, Transport, term};
use crate::{Clients, CrictlError, rpc};
use clap::Args;
use cri::runtime::v1::{ExecRequest, ExecSyncRequest};
use std::io::Write;

#[derive(Debug, Args, Clone)]
pub struct ExecArgs {
    /// Run the command synchronously (ExecSync).
    #[arg(short, long)]
    pub sync: bool,
    /// Timeout in seconds (ExecSync).
    #[arg(long, default_value_t = 0)]
    pub timeout: i64,
    /// Allocate a pseudo-TTY.
    #[arg(short, long)]
    pub tty: bool,
    /// Keep STDIN open.
    #[arg(short, long)]
    pub interactive: bool,
    /// Transport protocol to use, one of: spdy|websocket.
    #[arg(short = 'r', long, value_enum, default_value_t = Transport::Spdy)]
    pub transport: Transport,
    /// The container ID (a unique prefix is enough).
    pub container: String,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub cmd: Vec<String>,
}

fn io(e: std::io::Error) -> CrictlError {
    CrictlError::Other(format!("writing output: {e}"))
}

/// Connects to a streaming URL and runs a remotecommand session with this process's
/// stdio: stdout to `out`, stderr to standard error, stdin when `opts.stdin`, and with a
/// TTY the local terminal in raw mode and its size changes forwarded.
pub(crate) async fn stream_stdio(
    url: &str,
    transport: Transport,
    opts: StreamOptions,
    out: &mut (dyn Write + Send),
) -> Result<(), StreamError> {
    let conn = stream::dial(url).await?;
    let mut session = stream::start(conn, url, transport, opts).await?;
    let _raw = if opts.tty {
        term::RawMode::enable().ok()
    } else {
        None
    };
    if let Some(tx) = session.resize.take() {
        term::watch_size(0, tx);
    }
    let mut stdin = session.stdin.take().map(|tx| (tx, term::stdin_chunks()));
    let mut stderr = std::io::stderr();
    loop {
        tokio::select! {
            o = session.output.recv() => match o {
                Some(Output::Stdout(b)) => {
                    out.write_all(&b).and_then(|()| out.flush()).map_err(StreamError::io("writing stdout"))?;
                }
                Some(Output::Stderr(b)) => {
                    stderr.write_all(&b).and_then(|()| stderr.flush()).map_err(StreamError::io("writing stderr"))?;
                }
                None => break,
            },
            chunk = async {
                match stdin.as_mut() {
                    Some((_, rx)) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => match chunk {
                Some(c) => {
                    if let Some((tx, _)) = &stdin
                        && tx.send(c).await.is_err()
                    {
                        stdin = None;
                    }
                }
                // End of local input: end the remote stdin.
                None => stdin = None,
            },
        }
    }
    session.wait().await
}

pub async fn run(
    c: &Clients,
    args: ExecArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    if args.sync {
        let r = c
            .runtime
            .clone()
            .exec_sync(ExecSyncRequest {
                container_id: args.container.clone(),
                cmd: args.cmd.clone(),
                timeout: args.timeout,
            })
            .await
            .map_err(rpc(format!(
                "execing command in container {} synchronously",
                args.container
            )))?
            .into_inner();
        // crictl prints both streams this way, each followed by a newline.
        writeln!(out, "{}", String::from_utf8_lossy(&r.stdout)).map_err(io)?;
        writeln!(out, "{}", String::from_utf8_lossy(&r.stderr)).map_err(io)?;
        if r.exit_code != 0 {
            return Err(CrictlError::Exit(r.exit_code));
        }
        return Ok(());
    }
    if args.tty && !args.interactive {
        return Err(CrictlError::Usage(
            "tty=true must be specified with interactive=true".into(),
        ));
    }
    if args.tty && !term::is_terminal(0) {
        return Err(CrictlError::Usage("input is not a terminal".into()));
    }
    let resp = c
        .runtime
        .clone()
        .exec(ExecRequest {
            container_id: args.container.clone(),
            cmd: args.cmd.clone(),
            tty: args.tty,
            stdin: args.interactive,
            stdout: true,
            stderr: !args.tty,
        })
        .await
        .map_err(rpc(format!(
            "execing command in container {}",
            args.container
        )))?
        .into_inner();
    let opts = StreamOptions {
        stdin: args.interactive,
        stdout: true,
        stderr: !args.tty,
        tty: args.tty,
    };
    stream_stdio(&resp.url, args.transport, opts, out)
        .await
        .map_err(|e| {
            CrictlError::Other(format!(
                "execing command in container {}: {e}",
                args.container
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: ExecArgs,
    }

    #[test]
    fn flags_parse_like_crictl() {
        let a = Cli::parse_from(["exec", "-it", "abc", "sh", "-c", "echo hi"]).a;
        assert!(a.tty && a.interactive && !a.sync);
        assert_eq!(a.container, "abc");
        assert_eq!(a.cmd, ["sh", "-c", "echo hi"]);
        assert_eq!(a.transport, Transport::Spdy);
        let a = Cli::parse_from(["exec", "-s", "--timeout", "5", "-r", "websocket", "c", "ls"]).a;
        assert!(a.sync);
        assert_eq!(a.timeout, 5);
        assert_eq!(a.transport, Transport::Websocket);
        assert!(
            Cli::try_parse_from(["exec", "c"]).is_err(),
            "a command is required"
        );
    }
}
