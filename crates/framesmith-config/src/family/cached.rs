//! The rules of a family whose runs train one DiT from caches made elsewhere, read from `model.dit` alone: the
//! settings of other families such a run refuses, the files its samples need, and what it cannot do yet
//! (image-to-video, for some), each by key with its fix. A family gives only its names and what it lacks
//! ([`CacheOnlyRules`]).

use std::path::Path;

use super::FamilyRules;
use crate::run::{RunConfig, TrainingMode};
use crate::validate::Checker;

/// What a cache-only family's messages say; the checks are the same for each.
pub(crate) struct CacheOnlyRules {
    /// The DiT as `model.dit is …` names it (`LTX-2`).
    pub model: &'static str,
    /// Who is read from the file, with its verb (`LTX-2 and LTX-2.3 are`).
    pub read_from_file: &'static str,
    /// One of its runs, with its article (`an LTX-2 run`).
    pub a_run: &'static str,
    /// What `model.clip` holds for its runs (`CLIP model (LTX-2 takes none)`).
    pub clip_file: &'static str,
    /// What it conditions on instead of CLIP (`Gemma 3 through its text connector`).
    pub conditions_on: &'static str,
    /// The image encoder `model.clip` names for its image-to-video samples' start images, described with a file to
    /// set it to; `None`: its runs take no `model.clip`.
    pub sample_image_encoder: Option<&'static str>,
    /// The files its samples are made with (`model.vae`, `model.text_encoder`, each described).
    pub samples: CacheOnlySamples,
    /// Why image-to-video is refused, when it is.
    pub no_image_to_video: Option<&'static str>,
    /// Whether its runs read `training.first_frame_conditioning_p`.
    pub first_frame_conditioning: bool,
}

/// Whether a cache-only family's runs make samples.
pub(crate) enum CacheOnlySamples {
    /// Yes, with the VAE and the text encoder these describe.
    Made {
        vae: &'static str,
        text_encoder: &'static str,
    },
    /// Yes, with the text encoder this describes and the VAE of the checkpoint `model.dit` names (or of
    /// `model.vae`, when set).
    MadeWithCheckpointVae { text_encoder: &'static str },
}

impl FamilyRules for CacheOnlyRules {
    fn sampling_files<'a>(
        &self,
        cfg: &'a RunConfig,
    ) -> Vec<(&'static str, &'a Path, &'static str)> {
        match self.samples {
            CacheOnlySamples::Made { vae, text_encoder } => vec![
                ("model.vae", &cfg.model.vae, vae),
                ("model.text_encoder", &cfg.model.text_encoder, text_encoder),
            ],
            CacheOnlySamples::MadeWithCheckpointVae { text_encoder } => {
                vec![("model.text_encoder", &cfg.model.text_encoder, text_encoder)]
            }
        }
    }

    fn clip_file(&self) -> &'static str {
        self.clip_file
    }

    fn first_frame_conditioning(&self) -> bool {
        self.first_frame_conditioning
    }

    fn check(&self, c: &mut Checker, cfg: &RunConfig, _validation_scheduled: bool) {
        let m = &cfg.model;
        if !m.variant.eq_ignore_ascii_case("auto") {
            c.problem(
                "model.variant",
                format!(
                    "names the Wan variant `{}`, but model.dit is {}",
                    m.variant, self.model
                ),
                format!(
                    "set model.variant = \"auto\" ({} read from the file)",
                    self.read_from_file
                ),
            );
        }
        if !m.dit_low_noise.as_os_str().is_empty() {
            c.problem(
                "model.dit_low_noise",
                format!(
                    "is for Wan2.2 A14B's low-noise expert; {} trains one DiT",
                    self.a_run
                ),
                "remove model.dit_low_noise",
            );
        }
        self.check_clip(c, cfg);
        if let Some(why) = self.no_image_to_video {
            if cfg.training.mode == TrainingMode::ImageToVideo {
                c.problem(
                    "training.mode",
                    why,
                    "set training.mode = \"text_to_video\" (or \"auto\")",
                );
            }
        }
    }
}

impl CacheOnlyRules {
    /// `model.clip`: refused where the family takes no image encoder, and for a text-to-video run; required for the
    /// samples of an image-to-video run (a run whose mode is `auto` learns that from its caches, and its start
    /// checks it).
    fn check_clip(&self, c: &mut Checker, cfg: &RunConfig) {
        let (clip, mode) = (&cfg.model.clip, cfg.training.mode);
        match (self.sample_image_encoder, clip.as_os_str().is_empty()) {
            (None, false) => c.problem(
                "model.clip",
                format!(
                    "{} conditions on {}, not on CLIP",
                    self.model, self.conditions_on
                ),
                "remove model.clip",
            ),
            (Some(_), false) if mode == TrainingMode::TextToVideo => c.problem(
                "model.clip",
                format!(
                    "encodes the start images of image-to-video samples, but {} is text-to-video here",
                    self.a_run
                ),
                "remove model.clip, or set training.mode = \"image_to_video\" (or \"auto\")",
            ),
            (Some(encoder), true)
                if mode == TrainingMode::ImageToVideo && cfg.sampling.prompts.is_some() =>
            {
                c.problem(
                    "model.clip",
                    format!(
                        "is not set, but the samples of an image-to-video run start from images (--i) that {encoder} \
                         encodes"
                    ),
                    format!("set model.clip to {encoder}, or remove sampling.prompts"),
                );
            }
            _ => {}
        }
    }
}

/// A run of a family whose files all exist: the source file `source` of this crate (`src/family/ltx2.rs`) stands
/// in for each.
#[cfg(test)]
pub(crate) fn run_of_existing_files(source: &str) -> RunConfig {
    let here = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(source);
    let mut cfg = RunConfig::default();
    cfg.model.dit = here.clone();
    cfg.dataset.config = here;
    cfg
}

/// `cfg`, validated for `family`, is refused with each of `expected`: a problem of its key whose message and fix
/// hold the given parts.
#[cfg(test)]
pub(crate) fn assert_refused(
    cfg: &RunConfig,
    family: crate::plan::ModelFamily,
    expected: &[(&str, &str, &str)],
) {
    let host = crate::plan::HostInfo::cpu_only();
    let Err(errors) = crate::validate::validate_for(cfg, &host, family) else {
        panic!("{family} validated a run it must refuse");
    };
    for &(key, message, fix) in expected {
        let found = errors
            .problems
            .iter()
            .any(|p| p.key == key && p.message.contains(message) && p.fix.contains(fix));
        assert!(found, "{key}: {errors}");
    }
}
