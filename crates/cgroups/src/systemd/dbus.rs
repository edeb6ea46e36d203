//! The calls to systemd's manager object (org.freedesktop.systemd1.Manager) that the
//! driver needs: StartTransientUnit, SetUnitProperties, StopUnit and ResetFailedUnit, each
//! job awaited through its JobRemoved signal as runc does.
//!
//! zbus's blocking API runs on its own tokio runtime, and entering a runtime from a thread
//! that already runs one panics; the kubelet calls the cgroup driver from its async tasks, so
//! every call runs on a thread of its own, which also bounds the wait for a job.

use super::properties::Prop;
use crate::error::CgroupError;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zbus::blocking::{Connection, MessageIterator};
use zbus::zvariant::{OwnedObjectPath, Value};

const DEST: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// How long a job may take (runc waits 30s for a unit to start).
const JOB_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection to the system bus, made on first use and kept.
#[derive(Debug, Clone, Default)]
pub(crate) struct Systemd {
    conn: Arc<Mutex<Option<Connection>>>,
}

/// What became of a request for a unit that may not exist.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Done,
    /// StartTransientUnit of a unit systemd already has (upstream's kubelet then updates it).
    Exists,
    /// The unit is not loaded.
    NoSuchUnit,
}

type Props = Vec<(String, Value<'static>)>;

fn to_value(p: Prop) -> Value<'static> {
    match p {
        Prop::Bool(b) => Value::from(b),
        Prop::U64(v) => Value::from(v),
        Prop::Str(s) => Value::from(s),
        Prop::Strs(v) => Value::from(v),
        Prop::Bytes(v) => Value::from(v),
    }
}

fn to_props(p: Vec<(&'static str, Prop)>) -> Props {
    p.into_iter()
        .map(|(k, v)| (k.to_string(), to_value(v)))
        .collect()
}

fn dbus_err(op: &'static str, unit: &str, e: zbus::Error) -> CgroupError {
    CgroupError::Systemd {
        op,
        unit: unit.to_string(),
        message: e.to_string(),
    }
}

fn error_name(e: &zbus::Error) -> Option<&str> {
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.as_str()),
        _ => None,
    }
}

impl Systemd {
    fn connection(&self, unit: &str) -> Result<Connection, CgroupError> {
        let mut g = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = g.as_ref() {
            return Ok(c.clone());
        }
        let c = Connection::system().map_err(|e| dbus_err("connect to", unit, e))?;
        // JobRemoved is only sent to subscribed clients.
        c.call_method(Some(DEST), PATH, Some(MANAGER), "Subscribe", &())
            .map_err(|e| dbus_err("subscribe for", unit, e))?;
        *g = Some(c.clone());
        Ok(c)
    }

