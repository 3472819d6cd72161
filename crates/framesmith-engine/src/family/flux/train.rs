//! FLUX.1 [dev] training pieces the engine composes: which run `model.dit` is a FLUX.1 file (and the clear error
//! when it is schnell, Kontext or a Wan file named as FLUX), the cached items of a musubi-tuner image dataset
//! (`*_flux.safetensors` latents beside `*_flux_te.safetensors` T5 / CLIP-L outputs), and the flow-matching batch
//! the model-agnostic checkpointed step takes: packed noisy latents, ids, timestep `t + 0.001` (musubi-tuner's
//! `(t·1000 + 1) / 1000`), the pooled CLIP-L vector and guidance 1.0, as musubi-tuner and sd-scripts train dev.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;

use crate::train::data::TrainItem;
use crate::train::timesteps::TimestepDraw;
use framesmith_config::plan::ModelSource;
use framesmith_config::{RunConfig, RunPlan};
use framesmith_data::cache::parse_latent_cache_name;
use framesmith_data::family::flux::cache::{
    flux_text_cache_name, parse_flux_latent_cache_name, read_flux_latent_cache,
    read_flux_text_cache,
};
use framesmith_data::problem::summary_lines;
use framesmith_data::{DatasetKind, Unreadable};
use framesmith_models::flux::sampling::prepare;
use framesmith_models::flux::weights::{
    identify, identify_expected, FluxComponent, FluxFormatError, FluxKind, FluxVariant,
};
use framesmith_models::flux::{FluxConfig, FluxInputs};
use framesmith_nn::init::randn;

/// The guidance strength FLUX.1 [dev] LoRAs train with (`guidance_scale` 1.0 in musubi-tuner and sd-scripts).
pub const TRAIN_GUIDANCE: f64 = 1.0;

/// Whether the file at `path` is a FLUX.1 file of any kind, a FLUX.1 transformer in diffusers' names included (so
/// a run goes the FLUX.1 way, where [`dev_config`] says what the file is when it is not dev's DiT).
pub fn is_flux_file(path: &Path) -> bool {
    matches!(
        identify(path),
        Ok(_) | Err(FluxFormatError::DiffusersTransformer { .. })
    )
}

/// Whether the run `config` describes trains FLUX.1: its `model.dit` is a FLUX.1 file of any kind (as
/// [`flux_dit_of`] decides).
pub fn is_flux_run(config: &RunConfig) -> bool {
    let dit = &config.model.dit;
    !config.model.demo && !dit.as_os_str().is_empty() && !dit.is_dir() && is_flux_file(dit)
}

/// The run's `model.dit` when it is a FLUX.1 file (of any kind: [`dev_config`] says when it is not dev's DiT).
pub fn flux_dit_of(plan: &RunPlan) -> Option<PathBuf> {
    match &plan.model.source {
        ModelSource::File(path) if !path.is_dir() && is_flux_file(path) => Some(path.clone()),
        _ => None,
    }
}

/// The sizes of the FLUX.1 [dev] DiT at `path`, or an error naming the file and what to pick: schnell (no guidance
/// input) or Kontext given as dev, the autoencoder or a text encoder given as the DiT, a Wan or diffusers file.
pub fn dev_config(path: &Path) -> anyhow::Result<FluxConfig> {
    let file = identify_expected(path, FluxComponent::Dit, Some(FluxVariant::Dev))
        .map_err(|e| anyhow::anyhow!("model.dit: {e}"))?;
    match file.kind {
        FluxKind::Dit { config, .. } => Ok(config),
        _ => anyhow::bail!("model.dit holds no FLUX.1 DiT: {}", path.display()),
    }
}

/// The `framesmith cache` commands that make a dataset's FLUX.1 caches.
fn cache_commands(dataset_toml: &Path) -> String {
    let toml = dataset_toml.display();
    format!(
        "`framesmith cache latents --dataset {toml} --vae <ae.safetensors>` and `framesmith cache text --dataset \
         {toml} --clip-l <clip_l.safetensors> --t5 <t5xxl_fp16.safetensors>`"
    )
}

/// The cached FLUX.1 items of every training dataset of a musubi-tuner dataset config, each with its
/// `num_repeats`: the latents `[16, 1, H, W]` as [`TrainItem::latents`], T5's output `[L, 4096]` as
/// [`TrainItem::context`] and CLIP-L's pooled vector `[768]` as [`TrainItem::clip`]. A dataset not cached for
/// FLUX.1 — nothing there, or only Wan caches — fails with the commands that cache it.
pub fn load_flux_items(
    (dataset_toml, unreadable): (&Path, Unreadable),
    cfg: &FluxConfig,
    device: &Device,
) -> anyhow::Result<FluxItems> {
    let valid = framesmith_data::load_valid_with(dataset_toml, unreadable)?;
    let batch_size = valid.datasets.first().map_or(1, |d| d.batch_size as usize);
    let mut items = Vec::new();
    for dataset in &valid.datasets {
        if dataset.kind() != DatasetKind::Image {
            anyhow::bail!(
                "datasets[{}] is a video dataset; FLUX.1 trains on images (image_directory or image_jsonl_file): {}",
                dataset.index,
                dataset_toml.display()
            );
        }
        let dir = dataset.cache_directory.clone().with_context(|| {
            format!(
                "datasets[{}] has no cache_directory; set one in {}",
                dataset.index,
                dataset_toml.display()
            )
        })?;
        let repeats = dataset.num_repeats.max(1) as usize;
        for item in load_dir(&dir, dataset_toml, cfg, device)? {
            items.push((item, repeats));
        }
    }
    Ok(FluxItems {
        items,
        batch_size,
        skipped: summary_lines(&valid.warnings),
    })
}

