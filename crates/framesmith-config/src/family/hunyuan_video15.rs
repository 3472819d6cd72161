//! HunyuanVideo 1.5's part of validation: the files its samples are made with (its VAE, Qwen2.5-VL with the byT5
//! glyph encoder beside it, and for image-to-video samples the SigLIP image encoder in `model.clip`) and the settings
//! of other families a HunyuanVideo 1.5 run refuses, each by key with its fix. `training.mode` picks text- or
//! image-to-video (`auto`: what the caches hold, as musubi-tuner).

use super::cached::{CacheOnlyRules, CacheOnlySamples};

/// HunyuanVideo 1.5's rules.
pub(crate) const HUNYUAN_VIDEO15_RULES: CacheOnlyRules = CacheOnlyRules {
    model: "HunyuanVideo 1.5",
    read_from_file: "HunyuanVideo 1.5 is",
    a_run: "a HunyuanVideo 1.5 run",
    clip_file: "SigLIP image encoder (for image-to-video samples)",
    conditions_on: "Qwen2.5-VL and byT5",
    sample_image_encoder: Some(
        "the SigLIP image encoder (ComfyUI's sigclip_vision_patch14_384.safetensors, or the image_encoder folder of \
         FLUX.1-Redux-dev)",
    ),
    samples: CacheOnlySamples::Made {
        vae: "the HunyuanVideo 1.5 VAE, e.g. hunyuanvideo15_vae_fp16.safetensors (to decode clips)",
        text_encoder:
            "the Qwen2.5-VL-7B text encoder, e.g. qwen_2.5_vl_7b.safetensors, with the byT5 glyph \
                       encoder byt5_small_glyphxl_fp16.safetensors beside it (to encode prompts)",
    },
    no_image_to_video: None,
    first_frame_conditioning: false,
};

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::family::cached::{assert_refused, run_of_existing_files};
    use crate::plan::{HostInfo, ModelFamily};
    use crate::run::TrainingMode;
    use crate::validate::validate_for;

    #[test]
    fn text_and_image_to_video_runs_validate() {
        let mut cfg = run_of_existing_files("src/family/hunyuan_video15.rs");
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
    fn samples_need_their_files_and_other_families_settings_are_refused() {
        let mut cfg = run_of_existing_files("src/family/hunyuan_video15.rs");
        cfg.sampling.prompts = Some(cfg.model.dit.clone());
        cfg.sampling.sample_every_n_steps = Some(10);
        cfg.model.variant = "t2v-1.3b".into();
        cfg.model.clip = cfg.model.dit.clone();
        cfg.training.mode = TrainingMode::TextToVideo;
        assert_refused(
            &cfg,
            ModelFamily::HunyuanVideo15,
            &[
                ("model.vae", "HunyuanVideo 1.5 VAE", "model.vae"),
                (
                    "model.text_encoder",
                    "byt5_small_glyphxl",
                    "model.text_encoder",
                ),
                ("model.variant", "Wan variant `t2v-1.3b`", "\"auto\""),
                ("model.clip", "text-to-video here", "remove model.clip"),
            ],
        );
        cfg.model.variant = "auto".into();
        cfg.model.clip = Default::default();
        cfg.model.vae = cfg.model.dit.clone();
        cfg.model.text_encoder = cfg.model.dit.clone();
        let plan = validate_for(&cfg, &HostInfo::cpu_only(), ModelFamily::HunyuanVideo15)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(plan.sampling.is_some());
    }

    /// An image-to-video run's samples start from images that SigLIP (`model.clip`) encodes: without it they are
    /// refused by key with the file to set; with it the run validates and keeps the encoder.
    #[test]
    fn image_to_video_samples_need_the_siglip_image_encoder() {
        let mut cfg = run_of_existing_files("src/family/hunyuan_video15.rs");
        cfg.sampling.prompts = Some(cfg.model.dit.clone());
        cfg.sampling.sample_every_n_steps = Some(10);
        cfg.model.vae = cfg.model.dit.clone();
        cfg.model.text_encoder = cfg.model.dit.clone();
        cfg.training.mode = TrainingMode::ImageToVideo;
        assert_refused(
            &cfg,
            ModelFamily::HunyuanVideo15,
            &[(
                "model.clip",
                "start from images (--i)",
                "set model.clip to the SigLIP image encoder (ComfyUI's sigclip_vision_patch14_384.safetensors",
            )],
        );
        cfg.model.clip = cfg.model.dit.clone();
        for mode in [TrainingMode::ImageToVideo, TrainingMode::Auto] {
            cfg.training.mode = mode;
            let plan = validate_for(&cfg, &HostInfo::cpu_only(), ModelFamily::HunyuanVideo15)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(plan.model.clip.as_ref(), Some(&cfg.model.dit));
        }
    }
}
