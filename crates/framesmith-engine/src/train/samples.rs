//! Samples during training, the same for every model family: when they are due (every N steps / epochs, and
//! optionally before the first step), how they are named (`samples/{step:06}-{prompt:02}`), the `SampleReady`
//! events (an edit model's name each prompt's control images) and the device memory given back around them. What
//! a family samples is its [`SampleSet`] (clips as an H.264 MP4 plus PNG frames for the in-app player, or images
//! as one PNG each), its prompts encoded once at the start, made through [`crate::family::FamilyRun::sample`].
//! Generation draws from its own seeded RNG, so sampling never changes the training run. Also how clips are
//! written as PNG frames, which `framesmith generate` shares.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::Tensor;

use crate::generate::prompts::read_prompt_file;
use crate::train::outputs::write_atomic;
use crate::train::step::StepError;
use crate::train::trainer::Trainer;
use framesmith_config::protocol::Event;
use framesmith_data::video::encode::RgbFrame;
use framesmith_nn::offload::release_cached_memory;

/// Frames per second of sample clips (the video models' native rate).
pub const SAMPLE_FPS: f64 = 16.0;

/// A model family's samples: the prompts encoded when the run started, how one is denoised with the run's
/// models `M` and how its latents become files.
pub trait SampleSet<M: ?Sized> {
    /// How many prompts there are.
    fn prompt_count(&self) -> usize;
    /// The text of prompt `i`.
    fn prompt(&self, i: usize) -> &str;
    /// The latents of prompt `i`, denoised by `models` with the LoRA being trained; `cancelled` is polled between
    /// denoising steps, and a true answer ends the denoising with an error.
    fn denoise(
        &self,
        i: usize,
        models: &mut M,
        cancelled: &dyn Fn() -> bool,
    ) -> anyhow::Result<Tensor>;
    /// Decodes `latents` and writes them into `dir` under the name `stem` (plus an extension).
    fn write(&self, latents: Tensor, dir: &Path, stem: &str) -> anyhow::Result<SampleFiles>;
}

/// What a sample was written as: the file a `SampleReady` event names and the frames the player shows (a clip's
/// PNG folder; an image is its own frame).
pub struct SampleFiles {
    pub file: PathBuf,
    pub frames: PathBuf,
}

/// Sample `i` of `set`, denoised by `models` and written into `dir` as `stem`: what every family's
/// [`crate::family::FamilyRun::sample`] does with its set (`cancelled` polled between denoising steps). A run
/// without samples (`None`) is refused.
pub fn make_sample<M: ?Sized, S: SampleSet<M>>(
    set: Option<&S>,
    models: &mut M,
    (i, dir, stem): (usize, &Path, &str),
    cancelled: &dyn Fn() -> bool,
) -> anyhow::Result<SampleFiles> {
    let Some(set) = set else {
        anyhow::bail!("this run makes no samples");
    };
    let latents = set.denoise(i, models, cancelled)?;
    set.write(latents, dir, stem)
}

/// When to sample (what is the family's).
pub struct Sampling {
    pub every_n_steps: Option<usize>,
    pub every_n_epochs: Option<usize>,
    pub at_first: bool,
    /// The run's `samples/` folder.
    pub dir: PathBuf,
    /// The control images of each sample prompt (`--ci`; empty for a prompt without), which the `SampleReady`
    /// events name so that the app shows them beside the sample.
    pub controls: Vec<Vec<PathBuf>>,
}

/// The name of step `step`'s sample of prompt `index`, without extension: `{step:06}-{index:02}`.
pub fn sample_stem(step: usize, index: usize) -> String {
    format!("{step:06}-{index:02}")
}

