//! What validation checks differently for each model family, one file per family behind [`FamilyRules`];
//! [`rules`] is the one place the config crate turns a [`ModelFamily`] into its rules.

use std::path::Path;

use crate::plan::ModelFamily;
use crate::run::RunConfig;
use crate::validate::Checker;

mod flux;
mod qwen_image;
mod wan;

/// A family's part of validating a run config.
pub(crate) trait FamilyRules: Sync {
    /// The model files samples of the family's runs need: (key, path, what it is for).
    fn sampling_files<'a>(&self, cfg: &'a RunConfig)
        -> Vec<(&'static str, &'a Path, &'static str)>;
    /// What `model.clip` holds for the family's runs, as messages name it.
    fn clip_file(&self) -> &'static str;
    /// The family's own checks of `cfg` (`validation_scheduled`: `[validation]` asks for evaluations).
    fn check(&self, _c: &mut Checker, _cfg: &RunConfig, _validation_scheduled: bool) {}
}

/// The rules of `family`.
pub(crate) fn rules(family: ModelFamily) -> &'static dyn FamilyRules {
    match family {
        ModelFamily::Wan => &wan::WanRules,
        ModelFamily::Flux => &flux::FluxRules,
        ModelFamily::QwenImage => &qwen_image::QwenImageRules,
    }
}