    /// Runs `f` on a thread of its own with the connection, waiting at most [`JOB_TIMEOUT`].
    fn run<T: Send + 'static>(
        &self,
        op: &'static str,
        unit: &str,
        f: impl FnOnce(&Connection) -> Result<T, CgroupError> + Send + 'static,
    ) -> Result<T, CgroupError> {
        let me = self.clone();
        let u = unit.to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("systemd-dbus".into())
            .spawn(move || {
                let r = me.connection(&u).and_then(|c| f(&c));
                let _ = tx.send(r);
            })
            .map_err(|e| CgroupError::Systemd {
                op,
                unit: unit.to_string(),
                message: format!("cannot start a thread: {e}"),
            })?;
        rx.recv_timeout(JOB_TIMEOUT).unwrap_or_else(|_| {
            Err(CgroupError::Systemd {
                op,
                unit: unit.to_string(),
                message: format!("no answer within {}s", JOB_TIMEOUT.as_secs()),
            })
        })
    }

    /// Starts transient unit `unit` with `props` and waits for its job.
    pub fn start_transient(
        &self,
        unit: &str,
        props: Vec<(&'static str, Prop)>,
    ) -> Result<Outcome, CgroupError> {
        let props = to_props(props);
        let u = unit.to_string();
        self.run("start", unit, move |c| {
            let aux: Vec<(String, Props)> = Vec::new();
            job(c, "start", &u, |c| {
                c.call_method(
                    Some(DEST),
                    PATH,
                    Some(MANAGER),
                    "StartTransientUnit",
                    &(u.as_str(), "replace", props, aux),
                )
            })
        })
    }

    /// Sets `props` on loaded unit `unit` (for this boot only, as runc does).
    pub fn set_properties(
        &self,
        unit: &str,
        props: Vec<(&'static str, Prop)>,
    ) -> Result<Outcome, CgroupError> {
        let props = to_props(props);
        let u = unit.to_string();
        self.run("set properties of", unit, move |c| {
            match c.call_method(
                Some(DEST),
                PATH,
                Some(MANAGER),
                "SetUnitProperties",
                &(u.as_str(), true, props),
            ) {
                Ok(_) => Ok(Outcome::Done),
                Err(e) if error_name(&e) == Some("org.freedesktop.systemd1.NoSuchUnit") => {
                    Ok(Outcome::NoSuchUnit)
                }
                Err(e) => Err(dbus_err("set properties of", &u, e)),
            }
        })
    }

    /// Stops `unit`, waits for the job, and forgets a failed state so the name can be
    /// started again.
    pub fn stop(&self, unit: &str) -> Result<Outcome, CgroupError> {
        let u = unit.to_string();
        self.run("stop", unit, move |c| {
            let r = job(c, "stop", &u, |c| {
                c.call_method(
                    Some(DEST),
                    PATH,
                    Some(MANAGER),
                    "StopUnit",
                    &(u.as_str(), "replace"),
                )
            });
            let _ = c.call_method(
                Some(DEST),
                PATH,
                Some(MANAGER),
                "ResetFailedUnit",
                &(u.as_str(),),
            );
            r
        })
    }
}

/// Makes the call that queues a job and waits for the JobRemoved signal of that job; the
/// match is in place before the call, so a job that ends at once is not missed.
fn job(
    c: &Connection,
    op: &'static str,
    unit: &str,
    call: impl FnOnce(&Connection) -> zbus::Result<zbus::Message>,
) -> Result<Outcome, CgroupError> {
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .sender(DEST)
        .and_then(|b| b.interface(MANAGER))
        .and_then(|b| b.member("JobRemoved"))
        .map(|b| b.build())
        .map_err(|e| dbus_err(op, unit, e))?;
    let signals =
        MessageIterator::for_match_rule(rule, c, None).map_err(|e| dbus_err(op, unit, e))?;
    let reply = match call(c) {
        Ok(r) => r,
        Err(e) => {
            return match error_name(&e) {
                Some("org.freedesktop.systemd1.UnitExists") => Ok(Outcome::Exists),
                Some("org.freedesktop.systemd1.NoSuchUnit") => Ok(Outcome::NoSuchUnit),
                _ => Err(dbus_err(op, unit, e)),
            };
        }
    };
    let path: OwnedObjectPath = reply
        .body()
        .deserialize()
        .map_err(|e| dbus_err(op, unit, e))?;
    for msg in signals {
        let msg = msg.map_err(|e| dbus_err(op, unit, e))?;
        let Ok((_id, job, _unit, result)) = msg
            .body()
            .deserialize::<(u32, OwnedObjectPath, String, String)>()
        else {
            continue;
        };
        if job != path {
            continue;
        }
        return match result.as_str() {
            "done" => Ok(Outcome::Done),
            _ => Err(CgroupError::SystemdJob {
                op,
                unit: unit.to_string(),
                result,
            }),
        };
    }
    Err(CgroupError::Systemd {
        op,
        unit: unit.to_string(),
        message: "the bus connection closed before the job finished".into(),
    })
}
