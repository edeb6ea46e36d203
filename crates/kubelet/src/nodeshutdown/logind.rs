//! logind over the system D-Bus, as upstream's nodeshutdown/systemd package uses it: the
//! `InhibitDelayMaxUSec` property, a drop-in that raises it, a SIGHUP that makes logind
//! read it, the "delay" inhibitor lock, and the `PrepareForShutdown` signal.

use futures::StreamExt;
use std::path::Path;
use std::time::Duration;
use zbus::proxy::CacheProperties;

const LOGIND: &str = "org.freedesktop.login1";
const LOGIND_PATH: &str = "/org/freedesktop/login1";
const LOGIND_MANAGER: &str = "org.freedesktop.login1.Manager";
const SYSTEMD: &str = "org.freedesktop.systemd1";
const SYSTEMD_PATH: &str = "/org/freedesktop/systemd1";
const SYSTEMD_MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// upstream's drop-in: last in logind.conf.d's order, so it wins.
const DROP_IN_DIR: &str = "/etc/systemd/logind.conf.d";
const DROP_IN: &str = "99-kubelet.conf";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("logind over the system D-Bus: {0}")]
    Dbus(#[from] zbus::Error),
    #[error("writing {path}: {source}")]
    DropIn {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "node shutdown manager was unable to update logind InhibitDelayMaxSec to {requested:?} (ShutdownGracePeriod), current value of InhibitDelayMaxSec ({updated:?}) is less than requested ShutdownGracePeriod"
    )]
    Delay {
        requested: Duration,
        updated: Duration,
    },
}

pub struct Logind {
    conn: zbus::Connection,
    manager: zbus::Proxy<'static>,
}

/// The lock: logind keeps it while this descriptor is open.
pub struct InhibitLock(#[allow(dead_code)] zbus::zvariant::OwnedFd);

impl Logind {
    pub async fn connect() -> Result<Logind, Error> {
        let conn = zbus::Connection::system().await?;
        // logind does not announce changes of InhibitDelayMaxUSec: read it afresh each time.
        let manager = zbus::proxy::Builder::new(&conn)
            .destination(LOGIND)?
            .path(LOGIND_PATH)?
            .interface(LOGIND_MANAGER)?
            .cache_properties(CacheProperties::No)
            .build()
            .await?;
        Ok(Logind { conn, manager })
    }

    pub async fn inhibit_delay_max(&self) -> Result<Duration, Error> {
        let usec: u64 = self.manager.get_property("InhibitDelayMaxUSec").await?;
        Ok(Duration::from_micros(usec))
    }

    /// Writes logind's drop-in raising InhibitDelayMaxSec to `delay`.
    pub fn override_inhibit_delay(&self, delay: Duration) -> Result<(), Error> {
        write_drop_in(Path::new(DROP_IN_DIR), delay)
    }

    /// Makes logind read its configuration again (SIGHUP through systemd, as upstream).
    pub async fn reload(&self) -> Result<(), Error> {
        let systemd = zbus::Proxy::new(&self.conn, SYSTEMD, SYSTEMD_PATH, SYSTEMD_MANAGER).await?;
        let _: () = systemd
            .call("KillUnit", &("systemd-logind.service", "all", libc::SIGHUP))
            .await?;
        // logind reloads asynchronously; upstream waits a moment too.
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(())
    }

    pub async fn inhibit(&self) -> Result<InhibitLock, Error> {
        let fd: zbus::zvariant::OwnedFd = self
            .manager
            .call(
                "Inhibit",
                &(
                    "shutdown",
                    "kubelet",
                    "Kubelet needs time to handle node shutdown",
                    "delay",
                ),
            )
            .await?;
        Ok(InhibitLock(fd))
    }

    /// `PrepareForShutdown(active)`: true when a shutdown starts, false when cancelled.
    pub async fn prepare_for_shutdown(
        &self,
    ) -> Result<impl futures::Stream<Item = Result<bool, Error>> + Unpin + use<>, Error> {
        let signals = self.manager.receive_signal("PrepareForShutdown").await?;
        Ok(signals.map(|m| m.body().deserialize::<bool>().map_err(Error::from)))
    }
}

fn write_drop_in(dir: &Path, delay: Duration) -> Result<(), Error> {
    let path = dir.join(DROP_IN);
    let fail = |source| Error::DropIn {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    let body = format!(
        "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec={}\n",
        delay.as_secs()
    );
    std::fs::write(&path, body).map_err(fail)
}

#[cfg(test)]
mod tests {
    #[test]
    fn drop_in_raises_the_delay_in_seconds() {
        let dir = tempfile::tempdir().unwrap();
        super::write_drop_in(dir.path(), std::time::Duration::from_secs(45)).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("99-kubelet.conf")).unwrap(),
            "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=45\n"
        );
    }
}
