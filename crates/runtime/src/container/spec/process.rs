//! The container process's command line, environment and working directory from the CRI
//! config over the image config (containerd's `WithProcessArgs`, `WithDefaultPathEnv`,
//! `WithEnv`).

use cri::runtime::v1::ContainerConfig;
use serde_json::Value;

use super::SpecError;

/// The default `PATH` every container starts from (containerd's `defaultUnixEnv`).
pub(crate) const DEFAULT_PATH_ENV: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The fields of an OCI image config the spec uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ImageConfig {
    pub user: String,
    pub env: Vec<String>,
    /// `None` when absent or null (distinct from `[""]`, which clears the entrypoint).
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Vec<String>,
    pub working_dir: String,
}

impl ImageConfig {
    /// Read the config from either a whole image config document (`{"config": {...}, ...}`)
    /// or the inner `config` object itself. `null` is an empty config.
    pub(crate) fn from_json(v: &Value) -> Result<ImageConfig, SpecError> {
        let cfg = match v {
            Value::Null => return Ok(ImageConfig::default()),
            Value::Object(m) => match m.get("config") {
                Some(Value::Object(_)) => &m["config"],
                Some(Value::Null) => return Ok(ImageConfig::default()),
                _ if m.contains_key("rootfs") || m.contains_key("architecture") => {
                    // A whole image config without a config section.
                    return Ok(ImageConfig::default());
                }
                _ => v,
            },
            other => {
                return Err(SpecError::Internal(format!(
                    "image config must be a JSON object, got {other}"
                )));
            }
        };
        Ok(ImageConfig {
            user: string_field(cfg, "User")?,
            env: string_list(cfg, "Env")?.unwrap_or_default(),
            entrypoint: string_list(cfg, "Entrypoint")?,
            cmd: string_list(cfg, "Cmd")?.unwrap_or_default(),
            working_dir: string_field(cfg, "WorkingDir")?,
        })
    }
}

fn string_field(cfg: &Value, key: &str) -> Result<String, SpecError> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(SpecError::Internal(format!(
            "image config field {key} must be a string, got {other}"
        ))),
    }
}

