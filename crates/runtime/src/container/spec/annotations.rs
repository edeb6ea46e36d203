//! OCI annotations of a container: containerd's CRI annotations
//! (`io.kubernetes.cri.*`), plus the pod and container annotations whose keys match the
//! runtime handler's `pod_annotations` / `container_annotations` patterns (containerd passes
//! no others through).

use std::collections::HashMap;

use super::SpecInput;

pub(crate) const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
pub(crate) const CONTAINER_TYPE_CONTAINER: &str = "container";
/// The type of a container that is a sandbox of its own (runsc reads it: a `container`
/// joins the sandbox named by [`SANDBOX_ID`], a `sandbox` starts one).
pub(crate) const CONTAINER_TYPE_SANDBOX: &str = "sandbox";
pub(crate) const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
pub(crate) const SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
pub(crate) const SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
pub(crate) const SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
pub(crate) const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
pub(crate) const IMAGE_NAME: &str = "io.kubernetes.cri.image-name";

/// Go's `path.Match`: `*` (any run of non-`/`), `?` (one non-`/`), `[...]` classes with
/// ranges and `^` negation, `\` escapes. A malformed pattern matches nothing.
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
    fn class(p: &[char], c: char) -> Option<(bool, usize)> {
        // p starts after '['; returns (matched, chars consumed including ']').
        let mut i = 0;
        let negate = p.first() == Some(&'^');
        if negate {
            i += 1;
        }
        let mut matched = false;
        let mut first = true;
        loop {
            let lo = *p.get(i)?;
            if lo == ']' && !first {
                i += 1;
                break;
            }
            first = false;
            let lo = if lo == '\\' {
                i += 1;
                *p.get(i)?
            } else {
                lo
            };
            i += 1;
            let mut hi = lo;
            if p.get(i) == Some(&'-') && p.get(i + 1).is_some_and(|c| *c != ']') {
                hi = if p[i + 1] == '\\' {
                    i += 1;
                    *p.get(i + 1)?
                } else {
                    p[i + 1]
                };
                i += 2;
            }
            if lo <= c && c <= hi {
                matched = true;
            }
        }
        Some((matched != negate, i))
    }
    fn rec(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => {
                let rest = &p[1..];
                let mut k = 0;
                loop {
                    if rec(rest, &n[k..]) {
                        return true;
                    }
                    if k == n.len() || n[k] == '/' {
                        return false;
                    }
                    k += 1;
                }
            }
            Some('?') => !n.is_empty() && n[0] != '/' && rec(&p[1..], &n[1..]),
            Some('[') => {
                let Some(&c) = n.first() else { return false };
                if c == '/' {
                    return false;
                }
                match class(&p[1..], c) {
                    Some((true, used)) => rec(&p[1 + used..], &n[1..]),
                    _ => false,
                }
            }
            Some('\\') => match p.get(1) {
                Some(e) => n.first() == Some(e) && rec(&p[2..], &n[1..]),
                None => false,
            },
            Some(c) => n.first() == Some(c) && rec(&p[1..], &n[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    rec(&p, &n)
}

fn passthrough(
    out: &mut HashMap<String, String>,
    annotations: &HashMap<String, String>,
    patterns: &[String],
) {
    for (k, v) in annotations {
        if patterns.iter().any(|p| glob_match(p, k)) {
            out.insert(k.clone(), v.clone());
        }
    }
}

/// The annotations of the container's spec.
pub(crate) fn build(input: &SpecInput) -> HashMap<String, String> {
    let mut out = HashMap::new();
    passthrough(
        &mut out,
        &input.sandbox_config.annotations,
        input.pod_annotations,
    );
    passthrough(
        &mut out,
        &input.config.annotations,
        input.container_annotations,
    );
    let meta = input.sandbox_config.metadata.clone().unwrap_or_default();
    let container_name = input
        .config
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    let image_name = input
        .config
        .image
        .as_ref()
        .map(|i| {
            if i.user_specified_image.is_empty() {
                i.image.clone()
            } else {
                i.user_specified_image.clone()
            }
        })
        .unwrap_or_default();
    for (k, v) in [
        (SANDBOX_ID, input.sandbox_id.to_string()),
        (SANDBOX_NAMESPACE, meta.namespace),
        (SANDBOX_UID, meta.uid),
        (SANDBOX_NAME, meta.name),
        (CONTAINER_NAME, container_name),
        (IMAGE_NAME, image_name),
        (CONTAINER_TYPE, CONTAINER_TYPE_CONTAINER.to_string()),
    ] {
        out.insert(k.to_string(), v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn go_path_match() {
        for (p, n, want) in [
            ("*", "abc", true),
            ("*", "a/b", false),
            (
                "io.katacontainers.*",
                "io.katacontainers.config.hypervisor",
                true,
            ),
            ("io.katacontainers.*", "io.kata", false),
            ("a?c", "abc", true),
            ("a?c", "a/c", false),
            ("[a-c]x", "bx", true),
            ("[^a-c]x", "bx", false),
            ("[^a-c]x", "dx", true),
            ("example.com/*", "example.com/key", true),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("\\*", "*", true),
            ("[", "[", false),
        ] {
            assert_eq!(glob_match(p, n), want, "{p:?} vs {n:?}");
        }
    }
}
