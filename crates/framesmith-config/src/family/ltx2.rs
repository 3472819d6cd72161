//! LTX-2's part of validation: what its runs cannot do yet (samples, which need its video VAE and Gemma 3;
//! image-to-video, which needs per-token timesteps) and the settings of other families an LTX-2 run refuses, each
//! by key with its fix.

use std::path::Path;

use super::FamilyRules;
use crate::run::{RunConfig, TrainingMode};
use crate::validate::Checker;

/// LTX-2's rules.
pub(crate) struct Ltx2Rules;

impl FamilyRules for Ltx2Rules {
    fn sampling_files<'a>(
        &self,
        _cfg: &'a RunConfig,
    ) -> Vec<(&'static str, &'a Path, &'static str)> {
        // Samples are refused in `check`, whatever files are given.
        Vec::new()
    }

    fn clip_file(&self) -> &'static str {
        "CLIP model (LTX-2 takes none)"
    }

    fn check(&self, c: &mut Checker, cfg: &RunConfig, _validation_scheduled: bool) {
        let m = &cfg.model;
        if !m.variant.eq_ignore_ascii_case("auto") {
            c.problem(
                "model.variant",
                format!(
                    "names the Wan variant `{}`, but model.dit is LTX-2",
                    m.variant
                ),
                "set model.variant = \"auto\" (LTX-2 and LTX-2.3 are read from the file)",
            );
        }
        if !m.dit_low_noise.as_os_str().is_empty() {
            c.problem(
                "model.dit_low_noise",
                "is for Wan2.2 A14B's low-noise expert; an LTX-2 run trains one DiT",
                "remove model.dit_low_noise",
            );
        }
        if !m.clip.as_os_str().is_empty() {
            c.problem(
                "model.clip",
                "LTX-2 conditions on Gemma 3 through its text connector, not on CLIP",
                "remove model.clip",
            );
        }
        if cfg.training.mode == TrainingMode::ImageToVideo {
            c.problem(
                "training.mode",
                "LTX-2's image-to-video training conditions on the clean first frame with per-token timesteps, \
                 which Framesmith does not have yet",
                "set training.mode = \"text_to_video\" (or \"auto\")",
            );
        }
        if cfg.sampling.prompts.is_some() {
            c.problem(
                "sampling.prompts",
                "samples of an LTX-2 run need its video VAE and the Gemma 3 text encoder, which Framesmith does not \
                 have yet",
                "remove sampling.prompts and the sample schedule (sample_every_n_* / sample_at_first)",
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::PathBuf;

    use crate::plan::{HostInfo, ModelFamily};
    use crate::run::TrainingMode;
    use crate::validate::validate_for;
    use crate::RunConfig;

    /// An LTX-2 run whose files all exist (this source file stands in for each).
    fn ltx2() -> RunConfig {
        let here = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/family/ltx2.rs");
        let mut cfg = RunConfig::default();
        cfg.model.dit = here.clone();
        cfg.dataset.config = here;
        cfg
    }

    #[test]
    fn text_to_video_runs_validate() {
        let mut cfg = ltx2();
        cfg.training.mode = TrainingMode::TextToVideo;
        let plan = validate_for(&cfg, &HostInfo::cpu_only(), ModelFamily::Ltx2)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plan.family, ModelFamily::Ltx2);
        assert_eq!(ModelFamily::Ltx2.to_string(), "LTX-2");
    }

    #[test]
    fn samples_image_to_video_and_other_families_settings_are_refused() {
        let mut cfg = ltx2();
        cfg.sampling.prompts = Some(cfg.model.dit.clone());
        cfg.sampling.sample_every_n_steps = Some(10);
        cfg.training.mode = TrainingMode::ImageToVideo;
        cfg.model.variant = "t2v-1.3b".into();
        cfg.model.clip = cfg.model.dit.clone();
        let errors = validate_for(&cfg, &HostInfo::cpu_only(), ModelFamily::Ltx2).unwrap_err();
        for (key, message, fix) in [
            ("sampling.prompts", "video VAE", "remove sampling.prompts"),
            ("training.mode", "per-token timesteps", "text_to_video"),
            ("model.variant", "Wan variant `t2v-1.3b`", "\"auto\""),
            ("model.clip", "not on CLIP", "remove model.clip"),
        ] {
            let found = errors
                .problems
                .iter()
                .any(|p| p.key == key && p.message.contains(message) && p.fix.contains(fix));
            assert!(found, "{key}: {errors}");
        }
    }
}
