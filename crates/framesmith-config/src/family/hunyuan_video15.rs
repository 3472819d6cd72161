//! HunyuanVideo 1.5's part of validation: what its runs cannot do yet (samples, which need its VAE) and the
//! settings of other families a HunyuanVideo 1.5 run refuses, each by key with its fix. `training.mode` picks text-
//! or image-to-video (`auto`: what the caches hold, as musubi-tuner).

use std::path::Path;

use super::FamilyRules;
use crate::run::RunConfig;
use crate::validate::Checker;

/// HunyuanVideo 1.5's rules.
pub(crate) struct HunyuanVideo15Rules;

impl FamilyRules for HunyuanVideo15Rules {
    fn sampling_files<'a>(
        &self,
        _cfg: &'a RunConfig,
    ) -> Vec<(&'static str, &'a Path, &'static str)> {
        // Samples are refused in `check`, whatever files are given.
        Vec::new()
    }

    fn clip_file(&self) -> &'static str {
        "CLIP model (HunyuanVideo 1.5 takes none)"
    }

    fn check(&self, c: &mut Checker, cfg: &RunConfig, _validation_scheduled: bool) {
        let m = &cfg.model;
        if !m.variant.eq_ignore_ascii_case("auto") {
            c.problem(
                "model.variant",
                format!(
                    "names the Wan variant `{}`, but model.dit is HunyuanVideo 1.5",
                    m.variant
                ),
                "set model.variant = \"auto\" (HunyuanVideo 1.5 is read from the file)",
            );
        }
        if !m.dit_low_noise.as_os_str().is_empty() {
            c.problem(
                "model.dit_low_noise",
                "is for Wan2.2 A14B's low-noise expert; a HunyuanVideo 1.5 run trains one DiT",
                "remove model.dit_low_noise",
            );
        }
        if !m.clip.as_os_str().is_empty() {
            c.problem(
                "model.clip",
                "HunyuanVideo 1.5 conditions on Qwen2.5-VL and byT5, not on CLIP",
                "remove model.clip",
            );
        }
        if cfg.sampling.prompts.is_some() {
            c.problem(
                "sampling.prompts",
                "samples of a HunyuanVideo 1.5 run need the byT5 glyph encoder, which Framesmith does not have yet",
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

    /// A HunyuanVideo 1.5 run whose files all exist (this source file stands in for each).
    fn hunyuan_video15() -> RunConfig {
        let here = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/family/hunyuan_video15.rs");
        let mut cfg = RunConfig::default();
        cfg.model.dit = here.clone();
        cfg.dataset.config = here;
        cfg
    }

    #[test]
    fn text_and_image_to_video_runs_validate() {
        let mut cfg = hunyuan_video15();
        for mode in [TrainingMode::TextToVideo, TrainingMode::ImageToVideo] {
            cfg.training.mode = mode;
            let plan = validate_for(&cfg, &HostInfo::cpu_only(), ModelFamily::HunyuanVideo15)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(plan.family, ModelFamily::HunyuanVideo15);
            assert_eq!(plan.training.mode, mode);
        }
        assert_eq!(ModelFamily::HunyuanVideo15.to_string(), "HunyuanVideo 1.5");
    }

    #[test]
    fn samples_and_other_families_settings_are_refused_with_what_is_missing() {
        let mut cfg = hunyuan_video15();
        cfg.sampling.prompts = Some(cfg.model.dit.clone());
        cfg.sampling.sample_every_n_steps = Some(10);
        cfg.model.vae = cfg.model.dit.clone();
        cfg.model.variant = "t2v-1.3b".into();
        cfg.model.clip = cfg.model.dit.clone();
        let errors =
            validate_for(&cfg, &HostInfo::cpu_only(), ModelFamily::HunyuanVideo15).unwrap_err();
        for (key, message, fix) in [
            (
                "sampling.prompts",
                "byT5 glyph encoder",
                "remove sampling.prompts",
            ),
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
