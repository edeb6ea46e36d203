//! The outcome of a remotecommand session as the error stream carries it: a `metav1.Status`
//! JSON document for v4/v5 clients, the bare error text for older ones (which read a
//! successful session as an empty error stream).

use serde::Serialize;

/// How an exec or attach ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Success,
    /// The command exited with a non-zero code; `message` is the runtime's description
    /// (containerd: "error executing command [sh -c exit 3], exit code 3").
    ExitCode {
        code: i32,
        message: String,
    },
    /// The session failed; the kubelet wraps this as an internal error.
    Error(String),
}

#[derive(Serialize)]
struct Cause<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    message: &'a str,
}

#[derive(Serialize)]
struct Details<'a> {
    causes: Vec<Cause<'a>>,
}

#[derive(Serialize, Default)]
struct Empty {}

/// `metav1.Status`, fields in Go's order, empty ones omitted as Go omits them.
#[derive(Serialize)]
struct Status<'a> {
    metadata: Empty,
    status: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<u16>,
}

impl Outcome {
    /// The message upstream puts in the status (and, for v1–v3, on the error stream).
    fn message(&self, what: &str) -> String {
        match self {
            Outcome::Success => String::new(),
            Outcome::ExitCode { message, .. } => {
                format!("command terminated with non-zero exit code: {message}")
            }
            Outcome::Error(e) => format!("Internal error occurred: error {what}: {e}"),
        }
    }

    /// The v4/v5 error-stream document. `what` names the operation for internal errors
    /// ("executing command in container", "attaching to container").
    pub(crate) fn v4_json(&self, what: &str) -> Vec<u8> {
        let message = self.message(what);
        let cause;
        let s = match self {
            Outcome::Success => Status {
                metadata: Empty {},
                status: "Success",
                message: "",
                reason: "",
                details: None,
                code: None,
            },
            Outcome::ExitCode { code, .. } => {
                cause = code.to_string();
                Status {
                    metadata: Empty {},
                    status: "Failure",
                    message: &message,
                    reason: "NonZeroExitCode",
                    details: Some(Details {
                        causes: vec![Cause {
                            reason: Some("ExitCode"),
                            message: &cause,
                        }],
                    }),
                    code: None,
                }
            }
            Outcome::Error(e) => {
                cause = format!("error {what}: {e}");
                Status {
                    metadata: Empty {},
                    status: "Failure",
                    message: &message,
                    reason: "InternalError",
                    details: Some(Details {
                        causes: vec![Cause {
                            reason: None,
                            message: &cause,
                        }],
                    }),
                    code: Some(500),
                }
            }
        };
        serde_json::to_vec(&s).unwrap_or_default()
    }

    /// The v1–v3 error-stream content: nothing on success, else the message.
    pub(crate) fn legacy_text(&self, what: &str) -> Vec<u8> {
        self.message(what).into_bytes()
    }
}

/// Go's `%v` of a `[]string`, as containerd prints the command: `[sh -c exit 3]`.
pub(crate) fn go_list(cmd: &[String]) -> String {
    format!("[{}]", cmd.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_match_the_kubelet() {
        assert_eq!(
            String::from_utf8(Outcome::Success.v4_json("x")).unwrap(),
            r#"{"metadata":{},"status":"Success"}"#
        );
        let cmd = vec!["sh".to_string(), "-c".into(), "exit 3".into()];
        let e = Outcome::ExitCode {
            code: 3,
            message: format!("error executing command {}, exit code 3", go_list(&cmd)),
        };
        assert_eq!(
            String::from_utf8(e.v4_json("executing command in container")).unwrap(),
            r#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#
        );
        let i = Outcome::Error("boom".into());
        assert_eq!(
            String::from_utf8(i.v4_json("attaching to container")).unwrap(),
            r#"{"metadata":{},"status":"Failure","message":"Internal error occurred: error attaching to container: boom","reason":"InternalError","details":{"causes":[{"message":"error attaching to container: boom"}]},"code":500}"#
        );
        assert!(Outcome::Success.legacy_text("x").is_empty());
        assert_eq!(
            String::from_utf8(i.legacy_text("attaching to container")).unwrap(),
            "Internal error occurred: error attaching to container: boom"
        );
    }
}
