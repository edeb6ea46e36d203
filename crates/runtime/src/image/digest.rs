//! Content digests (`sha256:<64 hex>`), the identity of every blob, layer and image.
//!
//! Only sha256 is accepted: it is what every registry and runtime uses today, and refusing
//! the rest early gives a clear error instead of a blob we could never verify.

use sha2::{Digest as _, Sha256};
use std::fmt;
use std::str::FromStr;

/// A validated `sha256:` digest.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest {
    hex: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DigestError {
    #[error("invalid digest {0:?}: expected sha256:<64 lowercase hex characters>")]
    Invalid(String),
    #[error("unsupported digest algorithm in {0:?}: only sha256 is supported")]
    UnsupportedAlgorithm(String),
}

impl Digest {
    /// The digest of `data`.
    pub fn of(data: &[u8]) -> Self {
        Self {
            hex: hex::encode(Sha256::digest(data)),
        }
    }

    /// Builds a digest from a finished hasher.
    pub fn from_hasher(h: Sha256) -> Self {
        Self {
            hex: hex::encode(h.finalize()),
        }
    }

    /// The 64 hex characters, without the algorithm prefix (used for file names).
    pub fn hex(&self) -> &str {
        &self.hex
    }

    pub fn algorithm(&self) -> &'static str {
        "sha256"
    }

    /// Validates a bare hex string as a sha256 digest.
    pub fn from_hex(hex: &str) -> Result<Self, DigestError> {
        if hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Self {
                hex: hex.to_string(),
            })
        } else {
            Err(DigestError::Invalid(hex.to_string()))
        }
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some(("sha256", hex)) => {
                Self::from_hex(hex).map_err(|_| DigestError::Invalid(s.to_string()))
            }
            Some((alg, _))
                if !alg.is_empty()
                    && alg.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b)
                    }) =>
            {
                Err(DigestError::UnsupportedAlgorithm(s.to_string()))
            }
            _ => Err(DigestError::Invalid(s.to_string())),
        }
    }
}

impl TryFrom<String> for Digest {
    type Error = DigestError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.to_string()
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Incremental hashing of a stream, for verifying blobs while they are written.
#[derive(Default, Clone)]
pub struct Hasher {
    inner: Sha256,
    len: u64,
}

impl Hasher {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn update(&mut self, data: &[u8]) {
        self.inner.update(data);
        self.len += data.len() as u64;
    }
    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn finish(self) -> Digest {
        Digest::from_hasher(self.inner)
    }
}

/// The chain ID of a layer stack as the OCI image spec defines it:
/// `ChainID(L0) = DiffID(L0)`, `ChainID(L0..n) = sha256(ChainID(L0..n-1) + " " + DiffID(Ln))`.
/// Snapshots are keyed by it so images sharing a base share its snapshots.
pub fn chain_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut out: Vec<Digest> = Vec::with_capacity(diff_ids.len());
    for d in diff_ids {
        let next = match out.last() {
            None => d.clone(),
            Some(parent) => Digest::of(format!("{parent} {d}").as_bytes()),
        };
        out.push(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let d = Digest::of(b"");
        assert_eq!(
            d.to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
    }

    #[test]
    fn rejects_bad_digests() {
        assert!(matches!(
            "sha256:abc".parse::<Digest>(),
            Err(DigestError::Invalid(_))
        ));
        assert!(matches!(
            "nonsense".parse::<Digest>(),
            Err(DigestError::Invalid(_))
        ));
        assert!(matches!(
            format!("sha512:{}", "a".repeat(128)).parse::<Digest>(),
            Err(DigestError::UnsupportedAlgorithm(_))
        ));
        let upper = format!("sha256:{}", "A".repeat(64));
        assert!(upper.parse::<Digest>().is_err());
    }

    #[test]
    fn chain_id_follows_the_spec() {
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        let ids = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(ids[0], a);
        assert_eq!(ids[1], Digest::of(format!("{a} {b}").as_bytes()));
    }
}
