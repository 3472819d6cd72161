//! An image family's samples during training: each prompt's encoding, settings and latent size, and the decoder,
//! made into one image per prompt by the family's pipeline ([`ImagePipeline`]: the denoising the generator does,
//! then the decoding) with the LoRA being trained, written as `{stem}.png` ([`crate::train::samples`] schedules and
//! names them).

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Tensor};
use image::RgbImage;

use crate::train::samples::{SampleFiles, SampleSet};

/// An image family's sampling pipeline: the model it denoises with, a prompt's encoding, the settings of one
/// image, the decoder, and its two halves.
pub trait ImagePipeline {
    /// The DiT (streamed blocks come through their streamers as in a training step).
    type Model;
    /// A prompt's encoding.
    type Prompt;
    /// What one image samples (size, steps, guidance, seed).
    type Settings;
    /// The autoencoder that decodes the latents.
    type Decoder;

    /// The generator's denoising of a prompt with its settings (`request`) into latents of `latent` [h, w],
    /// polling `cancelled` between steps.
    fn denoise(
        model: &Self::Model,
        request: (&Self::Prompt, &Self::Settings),
        latent: [usize; 2],
        dtype: DType,
        cancelled: &dyn Fn() -> bool,
    ) -> anyhow::Result<Tensor>;

    /// The image of `latents`.
    fn decode(decoder: &Self::Decoder, latents: &Tensor, dtype: DType) -> anyhow::Result<RgbImage>;
}

/// One image prompt: its text, its encoding and what to sample.
pub struct ImagePrompt<P: ImagePipeline> {
    pub prompt: String,
    pub encoded: P::Prompt,
    pub settings: P::Settings,
    /// The latent [h, w] of the image.
    pub latent: [usize; 2],
}

/// The prompts of an image family's run samples and the decoder of their latents.
pub struct ImageSamples<P: ImagePipeline> {
    pub prompts: Vec<ImagePrompt<P>>,
    pub decoder: P::Decoder,
    /// The dtype the DiT's linears and the decoder compute in.
    pub dtype: DType,
}

impl<P: ImagePipeline> SampleSet<P::Model> for ImageSamples<P> {
    fn prompt_count(&self) -> usize {
        self.prompts.len()
    }

    fn prompt(&self, i: usize) -> &str {
        &self.prompts[i].prompt
    }

    fn denoise(
        &self,
        i: usize,
        model: &mut P::Model,
        cancelled: &dyn Fn() -> bool,
    ) -> anyhow::Result<Tensor> {
        let p = &self.prompts[i];
        P::denoise(
            model,
            (&p.encoded, &p.settings),
            p.latent,
            self.dtype,
            cancelled,
        )
    }

    fn write(&self, latents: Tensor, dir: &Path, stem: &str) -> anyhow::Result<SampleFiles> {
        let image = P::decode(&self.decoder, &latents, self.dtype)?;
        drop(latents);
        let path = dir.join(format!("{stem}.png"));
        image
            .save(&path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(SampleFiles {
            file: path.clone(),
            frames: path,
        })
    }
}
