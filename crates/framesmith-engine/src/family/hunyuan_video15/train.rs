//! HunyuanVideo 1.5 training pieces the engine composes: which run `model.dit` is a HunyuanVideo 1.5 transformer,
//! and the flow-matching batch the model-agnostic checkpointed step takes, as musubi-tuner's
//! `hv_1_5_train_network.py` trains it: the cached latents × the VAE's scaling factor, noisy latents
//! `(1 − t)·x + t·noise` beside 33 condition channels (T2V: zeros; I2V: the cached first-frame latents and mask,
//! as the cache holds them) and, for I2V, the first frame's SigLIP features as image tokens, the Qwen2.5-VL hidden
//! states and the byT5 glyph states padded to the batch's longest with their lengths (an item whose caption quotes
//! nothing has no glyph tokens), the raw timestep `t·1000 + 1`, and the target `noise − latents`.

use std::path::{Path, PathBuf};

use crate::train::noise::StepRng;
use candle_core::{DType, Tensor};

use crate::family::image::run::{BatchOptions, ImageModel};
use crate::family::image::{dit_of, is_dit_run};
use crate::train::data::TrainItem;
use crate::train::timesteps::TimestepDraw;
use framesmith_config::{RunConfig, RunPlan};
use framesmith_data::family::hunyuan_video15::cache::HV15_SCALING_FACTOR;
use framesmith_models::hunyuan_video15::conditioning::model_input;
use framesmith_models::hunyuan_video15::transformer::TextStates;
use framesmith_models::hunyuan_video15::weights::{identify, is_unrecognised, Version};
use framesmith_models::hunyuan_video15::{
    HunyuanVideo15Config, HunyuanVideo15Inputs, HunyuanVideo15Transformer,
};

/// Whether `path` is a HunyuanVideo transformer (1.5 in any layout, or a 1.0 file that [`dit_config`] names), so
/// the run goes the HunyuanVideo 1.5 way and its messages say what is wrong.
pub fn is_hv15_file(path: &Path) -> bool {
    match identify(path) {
        Ok(_) => true,
        Err(err) => !is_unrecognised(&err),
    }
}

/// Whether the run `config` describes trains HunyuanVideo 1.5: its `model.dit` is a HunyuanVideo transformer.
pub fn is_hv15_run(config: &RunConfig) -> bool {
    is_dit_run(config, is_hv15_file)
}

/// The run's `model.dit` when it is a HunyuanVideo transformer.
pub fn hv15_dit_of(plan: &RunPlan) -> Option<PathBuf> {
    dit_of(plan, is_hv15_file)
}

/// The sizes of the HunyuanVideo 1.5 transformer at `path`, or an error naming the file and what is wrong with it
/// (a 1.0 transformer is named with what to download instead).
pub fn dit_config(path: &Path) -> anyhow::Result<HunyuanVideo15Config> {
    let file = identify(path).map_err(|e| anyhow::anyhow!("model.dit: {e}"))?;
    let config = match (file.version, file.config) {
        (Version::V15, Some(config)) => config,
        _ => {
            // `open` words the 1.0 refusal with what to download.
            let err = framesmith_models::hunyuan_video15::weights::open(path).err();
            anyhow::bail!(
                "model.dit: {}",
                err.map_or_else(
                    || "not a HunyuanVideo 1.5 transformer".into(),
                    |e| e.to_string()
                )
            );
        }
    };
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("model.dit: {e}: {}", path.display()))?;
    Ok(config)
}

/// One HunyuanVideo 1.5 batch made ready for the transformer.
pub struct Hv15Batch {
    pub inputs: HunyuanVideo15Inputs,
    /// Flow-matching targets `noise − latents`, one [32, F, H, W] per item.
    pub targets: Vec<Tensor>,
}

