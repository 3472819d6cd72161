//! What the families' CPU tests of a run share, each check parametrised by what differs: the tiny LoRA, one fixed
//! batch that must learn, a run config over cached data, a run trained straight and with a resume that must match
//! bit for bit, the clip the plan reads from the caches, and what refusals say.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::family::{family_of, family_of_dit};
use crate::generate::request::{DitSource, GenerationRequest};
use crate::generate::run::Session;
use crate::prep::pass::{CachePass, CacheRequest, OpenDevice};
use crate::train::optimizer::AdamW;
use crate::train::step::{try_checkpointed_step, LossTarget, StepOptions};
use crate::train::tests::{all_lora_values, try_start};
use crate::train::timesteps::TimestepDraw;
use crate::train::trainer::Trainer;
use framesmith_config::run::{Checkpointing, TimestepSampling};
use framesmith_config::{presets, RunConfig};
use framesmith_data::Unreadable;
use framesmith_models::trainable::TrainableModel;
use framesmith_nn::lora::{LoraSet, LoraSpec};

/// The LoRA the fixed-batch tests attach to a tiny model: rank 4, alpha 4, f32, seed 3, on the family's targets.
pub(crate) fn tiny_lora_spec() -> LoraSpec {
    LoraSpec {
        rank: 4,
        alpha: 4.0,
        dtype: DType::F32,
        include_patterns: vec![],
        exclude_patterns: vec![],
        seed: 3,
        kind: Default::default(),
    }
}

/// `len` draws of the noise level `t` (the DiT's timestep `model_timestep`), one per item of a fixed batch.
pub(crate) fn fixed_draws(len: usize, t: f64, model_timestep: f64) -> Vec<TimestepDraw> {
    vec![TimestepDraw { t, model_timestep }; len]
}

