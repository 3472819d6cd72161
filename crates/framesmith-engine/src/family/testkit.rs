//! Models for the generic tests of `plan/` and `train/`, under neutral names: the generic code is tested on one
//! video family's real shapes without naming the family. And what the families' own tests share, each check
//! parametrised by what differs: their plans' ([`plan`]) and their runs' ([`run`]).

use crate::plan::PlanModel;

pub(crate) mod plan;
pub(crate) mod run;

/// A 14B text-to-video model as the planner sees it (40 blocks of width 5120).
pub(crate) fn video_14b() -> PlanModel {
    framesmith_models::wan::WanConfig::wan21_t2v_14b().into()
}
