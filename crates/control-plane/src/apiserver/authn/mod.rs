//! Authentication: who a request comes from. Client certificates (CN is the user, each O a
//! group), bearer tokens (the static `--token-auth-file`, then [`bootstraptoken`]), else `system:anonymous`.
//! [`authenticate_token`] is the one chain every bearer token goes through (requests and
//! TokenReview alike); each token authenticator is a module of its own.

pub mod bootstraptoken;
pub mod impersonation;
pub mod serviceaccount;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use crate::apiserver::state::ApiState;

/// An authenticated (or anonymous) identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    /// The identity's uid (a service account's), empty for most users.
    pub uid: String,
    /// Upstream's `extra` user info (a service-account token's pod, node and credential id).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    pub fn anonymous() -> User {
        User {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..Default::default()
        }
    }
    pub fn is_anonymous(&self) -> bool {
        self.name == "system:anonymous"
    }
    pub fn in_group(&self, g: &str) -> bool {
        self.groups.iter().any(|x| x == g)
    }
    /// `Some(node)` for a `system:node:<node>` identity in `system:nodes`.
    pub fn node_name(&self) -> Option<&str> {
        if !self.in_group("system:nodes") {
            return None;
        }
        self.name.strip_prefix("system:node:")
    }
}

/// Who the TLS client certificate says the peer is: CN is the user, each O a group.
pub fn user_from_cert(der: &[u8]) -> Option<User> {
    let (name, groups) = nodus_serving::x509::identity(der)?;
    Some(User {
        name,
        groups,
        ..Default::default()
    })
}

/// Reads a kube-apiserver `--token-auth-file`: `token,user,uid,"group1,group2"` per line.
pub fn load_token_file(path: &Path) -> std::io::Result<HashMap<String, User>> {
    let mut out = HashMap::new();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields = split_csv(line);
        if fields.len() < 2 || fields[0].is_empty() {
            continue;
        }
        let mut groups: Vec<String> = fields
            .get(3)
            .map(|g| {
                g.split(',')
                    .map(str::trim)
                    .filter(|g| !g.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        groups.push("system:authenticated".into());
        out.insert(
            fields[0].clone(),
            User {
                name: fields[1].clone(),
                uid: fields.get(2).cloned().unwrap_or_default(),
                groups,
                ..Default::default()
            },
        );
    }
    Ok(out)
}

fn split_csv(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// The user a bearer token belongs to, trying each token authenticator in turn; `None` is
/// 401 for a request.
pub fn authenticate_token(st: &ApiState, token: &str) -> Option<User> {
    review_token(st, token, None).ok().map(|a| a.user)
}

/// The bearer-token chain with the audiences asked for (a TokenReview's `spec.audiences`;
/// `None` is the API server's own): who the token is and the audiences it is good for, or
/// the TokenReview's `status.error`, worded as upstream's aggregate of authenticator errors.
pub fn review_token(
    st: &ApiState,
    token: &str,
    audiences: Option<&[String]>,
) -> Result<serviceaccount::Accepted, String> {
    const INVALID: &str = "invalid bearer token";
    let api_audiences = &st.config.api_audiences;
    let for_api = audiences.is_none_or(|a| a.iter().any(|x| api_audiences.contains(x)));
    // Static and bootstrap tokens are audience-agnostic: good for the API server's own
    // audiences only.
    let plain = st
        .tokens
        .get(token)
        .cloned()
        .or_else(|| bootstraptoken::authenticate(st, token));
    if let Some(user) = plain.filter(|_| for_api) {
        let accepted = match audiences {
            Some(a) => a
                .iter()
                .filter(|x| api_audiences.contains(x))
                .cloned()
                .collect(),
            None => api_audiences.clone(),
        };
        return Ok(serviceaccount::Accepted {
            user,
            audiences: accepted,
        });
    }
    match serviceaccount::authenticate(st, token, audiences) {
        Ok(Some(a)) => Ok(a),
        Ok(None) => Err(INVALID.into()),
        Err(e) => Err(format!("[{INVALID}, {e}]")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file_lines_parse_like_kube_apiserver() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokens.csv");
        std::fs::write(&p, "abc,alice,1,\"dev,ops\"\n\n# comment\nxyz,bob,2\n").unwrap();
        let t = load_token_file(&p).unwrap();
        assert_eq!(t["abc"].name, "alice");
        assert_eq!(t["abc"].groups, vec!["dev", "ops", "system:authenticated"]);
        assert_eq!(t["xyz"].groups, vec!["system:authenticated"]);
    }
}
