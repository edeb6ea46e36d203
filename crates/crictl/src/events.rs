//! `crictl events`: streams GetContainerEvents, one protobuf-JSON (or YAML) document per
//! event, until interrupted or the runtime ends the stream.

use crate::format::{Output, write_message};
use crate::util::io;
use crate::{Clients, CrictlError, rpc};
use clap::Args;
use cri::runtime::v1::GetEventsRequest;
use std::io::Write;

#[derive(Debug, Args, Clone)]
pub struct EventsArgs {
    /// Output format: json (default) or yaml.
    #[arg(short, long, default_value = "json")]
    pub output: String,
    /// Go templates are not supported by nodus crictl.
    #[arg(long, hide = true)]
    pub template: Option<String>,
    /// Exit after this many events (a nodus extension; crictl streams until interrupted).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

pub async fn events(
    c: &Clients,
    a: EventsArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), CrictlError> {
    let output = match a.output.as_str() {
        "json" => Output::Json,
        "yaml" => Output::Yaml,
        "go-template" => {
            return Err(CrictlError::Usage(
                "unsupported format \"go-template\": nodus crictl prints json or yaml".into(),
            ));
        }
        other => {
            return Err(CrictlError::Usage(format!(
                "don't support {other:?} format"
            )));
        }
    };
    if a.template.as_deref().is_some_and(|t| !t.is_empty()) {
        return Err(CrictlError::Usage(format!(
            "template can't be used with {:?} format",
            a.output
        )));
    }
    if a.count == Some(0) {
        return Ok(());
    }
    let mut stream = c
        .runtime
        .clone()
        .get_container_events(GetEventsRequest {})
        .await
        .map_err(rpc("getting container events"))?
        .into_inner();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut seen = 0u64;
    loop {
        let ev = tokio::select! {
            _ = &mut ctrl_c => return Ok(()),
            m = stream.message() => m.map_err(rpc("getting container events"))?,
        };
        let Some(ev) = ev else {
            return Ok(());
        };
        write_message(out, output, "runtime.v1.ContainerEventResponse", &ev).map_err(io)?;
        out.flush().map_err(io)?;
        seen += 1;
        if a.count.is_some_and(|n| seen >= n) {
            return Ok(());
        }
    }
}
