//! v1 `hugetlb`: `hugetlb.<size>.limit_in_bytes` per page size. A hybrid machine may have
//! hugetlb only in its cgroup2 mount; the driver then uses the v2 files there.

use crate::common::{Files, hugetlb_limits};
use crate::controller::{Controller, ControllerKind};
use crate::error::CgroupError;
use crate::resources::Resources;
use std::path::Path;

pub(crate) struct HugeTlb;

impl Controller for HugeTlb {
    const KIND: ControllerKind = ControllerKind::Hugetlb;

    fn wanted(r: &Resources) -> Option<&'static str> {
        (!r.hugetlb.is_empty()).then_some("hugetlb")
    }

    fn apply(f: &Files, dir: &Path, r: &Resources) -> Result<(), CgroupError> {
        for (size, limit) in &r.hugetlb {
            f.write(
                &dir.join(format!("hugetlb.{size}.limit_in_bytes")),
                &limit.to_string(),
            )?;
        }
        Ok(())
    }

    fn read(dir: &Path, r: &mut Resources) -> Result<(), CgroupError> {
        r.hugetlb = hugetlb_limits(dir, ".limit_in_bytes")?;
        Ok(())
    }
}
