//! v2 `pids`: the same `pids.max` and `pids.current` files as v1, so the same controller.

pub(crate) use crate::v1::pids::Pids;
