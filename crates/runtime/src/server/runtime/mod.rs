//! RuntimeService. This issue serves Version and Status; pod sandboxes and containers
//! arrive with the runtime-service issue, and until then answer Unimplemented (the
//! generated default), which CRI clients report as such.

mod status;
mod version;

pub struct RuntimeService {
    _private: (),
}

impl RuntimeService {
    pub fn new() -> Self {
        Self { _private: () }
    }
}

impl Default for RuntimeService {
    fn default() -> Self {
        Self::new()
    }
}

#[tonic::async_trait]
impl cri::runtime::v1::runtime_service_server::RuntimeService for RuntimeService {
    async fn version(
        &self,
        req: tonic::Request<cri::runtime::v1::VersionRequest>,
    ) -> Result<tonic::Response<cri::runtime::v1::VersionResponse>, tonic::Status> {
        version::version(req.into_inner()).map(tonic::Response::new)
    }

    async fn status(
        &self,
        req: tonic::Request<cri::runtime::v1::StatusRequest>,
    ) -> Result<tonic::Response<cri::runtime::v1::StatusResponse>, tonic::Status> {
        status::status(req.into_inner()).map(tonic::Response::new)
    }
}