/// Twelve steps of `model` with `loras` (`optimizer` at lr 1e-2) on the batch `batch` makes each time, its inputs
/// and its items' targets with the same noise every step (the loss of one fixed batch): every loss is finite and
/// the last is under 0.9 of the first.
pub(crate) fn assert_a_fixed_batch_learns<M: TrainableModel>(
    model: &M,
    loras: &LoraSet,
    optimizer: &mut AdamW,
    mut batch: impl FnMut() -> anyhow::Result<(M::Inputs, Vec<Tensor>)>,
) -> anyhow::Result<()> {
    let mut losses = Vec::new();
    for _ in 0..12 {
        let (inputs, targets) = batch()?;
        let target = LossTarget {
            targets: &targets,
            weights: None,
            skip_frames: 0,
        };
        let out = try_checkpointed_step(
            model,
            &inputs,
            &target,
            &loras.vars(),
            &StepOptions::default(),
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        optimizer.step(&out.grads, 1e-2)?;
        losses.push(out.loss);
    }
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(losses[11] < 0.9 * losses[0], "the loss falls: {losses:?}");
    Ok(())
}

/// A `steps`-long run of the tiny DiT `dit` on the cached dataset `dataset` with `sampling`'s timesteps, written
/// under `dir/run`: the CPU demo preset on a real model, a rank-4 LoRA of alpha 4, no warm-up, checkpointed
/// blocks, no saves but the last.
pub(crate) fn cached_run_config(
    dir: &Path,
    (dit, dataset): (PathBuf, PathBuf),
    steps: usize,
    sampling: TimestepSampling,
) -> anyhow::Result<RunConfig> {
    let mut config = presets::builtin("demo-cpu")?
        .apply(&RunConfig::default())?
        .config;
    config.model.demo = false;
    config.model.dit = dit;
    config.dataset.synthetic = false;
    config.dataset.config = dataset;
    config.lora.rank = 4;
    config.lora.alpha = 4.0;
    config.training.max_train_steps = steps;
    config.training.timestep_sampling = sampling;
    config.optimizer.lr_warmup_steps = 0;
    config.memory.checkpointing = Checkpointing::Blocks;
    config.output.output_dir = dir.join("run");
    config.output.save_every_n_steps = Some(0);
    Ok(config)
}

/// The run `config` and its `model.dit` for generation are both the family `name`'s.
pub(crate) fn assert_family_named(config: &RunConfig, name: &str) {
    assert_eq!(family_of(config).name(), name);
    let dit = DitSource::File(config.model.dit.clone());
    assert_eq!(family_of_dit(&dit).name(), name);
}

/// `straight` trained for `steps` (each loss finite and positive) and saved, and `halves` trained to step 2, saved,
/// resumed from its output folder and trained on: the resumed run's losses and LoRA are the straight run's bit for
/// bit. Returns the straight run and the LoRA file it saved.
pub(crate) fn assert_trains_and_resumes(
    straight: &RunConfig,
    halves: &RunConfig,
    steps: usize,
) -> anyhow::Result<(Trainer, PathBuf)> {
    let mut run = try_start(straight, None)?;
    let mut losses = Vec::new();
    while run.step() < steps {
        let report = run.train_step(&|| false)?;
        let loss = report.loss.ok_or_else(|| anyhow::anyhow!("no loss"))?;
        assert!(loss.is_finite() && loss > 0.0, "{loss}");
        losses.push(loss);
    }
    let saved = run.save(true)?;
    let lora = saved
        .loras
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no LoRA saved"))?;

    let mut first = try_start(halves, None)?;
    let mut resumed = Vec::new();
    while first.step() < 2 {
        resumed.push(first.train_step(&|| false)?.loss.unwrap_or(f64::NAN));
    }
    first.save(false)?;
    drop(first);
    let mut second = try_start(halves, Some(&halves.output.output_dir))?;
    assert_eq!(second.step(), 2);
    while second.step() < steps {
        resumed.push(second.train_step(&|| false)?.loss.unwrap_or(f64::NAN));
    }
    assert_eq!(losses, resumed);
    assert_eq!(all_lora_values(&run)?, all_lora_values(&second)?);
    Ok((run, lora))
}

/// The largest clip the plan reads from the caches of `config`'s dataset: `(width, height, frames, batch)`.
pub(crate) fn cached_clip(
    config: &RunConfig,
) -> anyhow::Result<Option<(usize, usize, usize, usize)>> {
    let valid = framesmith_data::load_valid(&config.dataset.config)?;
    let clip = crate::family::largest_cached_clip(&valid, false);
    Ok(clip.map(|c| (c.width, c.height, c.frames, c.batch)))
}

/// The error of `result`, in full.
pub(crate) fn error_of<T>(result: anyhow::Result<T>) -> String {
    result.err().map(|e| format!("{e:#}")).unwrap_or_default()
}

/// The device of a pass that is refused before it opens one.
fn no_device() -> anyhow::Result<(Device, DType)> {
    anyhow::bail!("no device is opened for a refused pass")
}

/// [`no_device`], as a cache request takes it.
const NO_DEVICE: OpenDevice<'static> = &no_device;

/// A cache request for `pass` over `dir/data.toml` whose device must never be opened (the pass is refused first).
pub(crate) fn refused_cache_request(dir: &Path, pass: CachePass) -> CacheRequest<'static> {
    CacheRequest {
        dataset: dir.join("data.toml"),
        pass,
        keep_stale: false,
        unreadable: Unreadable::Refuse,
        open: NO_DEVICE,
    }
}

/// What `framesmith generate` says for the DiT `dit` (a prompt, written under `dir`).
pub(crate) fn generate_error(dit: &Path, dir: &Path) -> String {
    let request =
        GenerationRequest::new(DitSource::File(dit.to_path_buf()), "a cat", dir.join("out"));
    let mut events = |_| {};
    let mut session = Session::new(&mut events, &|| false);
    error_of(family_of_dit(&request.dit).generate(&request, &mut session))
}

/// What starting `config` says when it asks for a sample every step from the prompts file `prompts`.
pub(crate) fn sampling_start_error(config: &RunConfig, prompts: &Path) -> String {
    let mut config = config.clone();
    config.sampling.prompts = Some(prompts.to_path_buf());
    config.sampling.sample_every_n_steps = Some(1);
    error_of(try_start(&config, None))
}

/// The TOML of a musubi-tuner video dataset in `dir` whose clips (`frames` frames at `width`×`height`, batch
/// size `batch_size`) are cached in `cache/` and whose `videos/` is empty; returns its path.
pub(crate) fn cached_video_dataset_toml(
    dir: &Path,
    (width, height, frames): (usize, usize, usize),
    batch_size: usize,
) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir.join("videos"))?;
    let toml = dir.join("data.toml");
    std::fs::write(
        &toml,
        format!(
            "[general]\nresolution = [{width}, {height}]\ncaption_extension = \".txt\"\nenable_bucket = false\n\n\
             [[datasets]]\nvideo_directory = \"videos\"\ncache_directory = \"cache\"\ntarget_frames = [{frames}]\n\
             batch_size = {batch_size}\n"
        ),
    )?;
    Ok(toml)
}
