//! FLUX.1's part of validation: the files its samples need (the autoencoder, T5-XXL and CLIP-L) and the Wan-only
//! settings a FLUX.1 run refuses, each by key with its fix.

use std::path::Path;

use super::{FamilyRules, FamilySetting};
use crate::run::{FluxStreamOrder, RunConfig};
use crate::validate::Checker;

/// FLUX.1 [dev]'s rules.
pub(crate) struct FluxRules;

/// FLUX.1's own settings.
const SETTINGS: &[FamilySetting] = &[FamilySetting {
    key: "memory.flux_stream_order",
    flag: "flux-stream-order",
    label: "FLUX.1 stream order",
    section: "Memory",
    help: "FLUX.1 only: which blocks stream first (single-stream, double-stream, or both spread)",
    choices: &FluxStreamOrder::NAMES,
}];

impl FamilyRules for FluxRules {
    fn settings(&self) -> &'static [FamilySetting] {
        SETTINGS
    }

    fn sampling_files<'a>(
        &self,
        cfg: &'a RunConfig,
    ) -> Vec<(&'static str, &'a Path, &'static str)> {
        let m = &cfg.model;
        vec![
            (
                "model.vae",
                &m.vae,
                "the FLUX.1 autoencoder ae.safetensors (to decode images)",
            ),
            (
                "model.text_encoder",
                &m.text_encoder,
                "T5-XXL, e.g. t5xxl_fp16.safetensors (to encode prompts)",
            ),
            (
                "model.clip",
                &m.clip,
                "CLIP-L clip_l.safetensors (to encode prompts)",
            ),
        ]
    }

    fn clip_file(&self) -> &'static str {
        "CLIP-L text encoder"
    }

    /// The Wan-only settings of a FLUX.1 run (`validation_scheduled`: `[validation]` asks for evaluations).
    fn check(&self, c: &mut Checker, cfg: &RunConfig, validation_scheduled: bool) {
        super::image_family_checks(c, cfg, ("FLUX.1 [dev]", "FLUX.1"));
        if validation_scheduled {
            let v = &cfg.validation;
            let key = if v.validate_every_n_steps.is_some_and(|n| n > 0) {
                "validation.validate_every_n_steps"
            } else if v.validate_every_n_epochs.is_some_and(|n| n > 0) {
                "validation.validate_every_n_epochs"
            } else {
                "validation.validate_at_save"
            };
            c.problem(
                key,
                "validation of FLUX.1 runs is not available yet",
                "remove the [validation] schedule",
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

    /// A FLUX.1 run whose files all exist (this source file stands in for each).
    fn flux() -> RunConfig {
        let here = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/family/flux.rs");
        let mut cfg = RunConfig::default();
        cfg.model.dit = here.clone();
        cfg.dataset.config = here;
        cfg
    }

    fn with_samples(mut cfg: RunConfig) -> RunConfig {
        let here = cfg.model.dit.clone();
        cfg.sampling.prompts = Some(here.clone());
        cfg.sampling.sample_every_n_steps = Some(10);
        cfg.model.vae = here.clone();
        cfg.model.text_encoder = here.clone();
        cfg.model.clip = here;
        cfg
    }

    #[test]
    fn flux_runs_take_sampling_with_the_autoencoder_t5_and_clip_l() {
        let cfg = with_samples(flux());
        let plan = validate_for(&cfg, &HostInfo::cpu_only(), ModelFamily::Flux)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plan.family, ModelFamily::Flux);
        let sampling = plan.sampling.unwrap();
        assert_eq!(sampling.every_n_steps, Some(10));

        let mut no_clip = cfg.clone();
        no_clip.model.clip = PathBuf::new();
        let errors = validate_for(&no_clip, &HostInfo::cpu_only(), ModelFamily::Flux).unwrap_err();
        let p = errors.for_key("model.clip").unwrap();
        assert!(p.message.contains("CLIP-L"), "{p}");
        assert!(p.fix.contains("set model.clip"), "{p}");
        // A Wan run needs no CLIP for text-to-video samples.
        assert!(validate_for(&no_clip, &HostInfo::cpu_only(), ModelFamily::Wan).is_ok());

        let mut no_t5 = cfg;
        no_t5.model.text_encoder = PathBuf::new();
        let errors = validate_for(&no_t5, &HostInfo::cpu_only(), ModelFamily::Flux).unwrap_err();
        assert!(errors
            .for_key("model.text_encoder")
            .unwrap()
            .message
            .contains("T5-XXL"));
    }

    #[test]
    fn wan_only_settings_of_a_flux_run_are_refused_by_key_with_the_fix() {
        let mut cfg = with_samples(flux());
        cfg.model.variant = "t2v-1.3b".into();
        cfg.model.dit_low_noise = cfg.model.dit.with_extension("low");
        cfg.training.mode = TrainingMode::ImageToVideo;
        cfg.validation.validate_every_n_epochs = Some(1);
        let errors = validate_for(&cfg, &HostInfo::cpu_only(), ModelFamily::Flux).unwrap_err();
        let expect = [
            (
                "model.variant",
                "Wan variant `t2v-1.3b`",
                "model.variant = \"auto\"",
            ),
            (
                "model.dit_low_noise",
                "low-noise expert",
                "remove model.dit_low_noise",
            ),
            ("training.mode", "text-to-image", "\"auto\""),
            (
                "validation.validate_every_n_epochs",
                "FLUX.1",
                "remove the [validation]",
            ),
        ];
        for (key, message, fix) in expect {
            let found = errors
                .problems
                .iter()
                .any(|p| p.key == key && p.message.contains(message) && p.fix.contains(fix));
            assert!(found, "{key}: {errors}");
        }
        // The sampling section itself is not among them.
        assert!(
            errors
                .problems
                .iter()
                .all(|p| !p.key.starts_with("sampling")),
            "{errors}"
        );
    }
}
