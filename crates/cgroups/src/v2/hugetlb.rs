//! v2 `hugetlb`: `hugetlb.<size>.max` per page size (the `.rsvd` variants are left alone,
//! as upstream's kubelet does).

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
            f.write(&dir.join(format!("hugetlb.{size}.max")), &limit.to_string())?;
        }
        Ok(())
    }

    fn read(dir: &Path, r: &mut Resources) -> Result<(), CgroupError> {
        r.hugetlb = hugetlb_limits(dir, ".max")?;
        Ok(())
    }
}
