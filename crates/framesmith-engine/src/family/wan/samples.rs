//! Wan's samples during training (and the demo model's): clips denoised as `framesmith generate` denoises them
//! (UniPC, with both Wan2.2 experts each on its side of the boundary), decoded by the Wan VAE or the demo codec
//! and written as `{stem}.mp4` plus the PNG frames of `{stem}/` for the in-app player. The prompts are encoded
//! before the DiT loads ([`crate::family::wan::sample_models`], [`super::demo_setup`]).

use std::path::Path;

use anyhow::Context;
use candle_core::Tensor;

use crate::demo;
use crate::family::wan::denoise::{Denoising, GenerateRequest, ImageConditioning};
use crate::family::wan::experts::Experts;
use crate::family::wan::pipeline::VaeDecoder;
use crate::generate::sampler::Solver;
use crate::train::samples::{write_frames, SampleFiles, SampleSet, SAMPLE_FPS};
use framesmith_data::video::encode::write_mp4;

/// How latents become frames.
pub enum Decoder {
    /// The demo codec (the built-in demo model).
    Demo,
    /// A Wan VAE (real models).
    Vae(Box<VaeDecoder>),
}

/// One prompt, with its text embedding computed once.
#[derive(Clone)]
pub struct SamplePrompt {
    pub prompt: String,
    pub context: Tensor,
    pub negative: Option<Tensor>,
    pub latent_shape: [usize; 4],
    pub steps: usize,
    pub shift: f64,
    pub guidance: f64,
    pub seed: u64,
    /// How the start image (`--i`) conditions an image-to-video sample: the demo model's first latent frame, or
    /// an I2V model's conditioning channels (and CLIP features).
    pub image: Option<ImageConditioning>,
}

/// The clips a Wan run (or the demo model's) samples: each prompt ready for the DiT, and how latents become frames.
pub struct ClipSamples {
    pub prompts: Vec<SamplePrompt>,
    pub decoder: Decoder,
}

impl SampleSet<Experts> for ClipSamples {
    fn prompt_count(&self) -> usize {
        self.prompts.len()
    }

    fn prompt(&self, i: usize) -> &str {
        &self.prompts[i].prompt
    }

    /// With both Wan2.2 experts, the high-noise expert denoises down to the boundary and the low-noise one from
    /// there, each brought onto the GPU in turn; each step starts from a trimmed memory pool, as `generate` does.
    fn denoise(
        &self,
        i: usize,
        models: &mut Experts,
        cancelled: &dyn Fn() -> bool,
    ) -> anyhow::Result<Tensor> {
        let p = &self.prompts[i];
        let request = GenerateRequest {
            context: &p.context,
            negative: p.negative.as_ref(),
            latent_shape: p.latent_shape,
            steps: p.steps,
            shift: p.shift,
            guidance: p.guidance,
            seed: p.seed,
            solver: Solver::Unipc,
        };
        let device = models.model.device().clone();
        let mut denoising = Denoising::new(&request, p.image.as_ref(), &device)?;
        while let Some(t) = denoising.next_timestep() {
            if cancelled() {
                anyhow::bail!("sampling cancelled");
            }
            let expert = models.wan_for(t)?;
            framesmith_nn::offload::release_cached_memory(expert.device())?;
            denoising.step(expert)?;
        }
        // A low-noise expert on its own GPU denoised last there: the decoder is on the run's device.
        Ok(framesmith_nn::ops::to_device(
            &denoising.into_latents(),
            &device,
        )?)
    }

    fn write(&self, latents: Tensor, dir: &Path, stem: &str) -> anyhow::Result<SampleFiles> {
        let frames = match &self.decoder {
            Decoder::Demo => demo::codec::decode(&latents)?,
            Decoder::Vae(vae) => vae.decode(&latents)?,
        };
        let frames_dir = dir.join(stem);
        write_frames(&frames_dir, &frames, SAMPLE_FPS)?;
        let video = dir.join(format!("{stem}.mp4"));
        write_mp4(&video, &frames, SAMPLE_FPS)
            .with_context(|| format!("cannot write {}", video.display()))?;
        Ok(SampleFiles {
            file: video,
            frames: frames_dir,
        })
    }
}
