//! v2 `cpuset`: the same `cpuset.cpus` and `cpuset.mems` files as v1, so the same
//! controller; only v1's copying of the parent's values into a new level is not needed (an
//! empty v2 cpuset inherits its parent's effective set).

pub(crate) use crate::v1::cpuset::CpuSet;
