//! Wan's part of validation: the files its samples need (the VAE and umT5); what `model.clip` holds for it.

use std::path::Path;

use super::FamilyRules;
use crate::run::RunConfig;

/// Wan's rules (the demo model's too).
pub(crate) struct WanRules;

impl FamilyRules for WanRules {
    fn sampling_files<'a>(
        &self,
        cfg: &'a RunConfig,
    ) -> Vec<(&'static str, &'a Path, &'static str)> {
        let m = &cfg.model;
        vec![
            ("model.vae", &m.vae, "the VAE (to decode clips)"),
            (
                "model.text_encoder",
                &m.text_encoder,
                "the text encoder (to encode prompts)",
            ),
        ]
    }

    fn clip_file(&self) -> &'static str {
        "CLIP image encoder"
    }
}
