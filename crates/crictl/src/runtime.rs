//! Runtime commands: info, version.

use crate::format::{pretty, proto_json, status_with_info};
use crate::{Clients, CrictlError, rpc};
use clap::Args;
use cri::runtime::v1::{StatusRequest, VersionRequest};
use std::io::Write;

#[derive(Debug, Args, Clone)]
pub struct InfoArgs {
    #[arg(short, long, default_value = "json")]
    pub output: String,
}

fn io(e: std::io::Error) -> CrictlError {
    CrictlError::Other(format!("writing output: {e}"))
}

pub async fn version(c: &Clients, out: &mut (dyn Write + Send)) -> Result<(), CrictlError> {
    let v = c
        .runtime
        .clone()
        .version(VersionRequest {
            version: "v1".into(),
        })
        .await
        .map_err(rpc("getting the runtime version"))?
        .into_inner();
    write!(
        out,
        "Version:  {}\nRuntimeName:  {}\nRuntimeVersion:  {}\nRuntimeApiVersion:  {}\n",
        v.version, v.runtime_name, v.runtime_version, v.runtime_api_version
    )
    .map_err(io)
}

pub async fn info(
    c: &Clients,
    a: InfoArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    if a.output != "json" {
        return Err(CrictlError::Usage(format!(
            "unsupported output format {:?}: nodus crictl prints json",
            a.output
        )));
    }
    let r = c
        .runtime
        .clone()
        .status(StatusRequest { verbose: true })
        .await
        .map_err(rpc("getting status of runtime"))?
        .into_inner();
    let status = r
        .status
        .as_ref()
        .map(|s| proto_json("runtime.v1.RuntimeStatus", s))
        .unwrap_or(serde_json::Value::Null);
    writeln!(out, "{}", pretty(&status_with_info(status, &r.info))).map_err(io)
}
