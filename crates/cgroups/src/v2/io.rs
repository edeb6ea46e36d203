//! v2 `io`: enabled for its statistics only (the kubelet sets no io limits); its pressure
//! figures come from `io.pressure`.

use crate::controller::{Controller, ControllerKind};
use crate::stats::{Stats, StatsError, pressure};
use std::path::Path;

pub(crate) struct Io;

impl Controller for Io {
    const KIND: ControllerKind = ControllerKind::Io;

    fn stats(dir: &Path, s: &mut Stats) -> Result<(), StatsError> {
        s.psi.io = pressure(dir, "io.pressure");
        Ok(())
    }
}
