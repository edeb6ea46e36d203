//! Group/version/kind identity of API objects.

use serde_json::Value;

/// A group, version and kind; the core group is the empty string.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Gvk {
    pub group: String,
    pub version: String,
    pub kind: String,
}

impl Gvk {
    pub fn new(
        group: impl Into<String>,
        version: impl Into<String>,
        kind: impl Into<String>,
    ) -> Gvk {
        Gvk {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
        }
    }

    /// The `apiVersion` string: `v1` for the core group, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Reads `apiVersion` and `kind` from an object; `None` when either is missing or empty.
    pub fn from_object(obj: &Value) -> Option<Gvk> {
        let api_version = obj.get("apiVersion")?.as_str()?;
        let kind = obj.get("kind")?.as_str()?;
        if api_version.is_empty() || kind.is_empty() {
            return None;
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        if version.is_empty() {
            return None;
        }
        Some(Gvk::new(group, version, kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn api_version_of_core_and_named_groups() {
        assert_eq!(Gvk::new("", "v1", "Pod").api_version(), "v1");
        assert_eq!(
            Gvk::new("apps", "v1", "Deployment").api_version(),
            "apps/v1"
        );
    }

    #[test]
    fn from_object_splits_api_version() {
        let gvk = Gvk::from_object(&json!({"apiVersion": "apps/v1", "kind": "Deployment"}));
        assert_eq!(gvk, Some(Gvk::new("apps", "v1", "Deployment")));
        let gvk = Gvk::from_object(&json!({"apiVersion": "v1", "kind": "Pod"}));
        assert_eq!(gvk, Some(Gvk::new("", "v1", "Pod")));
        assert_eq!(Gvk::from_object(&json!({"kind": "Pod"})), None);
        assert_eq!(
            Gvk::from_object(&json!({"apiVersion": "v1", "kind": ""})),
            None
        );
    }
}
