//! `crictl attach [-i] [-t] [-r spdy|websocket] CONTAINER`: the Attach RPC, then the
//! container's own stdio over the returned streaming URL.

use crate::exec::stream_stdio;
use crate::stream::{StreamOptions, Transport, term};
use crate::{Clients, CrictlError, rpc};
use clap::Args;
use cri::runtime::v1::AttachRequest;
use std::io::Write;

#[derive(Debug, Args, Clone)]
pub struct AttachArgs {
    /// Allocate a pseudo-TTY.
    #[arg(short, long)]
    pub tty: bool,
    /// Keep STDIN open.
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Transport protocol to use, one of: spdy|websocket.
    #[arg(short = 'r', long, value_enum, default_value_t = Transport::Spdy)]
    pub transport: Transport,
    /// The container ID (a unique prefix is enough).
    pub container: String,
}

pub async fn run(
    c: &Clients,
    args: AttachArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    if args.tty && args.stdin && !term::is_terminal(0) {
        return Err(CrictlError::Usage("input is not a terminal".into()));
    }
    let resp = c
        .runtime
        .clone()
        .attach(AttachRequest {
            container_id: args.container.clone(),
            stdin: args.stdin,
            tty: args.tty,
            stdout: true,
            stderr: !args.tty,
        })
        .await
        .map_err(rpc("attaching running container failed"))?
        .into_inner();
    let opts = StreamOptions {
        stdin: args.stdin,
        stdout: true,
        stderr: !args.tty,
        tty: args.tty,
    };
    stream_stdio(&resp.url, args.transport, opts, out)
        .await
        .map_err(|e| CrictlError::Other(format!("attaching running container failed: {e}")))
}
