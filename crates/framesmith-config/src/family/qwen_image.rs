//! Qwen-Image's part of validation: the files its samples need (its VAE and the Qwen2.5-VL text encoder) and the
//! settings of other families a Qwen-Image run refuses, each by key with its fix.

use std::path::Path;

use super::FamilyRules;
use crate::run::RunConfig;
use crate::validate::Checker;

/// Qwen-Image's rules.
pub(crate) struct QwenImageRules;

impl FamilyRules for QwenImageRules {
    fn sampling_files<'a>(
        &self,
        cfg: &'a RunConfig,
    ) -> Vec<(&'static str, &'a Path, &'static str)> {
        let m = &cfg.model;
        vec![
            (
                "model.vae",
                &m.vae,
                "the Qwen-Image VAE qwen_image_vae.safetensors (to decode images)",
            ),
            (
                "model.text_encoder",
                &m.text_encoder,
                "the Qwen2.5-VL-7B text encoder, e.g. qwen_2.5_vl_7b.safetensors (to encode prompts)",
            ),
        ]
    }

    fn clip_file(&self) -> &'static str {
        "CLIP model (Qwen-Image takes none)"
    }

    fn check(&self, c: &mut Checker, cfg: &RunConfig, _validation_scheduled: bool) {
        super::image_family_checks(c, cfg, ("Qwen-Image", "Qwen-Image"));
        if !cfg.model.clip.as_os_str().is_empty() {
            c.problem(
                "model.clip",
                "Qwen-Image conditions on its Qwen2.5-VL text encoder alone, not on CLIP",
                "remove model.clip",
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

    /// A Qwen-Image run with samples whose files all exist (this source file stands in for each).
    fn qwen_image() -> RunConfig {
        let here = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/family/qwen_image.rs");
        let mut cfg = RunConfig::default();
        cfg.model.dit = here.clone();
        cfg.dataset.config = here.clone();
        cfg.sampling.prompts = Some(here.clone());
        cfg.sampling.sample_every_n_steps = Some(10);
        cfg.model.vae = here.clone();
        cfg.model.text_encoder = here;
        cfg
    }

    #[test]
    fn qwen_image_runs_sample_with_the_vae_and_qwen25_vl() {
        let cfg = qwen_image();
        let plan = validate_for(&cfg, &HostInfo::cpu_only(), ModelFamily::QwenImage)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plan.family, ModelFamily::QwenImage);
        assert_eq!(ModelFamily::QwenImage.to_string(), "Qwen-Image");

        let mut no_te = cfg.clone();
        no_te.model.text_encoder = PathBuf::new();
        let errors =
            validate_for(&no_te, &HostInfo::cpu_only(), ModelFamily::QwenImage).unwrap_err();
        let p = errors.for_key("model.text_encoder").unwrap();
        assert!(p.message.contains("Qwen2.5-VL"), "{p}");
        let mut no_vae = cfg;
        no_vae.model.vae = PathBuf::new();
        let errors =
            validate_for(&no_vae, &HostInfo::cpu_only(), ModelFamily::QwenImage).unwrap_err();
        assert!(errors
            .for_key("model.vae")
            .unwrap()
            .message
            .contains("qwen_image_vae"));
    }

    #[test]
    fn settings_of_other_families_are_refused_by_key_with_the_fix() {
        let mut cfg = qwen_image();
        cfg.model.variant = "t2v-1.3b".into();
        cfg.model.clip = cfg.model.dit.clone();
        cfg.model.dit_low_noise = cfg.model.dit.with_extension("low");
        cfg.training.mode = TrainingMode::ImageToVideo;
        let errors = validate_for(&cfg, &HostInfo::cpu_only(), ModelFamily::QwenImage).unwrap_err();
        for (key, message, fix) in [
            ("model.variant", "Wan variant `t2v-1.3b`", "\"auto\""),
            ("model.clip", "not on CLIP", "remove model.clip"),
            (
                "model.dit_low_noise",
                "low-noise expert",
                "remove model.dit_low_noise",
            ),
            ("training.mode", "text-to-image", "\"auto\""),
        ] {
            let found = errors
                .problems
                .iter()
                .any(|p| p.key == key && p.message.contains(message) && p.fix.contains(fix));
            assert!(found, "{key}: {errors}");
        }
    }
}
