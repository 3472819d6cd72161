//! The model variants a run config may name (`model.variant`): the name users type, the number of DiT blocks
//! (validation checks `memory.blocks_to_swap` with it) and whether the model starts clips from an image (which
//! `training.mode` it trains in). Plain data: the architectures themselves live with the models, and a test in the
//! engine checks every name here resolves to a model with these blocks and this start image.

use crate::run::TrainingMode;

/// One named model variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// The command-line and config name (`t2v-14b`).
    pub name: &'static str,
    /// DiT blocks (what block streaming counts).
    pub blocks: usize,
    /// Whether its clips start from a given image.
    pub start_image: StartImage,
    /// Pixel multiple of clip sides: its VAE's spatial stride × the 2×2 patches (16; 32 with TI2V-5B's Wan2.2 VAE).
    pub pixel_step: usize,
}

/// Whether a model starts its clips from a given image, which decides the `training.mode` it can train in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartImage {
    /// Text-to-video models: from the caption alone.
    Never,
    /// Image-to-video models (I2V-14B, I2V-A14B): every clip continues an image.
    Always,
    /// TI2V-5B: from the caption alone (by default), or continuing an image.
    Optional,
}

/// Why a model cannot train in the asked `training.mode`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrainingModeError {
    #[error(
        "{model} is a text-to-video model and cannot train image-to-video: set training.mode = \"auto\" (or \
         \"text_to_video\"), or train TI2V-5B or an I2V model"
    )]
    NoStartImage { model: String },
    #[error(
        "{model} is an image-to-video model: every clip starts from an image, so it cannot train text-to-video; set \
         training.mode = \"auto\" (or \"image_to_video\"), or train a T2V model or TI2V-5B"
    )]
    NeedsStartImage { model: String },
}

impl StartImage {
    /// The mode a model of this kind (called `model` in messages) trains in when `asked`: `Auto` becomes the
    /// model's own, and a mode the model cannot do is an error.
    pub fn training_mode(
        self,
        asked: TrainingMode,
        model: &str,
    ) -> Result<TrainingMode, TrainingModeError> {
        use TrainingMode::{Auto, ImageToVideo, TextToVideo};
        let model = model.to_string();
        match (self, asked) {
            (StartImage::Never, ImageToVideo) => Err(TrainingModeError::NoStartImage { model }),
            (StartImage::Always, TextToVideo) => Err(TrainingModeError::NeedsStartImage { model }),
            (StartImage::Never | StartImage::Optional, Auto) => Ok(TextToVideo),
            (StartImage::Always, Auto) => Ok(ImageToVideo),
            (_, asked) => Ok(asked),
        }
    }
}

/// Every named variant, in the order messages list them.
pub const VARIANTS: &[Variant] = &[
    Variant {
        name: "t2v-1.3b",
        blocks: 30,
        start_image: StartImage::Never,
        pixel_step: 16,
    },
    Variant {
        name: "t2v-14b",
        blocks: 40,
        start_image: StartImage::Never,
        pixel_step: 16,
    },
    Variant {
        name: "i2v-14b",
        blocks: 40,
        start_image: StartImage::Always,
        pixel_step: 16,
    },
    Variant {
        name: "t2v-a14b",
        blocks: 40,
        start_image: StartImage::Never,
        pixel_step: 16,
    },
    Variant {
        name: "i2v-a14b",
        blocks: 40,
        start_image: StartImage::Always,
        pixel_step: 16,
    },
    Variant {
        name: "ti2v-5b",
        blocks: 30,
        start_image: StartImage::Optional,
        pixel_step: 32,
    },
];

/// The variant called `name` (any case).
pub fn variant(name: &str) -> Option<&'static Variant> {
    VARIANTS.iter().find(|v| v.name.eq_ignore_ascii_case(name))
}

/// The names of [`VARIANTS`], comma-separated (for "use one of …" messages).
pub fn variant_names() -> String {
    VARIANTS
        .iter()
        .map(|v| v.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_each_models_own_mode_and_a_mode_it_cannot_do_is_an_error() {
        use TrainingMode::{Auto, ImageToVideo, TextToVideo};
        let mode = |name: &str, asked| {
            variant(name)
                .map(|v| v.start_image.training_mode(asked, name))
                .ok_or("unknown")
        };
        assert_eq!(mode("t2v-14b", Auto), Ok(Ok(TextToVideo)));
        assert_eq!(mode("i2v-a14b", Auto), Ok(Ok(ImageToVideo)));
        assert_eq!(mode("ti2v-5b", Auto), Ok(Ok(TextToVideo)));
        assert_eq!(mode("ti2v-5b", ImageToVideo), Ok(Ok(ImageToVideo)));
        assert_eq!(mode("ti2v-5b", TextToVideo), Ok(Ok(TextToVideo)));
        let Ok(Err(e)) = mode("t2v-1.3b", ImageToVideo) else {
            panic!("a T2V model cannot train image-to-video");
        };
        assert!(
            e.to_string()
                .starts_with("t2v-1.3b is a text-to-video model"),
            "{e}"
        );
        assert!(matches!(
            mode("i2v-14b", TextToVideo),
            Ok(Err(TrainingModeError::NeedsStartImage { .. }))
        ));
    }
}
