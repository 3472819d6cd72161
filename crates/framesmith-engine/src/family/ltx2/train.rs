//! LTX-2 training pieces the engine composes: which run's `model.dit` is an LTX-2 transformer, and the
//! flow-matching batch the model-agnostic checkpointed step takes, as the official trainer's text-to-video
//! strategy builds it (ltx-trainer `training_strategies/text_to_video.py`, Lightricks/LTX-2 @400fd31): the cached
//! latents patchified frame-major to `[F·H·W, 128]`, noisy latents `(1 − σ)·x + σ·noise` with one σ per sample (the
//! run's timestep draw `t`; the model embeds `σ · 1000`), the pixel-space patch positions at 24 fps (the official
//! `DEFAULT_FPS` when a cache carries none), the connector's output padded to the batch's longest with its
//! lengths, and the target `noise − x`. First-frame conditioning (`first_frame_conditioning_p`, 0.1 by default as
//! the official trainer's): each clip of more than one latent frame is drawn, with that probability, to have its
//! first latent frame clean (its `H·W` leading tokens are the cached latents, at timestep 0) and left out of the
//! loss (`compute_loss`'s masked mean per sample, then the batch mean: [`loss_views`]); the draws come after every
//! noise draw, so a conditioned clip's other tokens are noised as they would be without.
//! With audio latents (its `with_audio`), the audio is noised at the same σ with its own noise, patchified to
//! `[T, C·mel]`, placed at the audio patchifier's seconds, reads the audio connector's output, and the loss is the
//! video mean plus the audio mean (`compute_loss`: `video_loss + audio_loss`), as [`joint_loss_view`] lays out the
//! outputs and targets.

use std::path::{Path, PathBuf};

use crate::train::noise::StepRng;
use candle_core::{DType, Tensor};
use rand::Rng;

use crate::family::image::run::{BatchOptions, ImageModel};
use crate::train::data::TrainItem;
use crate::train::timesteps::TimestepDraw;
use framesmith_config::plan::ModelSource;
use framesmith_config::{RunConfig, RunPlan};
use framesmith_models::ltx2::lora_keys::OFFICIAL_PREFIX;
use framesmith_models::ltx2::rope::{audio_positions, video_positions};
use framesmith_models::ltx2::weights::{identify, is_unrecognised};
use framesmith_models::ltx2::{
    loss_views, Ltx2AudioInputs, Ltx2Config, Ltx2Inputs, Ltx2Transformer,
};
use framesmith_nn::lora_file::SaveLayout;

/// The frame rate the positions are computed at (the official trainer's `DEFAULT_FPS`).
pub const FRAME_RATE: f32 = 24.0;

/// The official trainer's `first_frame_conditioning_p` default, what a run without
/// `training.first_frame_conditioning_p` uses.
pub const FIRST_FRAME_CONDITIONING_P: f64 = 0.1;

/// The first-frame conditioning probability of the run `config`.
pub fn first_frame_conditioning_p(config: &RunConfig) -> f64 {
    config
        .training
        .first_frame_conditioning_p
        .unwrap_or(FIRST_FRAME_CONDITIONING_P)
}

/// The leading clean tokens of each of `b` clips of `(f, h, w)` latent tokens: `h·w` (the first frame) with
/// probability `p` each, drawn from `rng` (one draw a clip, as the official trainer's per-sample Bernoulli); empty,
/// drawing nothing, when `p` is 0 or the clips have one latent frame (nothing would be left to train on).
fn first_frame_tokens(
    b: usize,
    (f, h, w): (usize, usize, usize),
    p: f64,
    rng: &mut StepRng,
) -> Vec<usize> {
    if p <= 0.0 || f <= 1 {
        return Vec::new();
    }
    (0..b)
        .map(|_| if rng.random::<f64>() < p { h * w } else { 0 })
        .collect()
}

