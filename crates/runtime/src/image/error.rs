//! The image service's error, classified the way CRI clients act on it.

use std::sync::Arc;

/// What went wrong, in the categories a caller branches on. The message always names the
/// image and the cause; the kind picks the gRPC code ([`ImageError::code_name`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// Malformed reference or request.
    InvalidArgument,
    /// Image, tag or blob unknown to the registry or the store.
    NotFound,
    /// The registry refused our credentials (or wanted some).
    Unauthenticated,
    /// The registry could not be reached or failed (connection refused, 5xx, timeout).
    Unavailable,
    /// Content did not match its digest or size: a corrupt or truncated download.
    DataLoss,
    /// The image is used by a container and cannot be removed.
    InUse,
    /// Anything else: local I/O, unpack failures.
    Internal,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ImageError {
    pub kind: ErrorKind,
    pub message: Arc<str>,
}

impl ImageError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into().into(),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// The same error with context in front, e.g. `failed to pull and unpack image "x": …`.
    pub fn context(self, ctx: impl std::fmt::Display) -> Self {
        Self::new(self.kind, format!("{ctx}: {}", self.message))
    }
}

impl From<super::distribution::DistributionError> for ImageError {
    fn from(e: super::distribution::DistributionError) -> Self {
        use super::distribution::ErrorKind as D;
        let kind = match e.kind() {
            // containerd reports "no match for platform in manifest: not found".
            D::NotFound | D::NoMatchingPlatform => ErrorKind::NotFound,
            D::Unauthorized => ErrorKind::Unauthenticated,
            D::Unavailable => ErrorKind::Unavailable,
            D::DigestMismatch => ErrorKind::DataLoss,
            D::InvalidManifest | D::InvalidReference | D::InvalidConfig => {
                ErrorKind::InvalidArgument
            }
        };
        Self::new(kind, e.message())
    }
}

impl From<super::content::ContentError> for ImageError {
    fn from(e: super::content::ContentError) -> Self {
        use super::content::ContentError as C;
        let kind = match &e {
            C::DigestMismatch { .. } | C::SizeMismatch { .. } | C::Truncated { .. } => {
                ErrorKind::DataLoss
            }
            // The stream's own failure (network) keeps the registry client's classification.
            C::Source { source, .. } => source
                .downcast_ref::<super::distribution::DistributionError>()
                .map(|d| Self::from(d.clone()).kind)
                .unwrap_or(ErrorKind::Unavailable),
            C::NotFound(_) => ErrorKind::NotFound,
            C::TooLarge { .. } => ErrorKind::InvalidArgument,
            C::Io { .. } => ErrorKind::Internal,
        };
        Self::new(kind, e.to_string())
    }
}