/// Token states `rows` [L_i, D] (`None`: no tokens) padded to the longest as [b, L, D] in `dtype`, with each
/// length; `None` when no row has a token.
fn padded_states(rows: &[Option<&Tensor>], dtype: DType) -> anyhow::Result<Option<TextStates>> {
    let lens = rows
        .iter()
        .map(|r| r.map_or(Ok(0), |t| t.dim(0)))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let longest = lens.iter().copied().max().unwrap_or(0);
    let Some(first) = rows
        .iter()
        .flatten()
        .find(|t| t.dim(0).is_ok_and(|n| n > 0))
    else {
        return Ok(None);
    };
    let (dim, device) = (first.dim(1)?, first.device());
    let padded = rows
        .iter()
        .zip(&lens)
        .map(|(row, &n)| {
            let pad = Tensor::zeros((longest - n, dim), dtype, device);
            match row.filter(|_| n > 0) {
                Some(t) if n == longest => t.to_dtype(dtype),
                Some(t) => Tensor::cat(&[&t.to_dtype(dtype)?, &pad?], 0),
                None => pad,
            }
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    Ok(Some(TextStates {
        states: Tensor::stack(&padded, 0)?,
        lens,
    }))
}

/// The noisy latents of `batch` at `draws` as one [b, 32, F, H, W] f32 tensor, and each item's target
/// `noise − x` [32, F, H, W], `x` the cached latents × the VAE's scaling factor; noise drawn from `rng` item by
/// item.
fn noisy_video(
    batch: &[&TrainItem],
    draws: &[TimestepDraw],
    rng: &mut StepRng,
) -> anyhow::Result<(Tensor, Vec<Tensor>)> {
    let mut noisy = Vec::with_capacity(batch.len());
    let mut targets = Vec::with_capacity(batch.len());
    for (item, draw) in batch.iter().zip(draws) {
        let x = item
            .latents
            .to_dtype(DType::F32)?
            .affine(HV15_SCALING_FACTOR, 0.0)?;
        let noise = rng.normal(x.shape(), x.device())?;
        noisy.push(((&x * (1.0 - draw.t))? + (&noise * draw.t)?)?.unsqueeze(0)?);
        targets.push((noise - x)?);
    }
    Ok((Tensor::cat(&noisy, 0)?, targets))
}

/// The image-to-video conditioning of `batch`: the cached condition channels [b, 33, F, H, W] and SigLIP features
/// [b, tokens, 1152], stacked; `None` for a text-to-video batch; an error for a batch that mixes the two.
fn image_conditioning(batch: &[&TrainItem]) -> anyhow::Result<Option<(Tensor, Tensor)>> {
    let parts: Vec<(&Tensor, &Tensor)> = batch
        .iter()
        .filter_map(|i| Some((i.image.as_ref()?, i.clip.as_ref()?)))
        .collect();
    if parts.is_empty() {
        return Ok(None);
    }
    if parts.len() != batch.len() {
        anyhow::bail!(
            "a batch mixes image-to-video items (with first-frame latents and SigLIP features) and text-to-video \
             ones; cache every dataset with hv_1_5_cache_latents.py --i2v, or set training.mode = \"text_to_video\""
        );
    }
    let (cond, siglip): (Vec<&Tensor>, Vec<&Tensor>) = parts.into_iter().unzip();
    Ok(Some((Tensor::stack(&cond, 0)?, Tensor::stack(&siglip, 0)?)))
}

/// The inputs and targets of `batch` (items of one latent shape) at `draws`, noise drawn from `rng` item by item;
/// the model computes in `dtype`.
pub fn hv15_batch(
    batch: &[&TrainItem],
    draws: &[TimestepDraw],
    rng: &mut StepRng,
    dtype: DType,
) -> anyhow::Result<Hv15Batch> {
    let (noisy, targets) = noisy_video(batch, draws, rng)?;
    let device = noisy.device().clone();
    let text: Vec<Option<&Tensor>> = batch.iter().map(|i| Some(&i.context)).collect();
    let key = batch.first().map_or("", |i| i.key.as_str());
    let txt = padded_states(&text, dtype)?
        .ok_or_else(|| anyhow::anyhow!("{key}: the text cache holds no tokens"))?;
    let glyphs: Vec<Option<&Tensor>> = batch.iter().map(|i| i.second_text.as_ref()).collect();
    let byt5 = padded_states(&glyphs, dtype)?;
    let (latents, image_embeds) = match image_conditioning(batch)? {
        Some((cond, siglip)) => (
            Tensor::cat(&[&noisy, &cond.to_dtype(DType::F32)?], 1)?,
            Some(siglip.to_dtype(dtype)?),
        ),
        None => (model_input(&noisy, None)?, None),
    };
    let timesteps: Vec<f32> = draws.iter().map(|d| d.model_timestep as f32).collect();
    let inputs = HunyuanVideo15Inputs {
        latents: latents.to_dtype(dtype)?,
        timesteps: Tensor::new(timesteps, &device)?,
        txt,
        byt5,
        image_embeds,
    };
    Ok(Hv15Batch { inputs, targets })
}

impl ImageModel for HunyuanVideo15Transformer {
    fn image_batch(
        batch: &[&TrainItem],
        draws: &[TimestepDraw],
        rng: &mut StepRng,
        dtype: DType,
        _options: &BatchOptions,
    ) -> anyhow::Result<(HunyuanVideo15Inputs, Vec<Tensor>)> {
        let Hv15Batch { inputs, targets } = hv15_batch(batch, draws, rng, dtype)?;
        Ok((inputs, targets))
    }
}