/// `noisy` tokens [L, C] with the leading `n` replaced by the clean `x`'s.
fn with_clean_lead(noisy: &Tensor, x: &Tensor, n: usize) -> candle_core::Result<Tensor> {
    let l = noisy.dim(0)?;
    Tensor::cat(&[x.narrow(0, 0, n)?, noisy.narrow(0, n, l - n)?], 0)
}

/// Whether `path` is an LTX-2 transformer, so the run goes the LTX-2 way and its messages say what is wrong.
pub fn is_ltx2_file(path: &Path) -> bool {
    match identify(path) {
        Ok(_) => true,
        Err(err) => !is_unrecognised(&err),
    }
}

/// Whether the run `config` describes trains LTX-2: its `model.dit` is an LTX-2 transformer.
pub fn is_ltx2_run(config: &RunConfig) -> bool {
    let dit = &config.model.dit;
    !config.model.demo && !dit.as_os_str().is_empty() && is_ltx2_file(dit)
}

/// The run's `model.dit` when it is an LTX-2 transformer.
pub fn ltx2_dit_of(plan: &RunPlan) -> Option<PathBuf> {
    match &plan.model.source {
        ModelSource::File(path) if is_ltx2_file(path) => Some(path.clone()),
        _ => None,
    }
}

/// The sizes of the LTX-2 transformer at `path`, or an error naming the file and what is wrong with it.
pub fn dit_config(path: &Path) -> anyhow::Result<Ltx2Config> {
    let file = identify(path).map_err(|e| anyhow::anyhow!("model.dit: {e}"))?;
    file.config
        .validate()
        .map_err(|e| anyhow::anyhow!("model.dit: {e}: {}", path.display()))?;
    Ok(file.config)
}

/// `latents` [C, F, H, W] as tokens [F·H·W, C] (ltx-core's `VideoLatentPatchifier` order).
fn patchify(latents: &Tensor) -> candle_core::Result<Tensor> {
    let (c, f, h, w) = latents.dims4()?;
    latents.permute((1, 2, 3, 0))?.reshape((f * h * w, c))
}