fn string_list(cfg: &Value, key: &str) -> Result<Option<Vec<String>>, SpecError> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str().map(String::from).ok_or_else(|| {
                    SpecError::Internal(format!(
                        "image config field {key} must be a list of strings, got {i}"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(SpecError::Internal(format!(
            "image config field {key} must be a list of strings, got {other}"
        ))),
    }
}

/// The Docker rules: `command` replaces the entrypoint, `args` replace the cmd; with only
/// `args`, they follow the image entrypoint. An entrypoint of `[""]` counts as none.
pub(crate) fn args(
    config: &ContainerConfig,
    image: &ImageConfig,
) -> Result<Vec<String>, SpecError> {
    let mut command = config.command.clone();
    let mut args = config.args.clone();
    if command.is_empty() {
        if args.is_empty() {
            args = image.cmd.clone();
        }
        if let Some(ep) = &image.entrypoint
            && !(ep.len() == 1 && ep[0].is_empty())
        {
            command = ep.clone();
        }
    }
    if command.is_empty() && args.is_empty() {
        return Err(SpecError::InvalidArgument(format!(
            "no command specified: the container config has no command or args and image {:?} has no Entrypoint or Cmd",
            config
                .image
                .as_ref()
                .map(|i| i.image.as_str())
                .unwrap_or("")
        )));
    }
    command.extend(args);
    Ok(command)
}

/// containerd's `replaceOrAppendEnvValues`: overrides replace the entry with the same key in
/// place or are appended; an override without `=` removes the key.
pub(crate) fn replace_or_append_env(defaults: Vec<String>, overrides: &[String]) -> Vec<String> {
    let key = |e: &str| {
        e.split_once('=')
            .map(|(k, _)| k.to_string())
            .unwrap_or_else(|| e.to_string())
    };
    let mut results: Vec<Option<String>> = Vec::with_capacity(defaults.len() + overrides.len());
    let mut index = std::collections::HashMap::new();
    for e in defaults {
        index.insert(key(&e), results.len());
        results.push(Some(e));
    }
    for o in overrides {
        let k = key(o);
        if !o.contains('=') {
            if let Some(&i) = index.get(&k) {
                results[i] = None;
            }
            continue;
        }
        match index.get(&k) {
            Some(&i) => results[i] = Some(o.clone()),
            None => {
                index.insert(k, results.len());
                results.push(Some(o.clone()));
            }
        }
    }
    results.into_iter().flatten().collect()
}

/// The environment: the default `PATH`, `TERM=xterm` with a tty, `HOSTNAME`, then the image's
/// `Env` and the CRI envs, later ones replacing earlier ones by key.
pub(crate) fn env(config: &ContainerConfig, image: &ImageConfig, hostname: &str) -> Vec<String> {
    let mut env = vec![DEFAULT_PATH_ENV.to_string()];
    if config.tty {
        env.push("TERM=xterm".to_string());
    }
    env = replace_or_append_env(env, &[format!("HOSTNAME={hostname}")]);
    let mut overrides = image.env.clone();
    overrides.extend(
        config
            .envs
            .iter()
            .map(|kv| format!("{}={}", kv.key, kv.value)),
    );
    replace_or_append_env(env, &overrides)
}

/// The working directory: the CRI one, else the image's, else `/`.
pub(crate) fn cwd(config: &ContainerConfig, image: &ImageConfig) -> String {
    if !config.working_dir.is_empty() {
        config.working_dir.clone()
    } else if !image.working_dir.is_empty() {
        image.working_dir.clone()
    } else {
        "/".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cri::runtime::v1::KeyValue;
    use serde_json::json;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    type ArgsCase<'a> = (
        &'a [&'a str],
        &'a [&'a str],
        Option<&'a [&'a str]>,
        &'a [&'a str],
        Option<&'a [&'a str]>,
    );

    #[test]
    fn args_table() {
        // (command, args, entrypoint, cmd, expected)
        let cases: Vec<ArgsCase> = vec![
            (
                &[],
                &[],
                Some(&["/ep"]),
                &["c1", "c2"],
                Some(&["/ep", "c1", "c2"]),
            ),
            (
                &[],
                &[],
                None,
                &["/bin/sh", "-c", "x"],
                Some(&["/bin/sh", "-c", "x"]),
            ),
            // args replace cmd, entrypoint kept.
            (&[], &["a"], Some(&["/ep"]), &["c1"], Some(&["/ep", "a"])),
            // command replaces entrypoint and drops the image cmd.
            (&["/cmd"], &[], Some(&["/ep"]), &["c1"], Some(&["/cmd"])),
            (
                &["/cmd"],
                &["a", "b"],
                Some(&["/ep"]),
                &["c1"],
                Some(&["/cmd", "a", "b"]),
            ),
            // [""] entrypoint counts as none.
            (&[], &[], Some(&[""]), &["c1"], Some(&["c1"])),
            (&[], &[], None, &[], None),
            (&[], &[], Some(&[""]), &[], None),
        ];
        for (i, (command, a, ep, cmd, want)) in cases.into_iter().enumerate() {
            let config = ContainerConfig {
                command: s(command),
                args: s(a),
                ..Default::default()
            };
            let image = ImageConfig {
                entrypoint: ep.map(s),
                cmd: s(cmd),
                ..Default::default()
            };
            match (args(&config, &image), want) {
                (Ok(got), Some(want)) => assert_eq!(got, s(want), "case {i}"),
                (Err(e), None) => {
                    assert!(e.to_string().contains("no command specified"), "{e}");
                    assert_eq!(e.code(), tonic::Code::InvalidArgument);
                }
                (got, want) => panic!("case {i}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn env_order_and_overrides() {
        let image = ImageConfig {
            env: s(&["PATH=/image/bin", "A=1", "B=2"]),
            ..Default::default()
        };
        let config = ContainerConfig {
            envs: vec![
                KeyValue {
                    key: "B".into(),
                    value: "from-cri".into(),
                },
                KeyValue {
                    key: "C".into(),
                    value: "x=y".into(),
                },
                KeyValue {
                    key: "HOSTNAME".into(),
                    value: "mine".into(),
                },
            ],
            tty: true,
            ..Default::default()
        };
        assert_eq!(
            env(&config, &image, "pod-host"),
            s(&[
                "PATH=/image/bin",
                "TERM=xterm",
                "HOSTNAME=mine",
                "A=1",
                "B=from-cri",
                "C=x=y"
            ])
        );
        // Without image env the default PATH stays; no TERM without a tty.
        assert_eq!(
            env(&ContainerConfig::default(), &ImageConfig::default(), "h"),
            s(&[DEFAULT_PATH_ENV, "HOSTNAME=h"])
        );
        // A bare key in the image env removes it.
        assert_eq!(
            replace_or_append_env(s(&["A=1", "B=2"]), &s(&["A"])),
            s(&["B=2"])
        );
    }

    #[test]
    fn cwd_precedence() {
        let image = ImageConfig {
            working_dir: "/img".into(),
            ..Default::default()
        };
        let mut config = ContainerConfig::default();
        assert_eq!(cwd(&config, &ImageConfig::default()), "/");
        assert_eq!(cwd(&config, &image), "/img");
        config.working_dir = "/cri".into();
        assert_eq!(cwd(&config, &image), "/cri");
    }

    #[test]
    fn image_config_shapes() {
        let whole = json!({"architecture": "amd64", "os": "linux",
            "config": {"User": "app", "Env": ["A=1"], "Entrypoint": null, "Cmd": ["sh"], "WorkingDir": "/w"},
            "rootfs": {"type": "layers", "diff_ids": []}});
        let inner = whole["config"].clone();
        let want = ImageConfig {
            user: "app".into(),
            env: s(&["A=1"]),
            entrypoint: None,
            cmd: s(&["sh"]),
            working_dir: "/w".into(),
        };
        assert_eq!(ImageConfig::from_json(&whole).unwrap(), want);
        assert_eq!(ImageConfig::from_json(&inner).unwrap(), want);
        assert_eq!(
            ImageConfig::from_json(&json!(null)).unwrap(),
            ImageConfig::default()
        );
        assert_eq!(
            ImageConfig::from_json(&json!({"architecture": "amd64", "rootfs": {}})).unwrap(),
            ImageConfig::default()
        );
        assert!(ImageConfig::from_json(&json!({"Cmd": "sh"})).is_err());
    }
}
