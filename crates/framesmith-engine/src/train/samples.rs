//! Samples during training: prompts encoded once at the start, generated every N steps / epochs (and optionally
//! before the first step) with the LoRA being trained. Wan clips are written as an H.264 MP4 plus PNG frames for
//! the in-app player; FLUX.1 images as one PNG each ([`crate::train::flux_samples`]), under the same names.
//! Generation draws from its own seeded RNG, so sampling never changes the training run.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::Tensor;

use crate::demo;
use crate::generate::denoise::{Denoising, GenerateRequest, ImageConditioning, Solver};
use crate::train::outputs::write_atomic;
use crate::train::trainer::Trainer;
use framesmith_config::protocol::Event;
use framesmith_data::video::encode::{write_mp4, RgbFrame};

/// Frames per second of sample clips (Wan's native rate).
pub const SAMPLE_FPS: f64 = 16.0;

/// How latents become frames.
pub enum Decoder {
    /// The demo codec (the built-in demo model).
    Demo,
    /// A Wan VAE (real models).
    Vae(Box<crate::generate::pipeline::VaeDecoder>),
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

/// What a run samples.
pub enum SampleKind {
    /// Clips (Wan, the demo model): each prompt ready for the DiT, and how latents become frames.
    Clips {
        prompts: Vec<SamplePrompt>,
        decoder: Decoder,
    },
    /// FLUX.1 images.
    Images(Box<crate::train::flux_samples::ImageSamples>),
}

/// When and what to sample.
pub struct Sampling {
    pub kind: SampleKind,
    pub every_n_steps: Option<usize>,
    pub every_n_epochs: Option<usize>,
    pub at_first: bool,
    /// The run's `samples/` folder.
    pub dir: PathBuf,
}

/// The name of step `step`'s sample of prompt `index`, without extension: `{step:06}-{index:02}`.
pub fn sample_stem(step: usize, index: usize) -> String {
    format!("{step:06}-{index:02}")
}

impl Sampling {
    /// `kind` on the schedule of `plan`'s `[sampling]` (none: never due), into the run's `samples/` folder.
    pub fn new(plan: &framesmith_config::RunPlan, kind: SampleKind) -> Self {
        let s = plan.sampling.as_ref();
        Self {
            kind,
            every_n_steps: s.and_then(|s| s.every_n_steps),
            every_n_epochs: s.and_then(|s| s.every_n_epochs),
            at_first: s.is_some_and(|s| s.at_first),
            dir: plan.output.output_dir.join("samples"),
        }
    }

    /// Whether the schedule falls on `step` (`epoch_done`: the epoch that step completed, if any).
    pub fn due(&self, step: usize, epoch_done: Option<usize>) -> bool {
        let by_steps = self.every_n_steps.is_some_and(|n| n > 0 && step % n == 0);
        let by_epochs = matches!((self.every_n_epochs, epoch_done), (Some(n), Some(e)) if n > 0 && e > 0 && e % n == 0);
        by_steps || by_epochs
    }
}

/// One RGB frame encoded as PNG.
pub fn encode_png(frame: &RgbFrame) -> anyhow::Result<Vec<u8>> {
    use image::ImageEncoder;
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(
            &frame.data,
            frame.width as u32,
            frame.height as u32,
            image::ExtendedColorType::Rgb8,
        )
        .context("cannot encode a frame as PNG")?;
    Ok(png)
}

/// Writes frames as `frame_NNNN.png` plus `frames.json` (fps, count, size) into `dir`.
pub fn write_frames(dir: &Path, frames: &[RgbFrame], fps: f64) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (i, f) in frames.iter().enumerate() {
        let path = dir.join(format!("frame_{i:04}.png"));
        fs::write(&path, encode_png(f)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let (w, h) = frames.first().map_or((0, 0), |f| (f.width, f.height));
    let info = serde_json::json!({ "fps": fps, "frames": frames.len(), "width": w, "height": h });
    write_atomic(&dir.join("frames.json"), info.to_string().as_bytes())
}

impl Trainer {
    /// The latents of sample prompt `i` with the current LoRA(s). With both Wan2.2 experts, the high-noise
    /// expert denoises down to the boundary and the low-noise one from there, each brought onto the GPU in turn.
    fn sample_latents(&mut self, i: usize) -> anyhow::Result<Tensor> {
        let Some(p) = self
            .sampling
            .as_ref()
            .and_then(|s| match &s.kind {
                SampleKind::Clips { prompts, .. } => prompts.get(i),
                SampleKind::Images(_) => None,
            })
            .cloned()
        else {
            anyhow::bail!("no sample prompt {i}");
        };
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
        let boundary = self.low_noise.as_ref().map(|l| l.boundary);
        let context = || format!("generating the sample for \"{}\"", p.prompt);
        let mut denoising = Denoising::new(&request, p.image.as_ref(), self.model.device())
            .with_context(context)?;
        while let Some(t) = denoising.next_timestep() {
            let high = boundary.is_none_or(|b| t >= b);
            self.use_expert(high).with_context(context)?;
            // As `generate` does: each step starts from a trimmed memory pool.
            framesmith_nn::offload::release_cached_memory(self.expert(high)?.device())?;
            denoising.step(self.expert(high)?).with_context(context)?;
        }
        // A low-noise expert on its own GPU denoised last there: the decoder is on the run's device.
        Ok(framesmith_nn::ops::to_device(
            &denoising.into_latents(),
            self.model.device(),
        )?)
    }

    /// Generates every sample prompt with the current LoRA; returns the `SampleReady` events.
    pub fn sample(&mut self) -> anyhow::Result<Vec<Event>> {
        match self.sampling.as_ref().map(|s| &s.kind) {
            None => Ok(Vec::new()),
            Some(SampleKind::Images(_)) => self.sample_images(),
            Some(SampleKind::Clips { .. }) => self.sample_clips(),
        }
    }

    /// Every clip prompt, written as an MP4 and its PNG frames.
    fn sample_clips(&mut self) -> anyhow::Result<Vec<Event>> {
        let mut events = Vec::new();
        let count = match self.sampling.as_ref().map(|s| &s.kind) {
            Some(SampleKind::Clips { prompts, .. }) => prompts.len(),
            _ => 0,
        };
        for i in 0..count {
            let latents = self.sample_latents(i)?;
            let Some(sampling) = &self.sampling else {
                return Ok(events);
            };
            let SampleKind::Clips { prompts, decoder } = &sampling.kind else {
                return Ok(events);
            };
            let p = &prompts[i];
            let frames = match decoder {
                Decoder::Demo => demo::codec::decode(&latents)?,
                Decoder::Vae(vae) => vae.decode(&latents)?,
            };
            let stem = sample_stem(self.step, i);
            let frames_dir = sampling.dir.join(&stem);
            write_frames(&frames_dir, &frames, SAMPLE_FPS)?;
            let video = sampling.dir.join(format!("{stem}.mp4"));
            write_mp4(&video, &frames, SAMPLE_FPS)
                .with_context(|| format!("cannot write {}", video.display()))?;
            events.push(Event::SampleReady {
                step: self.step,
                file: video,
                frames: frames_dir,
                prompt: p.prompt.clone(),
            });
        }
        Ok(events)
    }
}