/// Text states `rows` [L_i, D] padded with zeros to the longest as [b, L, D] in `dtype`, and each length
/// (`None` when every row is as long as the longest).
fn padded_context(rows: &[&Tensor], dtype: DType) -> anyhow::Result<(Tensor, Option<Vec<usize>>)> {
    let lens = rows
        .iter()
        .map(|t| t.dim(0))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let longest = lens.iter().copied().max().unwrap_or(0);
    let padded = rows
        .iter()
        .zip(&lens)
        .map(|(t, &n)| {
            let t = t.to_dtype(dtype)?;
            if n == longest {
                return Ok(t);
            }
            let pad = Tensor::zeros((longest - n, t.dim(1)?), dtype, t.device())?;
            Tensor::cat(&[&t, &pad], 0)
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    let all_full = lens.iter().all(|&n| n == longest);
    Ok((Tensor::stack(&padded, 0)?, (!all_full).then_some(lens)))
}

/// The inputs and targets of `batch` (items of one latent shape) at `draws`, noise drawn from `rng` item by item,
/// then the first-frame conditioning `options` ask for; the model computes in `dtype`. Targets are `noise − x` as
/// tokens [F·H·W, 128], as the model's output; with audio latents (every item of a joint run has them), both
/// streams' targets; laid out by [`loss_views`] (a conditioned clip's first frame left out).
pub fn ltx2_batch(
    batch: &[&TrainItem],
    draws: &[TimestepDraw],
    rng: &mut StepRng,
    dtype: DType,
    options: &BatchOptions,
) -> anyhow::Result<(Ltx2Inputs, Vec<Tensor>)> {
    let first = batch
        .first()
        .ok_or_else(|| anyhow::anyhow!("an empty LTX-2 batch"))?;
    let (_, f, h, w) = first.latents.dims4()?;
    let device = first.latents.device().clone();
    let mut noisy = Vec::with_capacity(batch.len());
    let mut clean = Vec::with_capacity(batch.len());
    let mut targets = Vec::with_capacity(batch.len());
    for (item, draw) in batch.iter().zip(draws) {
        let x = patchify(&item.latents.to_dtype(DType::F32)?)?;
        let noise = rng.normal(x.shape(), x.device())?;
        noisy.push(((&x * (1.0 - draw.t))? + (&noise * draw.t)?)?);
        targets.push((noise - &x)?);
        clean.push(x);
    }
    let context: Vec<&Tensor> = batch.iter().map(|i| &i.context).collect();
    let (context, context_lens) = padded_context(&context, dtype)?;
    let (audio, audio_targets) = if first.audio.is_some() {
        let (audio, targets) = audio_batch(batch, draws, rng, (dtype, &device))?;
        (Some(audio), Some(targets))
    } else {
        (None, None)
    };
    let p = options.first_frame_conditioning_p;
    let conditioned = first_frame_tokens(batch.len(), (f, h, w), p, rng);
    for ((noisy, x), &n) in noisy.iter_mut().zip(&clean).zip(&conditioned) {
        if n > 0 {
            *noisy = with_clean_lead(noisy, x, n)?;
        }
    }
    let targets = loss_views(targets, audio_targets, &conditioned)?;
    let inputs = Ltx2Inputs {
        latents: Tensor::stack(&noisy, 0)?.to_dtype(dtype)?,
        sigmas: draws.iter().map(|d| d.t as f32).collect(),
        positions: video_positions(batch.len(), (f, h, w), FRAME_RATE, &device)?,
        context,
        context_lens,
        audio,
        conditioned_tokens: conditioned,
    };
    Ok((inputs, targets))
}

/// The audio stream of a joint batch: each item's audio latents `[C, T, mel]` as tokens `[T, C·mel]` (ltx-core's
/// `AudioPatchifier`) noised at the item's σ with their own noise, the audio positions and the audio connector's
/// output padded as the video text is; and each sample's audio target `noise − x`.
fn audio_batch(
    batch: &[&TrainItem],
    draws: &[TimestepDraw],
    rng: &mut StepRng,
    (dtype, device): (DType, &candle_core::Device),
) -> anyhow::Result<(Ltx2AudioInputs, Vec<Tensor>)> {
    let mut noisy = Vec::with_capacity(batch.len());
    let mut texts = Vec::with_capacity(batch.len());
    let mut targets = Vec::with_capacity(batch.len());
    for (item, draw) in batch.iter().zip(draws) {
        let (Some(audio), Some(text)) = (&item.audio, &item.second_text) else {
            anyhow::bail!(
                "{} has no audio latents (or no audio text) but its batch trains audio; cache audio for every \
                 clip of the dataset, or none",
                item.key
            );
        };
        let (c, t, mel) = audio.dims3()?;
        let x = audio
            .to_dtype(DType::F32)?
            .permute((1, 0, 2))?
            .reshape((t, c * mel))?;
        let noise = rng.normal(x.shape(), x.device())?;
        noisy.push(((&x * (1.0 - draw.t))? + (&noise * draw.t)?)?);
        targets.push((noise - x)?);
        texts.push(text);
    }
    let frames = noisy[0].dim(0)?;
    let (context, _) = padded_context(&texts, dtype)?;
    let inputs = Ltx2AudioInputs {
        latents: Tensor::stack(&noisy, 0)?.to_dtype(dtype)?,
        positions: audio_positions(batch.len(), frames, device)?,
        context,
    };
    Ok((inputs, targets))
}

impl ImageModel for Ltx2Transformer {
    /// ComfyUI's and the official trainer's keys, which ltx-core's pipelines load too.
    const LORA_LAYOUT: SaveLayout = SaveLayout::Peft {
        prefix: OFFICIAL_PREFIX,
    };

    fn image_batch(
        batch: &[&TrainItem],
        draws: &[TimestepDraw],
        rng: &mut StepRng,
        dtype: DType,
        options: &BatchOptions,
    ) -> anyhow::Result<(Ltx2Inputs, Vec<Tensor>)> {
        ltx2_batch(batch, draws, rng, dtype, options)
    }
}
