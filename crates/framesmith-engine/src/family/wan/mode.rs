//! Which `training.mode` a run trains in on the model it loaded, and what the step does for it: an I2V model
//! takes the start image as conditioning channels (the cache's `latents_image`), while TI2V-5B (and the demo
//! model) keep each clip's first latent frame clean at timestep 0, out of the loss — no extra cache, since the
//! causal VAE's first latent frame of a clip is the latent of its first frame alone (`WanTI2V.i2v` encodes the
//! image by itself and puts it in that frame).

use framesmith_config::catalog::StartImage;
use framesmith_config::run::TrainingMode;
use framesmith_models::wan::{weights, ModelType, WanConfig};

/// Whether a model of `cfg` starts clips from an image (the catalog's word for it; a test keeps them in step).
pub fn start_image(cfg: &WanConfig) -> StartImage {
    match cfg.model_type {
        ModelType::T2v => StartImage::Never,
        ModelType::I2v => StartImage::Always,
        ModelType::Ti2v => StartImage::Optional,
    }
}

/// How the step conditions on the start image in a run's resolved mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrame {
    /// Text-to-video: every latent frame is noised and in the loss.
    None,
    /// An I2V model: the start image comes as conditioning channels `y` beside noised latents.
    Channels,
    /// TI2V-5B and the demo model: the clip's first latent frame is the start image, kept clean, denoised at
    /// timestep 0 and left out of the loss.
    FirstLatentFrame,
}

impl StartFrame {
    /// Whether the first latent frame is the given start frame (per-token timesteps, one frame out of the loss).
    pub fn keeps_first_latent_frame(self) -> bool {
        self == Self::FirstLatentFrame
    }

    /// The run log's line for it.
    pub fn log_line(self) -> &'static str {
        match self {
            Self::None => "training mode: text-to-video",
            Self::Channels => "training mode: image-to-video (the cached first-frame conditioning)",
            Self::FirstLatentFrame => {
                "training mode: image-to-video (each clip's first latent frame given, at timestep 0, out of the loss)"
            }
        }
    }
}

/// The start frame of a run asking for `asked` on the model `cfg` (the demo model when `demo`: image-to-video
/// unless asked otherwise), or why the model cannot train that way.
pub fn resolve(cfg: &WanConfig, asked: TrainingMode, demo: bool) -> anyhow::Result<StartFrame> {
    let (kind, asked) = match (demo, asked) {
        (true, TrainingMode::Auto) => (StartImage::Optional, TrainingMode::ImageToVideo),
        (true, asked) => (StartImage::Optional, asked),
        (false, asked) => (start_image(cfg), asked),
    };
    let name = weights::variant_name(cfg, None);
    let mode = kind
        .training_mode(asked, &name)
        .map_err(|e| anyhow::anyhow!("training.mode: {e}"))?;
    Ok(match (mode, cfg.model_type) {
        (TrainingMode::ImageToVideo, ModelType::I2v) => StartFrame::Channels,
        (TrainingMode::ImageToVideo, _) => StartFrame::FirstLatentFrame,
        _ => StartFrame::None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ti2v_trains_either_way_and_other_models_their_own() -> anyhow::Result<()> {
        use TrainingMode::{Auto, ImageToVideo, TextToVideo};
        let ti2v = WanConfig::wan22_ti2v_5b();
        assert_eq!(resolve(&ti2v, Auto, false)?, StartFrame::None);
        assert_eq!(resolve(&ti2v, TextToVideo, false)?, StartFrame::None);
        assert_eq!(
            resolve(&ti2v, ImageToVideo, false)?,
            StartFrame::FirstLatentFrame
        );
        let i2v = WanConfig::wan22_i2v_a14b();
        assert_eq!(resolve(&i2v, Auto, false)?, StartFrame::Channels);
        assert!(resolve(&i2v, TextToVideo, false).is_err());
        let t2v = WanConfig::wan21_t2v_1_3b();
        assert_eq!(resolve(&t2v, Auto, false)?, StartFrame::None);
        let err = resolve(&t2v, ImageToVideo, false)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(
            err.starts_with("training.mode: Wan2.1 T2V-1.3B is a text-to-video model"),
            "{err}"
        );
        let demo = crate::family::wan::demo_setup::demo_model_config();
        assert_eq!(resolve(&demo, Auto, true)?, StartFrame::FirstLatentFrame);
        assert_eq!(resolve(&demo, TextToVideo, true)?, StartFrame::None);
        Ok(())
    }
}