/// The cached items of a dataset config.
pub struct FluxItems {
    /// Each training item once, with its `num_repeats`.
    pub items: Vec<(TrainItem, usize)>,
    /// The first dataset's batch size.
    pub batch_size: usize,
    /// Entries left out because they cannot be read (`skip_unreadable`), as lines to log.
    pub skipped: Vec<String>,
}

/// The FLUX.1 items cached in `dir`.
fn load_dir(
    dir: &Path,
    dataset_toml: &Path,
    cfg: &FluxConfig,
    device: &Device,
) -> anyhow::Result<Vec<TrainItem>> {
    let listing = crate::train::data::list_cache_dir(dir)?;
    let mut names: Vec<(String, String)> = listing
        .iter()
        .filter_map(|n| parse_flux_latent_cache_name(n).map(|p| (n.clone(), p.stem)))
        .collect();
    names.sort();
    if names.is_empty() {
        let wan = listing
            .iter()
            .any(|n| parse_latent_cache_name(n, DatasetKind::Image).is_some());
        let found = if wan {
            "only Wan caches (*_wan.safetensors), which FLUX.1 cannot use"
        } else {
            "no FLUX.1 latent caches (*_flux.safetensors)"
        };
        anyhow::bail!(
            "the dataset is not cached for FLUX.1: its cache directory holds {found}; run {} with the FLUX.1 \
             files, then start the run again: {}",
            cache_commands(dataset_toml),
            dir.display()
        );
    }
    let channels = cfg.in_channels / 4;
    let mut items = Vec::with_capacity(names.len());
    for (file, stem) in names {
        let latent_path = dir.join(&file);
        let text_path = dir.join(flux_text_cache_name(&stem));
        if !text_path.exists() {
            anyhow::bail!(
                "the captions are not cached for FLUX.1: {file} has no text cache beside it; run {}, then start \
                 the run again: {}",
                cache_commands(dataset_toml),
                text_path.display()
            );
        }
        let latents = read_flux_latent_cache(&latent_path, device)?;
        let (c, _, h, w) = latents.dims4()?;
        if c != channels || h % 2 != 0 || w % 2 != 0 {
            anyhow::bail!(
                "{file} has latents of shape {:?}; FLUX.1 takes [{channels}, 1, H, W] with H and W even (a cache made \
                 with another VAE?): {}",
                latents.dims(),
                latent_path.display()
            );
        }
        let text = read_flux_text_cache(&text_path, device)
            .with_context(|| format!("the text cache for {file} is unreadable"))?;
        let (t5, pooled) = (text.t5, text.clip_l_pooler.flatten_all()?);
        if t5.rank() != 2 || t5.dim(1)? != cfg.context_in_dim || pooled.dim(0)? != cfg.vec_in_dim {
            anyhow::bail!(
                "the text cache holds T5 output {:?} and a CLIP-L vector {:?}, but the model takes [L, {}] and [{}] \
                 (made with other text encoders?): {}",
                t5.dims(),
                pooled.dims(),
                cfg.context_in_dim,
                cfg.vec_in_dim,
                text_path.display()
            );
        }
        items.push(TrainItem {
            key: file,
            latents,
            context: t5,
            image: None,
            clip: Some(pooled),
        });
    }
    Ok(items)
}

/// One FLUX.1 batch made ready for the DiT.
pub struct FluxBatch {
    pub inputs: FluxInputs,
    /// Flow-matching targets `noise − latents`, packed as the model's output: one [tokens, 64] per item.
    pub targets: Vec<Tensor>,
}

/// Noisy packed latents, ids, conditioning and targets of `batch` (items of one latent shape and text length) at
/// `draws`, noise drawn from `rng` item by item; the model computes in `dtype`.
pub fn flux_batch(
    batch: &[&TrainItem],
    draws: &[TimestepDraw],
    rng: &mut StdRng,
    dtype: DType,
) -> anyhow::Result<FluxBatch> {
    let mut noisy = Vec::with_capacity(batch.len());
    let mut targets = Vec::with_capacity(batch.len());
    for (item, draw) in batch.iter().zip(draws) {
        // [C, 1, H, W] → [1, C, H, W].
        let x = item.latents.to_dtype(DType::F32)?.transpose(0, 1)?;
        let noise = randn(rng, x.shape(), 0.0, 1.0, x.device())?;
        noisy.push(((&x * (1.0 - draw.t))? + (&noise * draw.t)?)?);
        let target = framesmith_models::flux::sampling::pack(&(noise - x)?)?;
        targets.push(target.squeeze(0)?);
    }
    let noisy = Tensor::cat(&noisy, 0)?;
    let txt =
        Tensor::stack(&batch.iter().map(|i| &i.context).collect::<Vec<_>>(), 0)?.to_dtype(dtype)?;
    let y = batch
        .iter()
        .map(|i| {
            i.clip
                .clone()
                .context("a FLUX.1 item without its pooled CLIP-L vector")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let y = Tensor::stack(&y, 0)?.to_dtype(dtype)?;
    let [img, img_ids, txt_ids] = prepare(&noisy, txt.dim(1)?)?;
    let device = img.device();
    let b = batch.len();
    let timesteps: Vec<f32> = draws
        .iter()
        .map(|d| {
            (d.model_timestep / framesmith_config::training::NUM_TRAIN_TIMESTEPS as f64) as f32
        })
        .collect();
    let inputs = FluxInputs {
        img: img.to_dtype(dtype)?,
        img_ids,
        txt,
        txt_ids,
        timesteps: Tensor::new(timesteps, device)?,
        y,
        guidance: Some(Tensor::full(TRAIN_GUIDANCE as f32, b, device)?),
    };
    Ok(FluxBatch { inputs, targets })
}

#[cfg(test)]
pub(crate) mod tests;