impl Sampling {
    /// The schedule of `plan`'s `[sampling]` (none: never due), into the run's `samples/` folder, with its prompt
    /// file's control images.
    pub fn new(plan: &framesmith_config::RunPlan) -> anyhow::Result<Self> {
        let s = plan.sampling.as_ref();
        let controls = match s {
            Some(s) => read_prompt_file(&s.prompts)?
                .into_iter()
                .map(|spec| spec.controls)
                .collect(),
            None => Vec::new(),
        };
        Ok(Self {
            every_n_steps: s.and_then(|s| s.every_n_steps),
            every_n_epochs: s.and_then(|s| s.every_n_epochs),
            at_first: s.is_some_and(|s| s.at_first),
            dir: plan.output.output_dir.join("samples"),
            controls,
        })
    }

    /// Whether the schedule falls on `step` (`epoch_done`: the epoch that step completed, if any).
    pub fn due(&self, step: usize, epoch_done: Option<usize>) -> bool {
        let by_steps = self.every_n_steps.is_some_and(|n| n > 0 && step % n == 0);
        let by_epochs = matches!((self.every_n_epochs, epoch_done), (Some(n), Some(e)) if n > 0 && e > 0 && e % n == 0);
        by_steps || by_epochs
    }
}

impl Trainer {
    /// Generates every sample prompt with the current LoRA, written as `{step:06}-{prompt:02}` in the run's
    /// `samples/` folder; returns the `SampleReady` events. Nothing of a sample outlives it: the device's cached
    /// memory is given back before each one and before training goes on. `cancelled` is polled between denoising
    /// steps: a stop ends the sampling with [`StepError::Interrupted`] (the samples finished before it are kept).
    pub fn sample(&mut self, cancelled: &dyn Fn() -> bool) -> anyhow::Result<Vec<Event>> {
        let Some(sampling) = &self.sampling else {
            return Ok(Vec::new());
        };
        fs::create_dir_all(&sampling.dir)
            .with_context(|| format!("cannot create {}", sampling.dir.display()))?;
        let device = self.family.device().clone();
        let count = self.family.sample_count();
        let mut events = Vec::with_capacity(count);
        for i in 0..count {
            let prompt = self.family.sample_prompt(i).to_owned();
            let context = || format!("generating the sample for \"{prompt}\"");
            release_cached_memory(&device)?;
            if cancelled() {
                return Err(StepError::Interrupted.into());
            }
            let stem = sample_stem(self.step, i);
            let files = match self.family.sample(i, &sampling.dir, &stem, cancelled) {
                Ok(files) => files,
                Err(_) if cancelled() => return Err(StepError::Interrupted.into()),
                Err(err) => return Err(err.context(context())),
            };
            events.push(Event::SampleReady {
                step: self.step,
                file: files.file,
                frames: files.frames,
                prompt,
                controls: sampling.controls.get(i).cloned().unwrap_or_default(),
            });
        }
        release_cached_memory(&device)?;
        Ok(events)
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use framesmith_config::{presets, validate, HostInfo, RunConfig};

    #[test]
    fn each_prompts_control_images_are_what_its_sample_events_name() {
        let dir = tempfile::tempdir().unwrap();
        let prompts = dir.path().join("prompts.txt");
        fs::write(
            &prompts,
            "# an edit, then a plain prompt\nmake it red --ci src.png --ci /in/second.png\nsnow --s 4\n",
        )
        .unwrap();
        let mut config = presets::builtin("demo-cpu")
            .unwrap()
            .apply(&RunConfig::default())
            .unwrap()
            .config;
        config.sampling.prompts = Some(prompts);
        config.sampling.sample_every_n_steps = Some(2);
        config.output.output_dir = dir.path().join("out");
        let plan = validate(&config, &HostInfo::new(1)).unwrap();
        let sampling = Sampling::new(&plan).unwrap();
        assert_eq!(
            sampling.controls,
            [
                vec![dir.path().join("src.png"), PathBuf::from("/in/second.png")],
                Vec::new()
            ]
        );
        assert!(sampling.due(2, None) && !sampling.due(3, None));
    }
}
