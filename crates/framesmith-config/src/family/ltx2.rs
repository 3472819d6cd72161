//! LTX-2's part of validation: the file its samples need besides the checkpoint (Gemma 3; the VAE is the
//! checkpoint's unless `model.vae` names another), image-to-video asked the way LTX-2 does not take it (its official
//! trainer mixes it into text-to-video with `training.first_frame_conditioning_p`, which its runs read) and the
//! settings of other families an LTX-2 run refuses, each by key with its fix.

use super::cached::{CacheOnlyRules, CacheOnlySamples};

/// LTX-2's rules.
pub(crate) const LTX2_RULES: CacheOnlyRules = CacheOnlyRules {
    model: "LTX-2",
    read_from_file: "LTX-2 and LTX-2.3 are",
    a_run: "an LTX-2 run",
    clip_file: "CLIP model (LTX-2 takes none)",
    conditions_on: "Gemma 3 through its text connector",
    sample_image_encoder: None,
    samples: CacheOnlySamples::MadeWithCheckpointVae {
        text_encoder: "Gemma 3 12B, e.g. gemma_3_12B_it.safetensors or the google/gemma-3-12b-it folder (to \
                       encode prompts; the video VAE and the text connector are read from model.dit)",
    },
    no_image_to_video: Some(
        "LTX-2 trains image-to-video as its official trainer does, inside text-to-video: set \
         training.first_frame_conditioning_p, the probability that a clip's first frame is given clean (0.1 by \
         default, 1.0 for every clip)",
    ),
    first_frame_conditioning: true,
};

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::family::cached::{assert_refused, run_of_existing_files};
    use crate::plan::{HostInfo, ModelFamily};
    use crate::run::TrainingMode;
    use crate::validate::validate_for;

    #[test]
    fn text_to_video_runs_validate() {
        let mut cfg = run_of_existing_files("src/family/ltx2.rs");
        cfg.training.mode = TrainingMode::TextToVideo;
        let plan = validate_for(&cfg, &HostInfo::cpu_only(), ModelFamily::Ltx2)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plan.family, ModelFamily::Ltx2);
        assert_eq!(ModelFamily::Ltx2.to_string(), "LTX-2");
    }

    #[test]
    fn first_frame_conditioning_is_a_probability_ltx2_runs_read() {
        let mut cfg = run_of_existing_files("src/family/ltx2.rs");
        cfg.training.first_frame_conditioning_p = Some(1.0);
        validate_for(&cfg, &HostInfo::cpu_only(), ModelFamily::Ltx2)
            .unwrap_or_else(|e| panic!("{e}"));
        cfg.training.first_frame_conditioning_p = Some(1.5);
        assert_refused(
            &cfg,
            ModelFamily::Ltx2,
            &[(
                "training.first_frame_conditioning_p",
                "not a probability",
                "between 0 and 1",
            )],
        );
        cfg.training.first_frame_conditioning_p = Some(0.5);
        assert_refused(
            &cfg,
            ModelFamily::HunyuanVideo15,
            &[(
                "training.first_frame_conditioning_p",
                "no first-frame conditioning",
                "remove training.first_frame_conditioning_p",
            )],
        );
    }

    #[test]
    fn samples_need_gemma_image_to_video_and_other_families_settings_are_refused() {
        let mut cfg = run_of_existing_files("src/family/ltx2.rs");
        cfg.sampling.prompts = Some(cfg.model.dit.clone());
        cfg.sampling.sample_every_n_steps = Some(10);
        cfg.training.mode = TrainingMode::ImageToVideo;
        cfg.model.variant = "t2v-1.3b".into();
        cfg.model.clip = cfg.model.dit.clone();
        assert_refused(
            &cfg,
            ModelFamily::Ltx2,
            &[
                ("model.text_encoder", "Gemma 3 12B", "model.text_encoder"),
                (
                    "training.mode",
                    "first_frame_conditioning_p",
                    "text_to_video",
                ),
                ("model.variant", "Wan variant `t2v-1.3b`", "\"auto\""),
                ("model.clip", "not on CLIP", "remove model.clip"),
            ],
        );
    }
}
