//! FLUX.1 [dev] training pieces the engine composes: which run `model.dit` is a FLUX.1 file (and the clear error
//! when it is schnell, Kontext or a Wan file named as FLUX), the cached items of a musubi-tuner image dataset
//! (`*_flux.safetensors` latents beside `*_flux_te.safetensors` T5 / CLIP-L outputs), and the flow-matching batch
//! the model-agnostic checkpointed step takes: packed noisy latents, ids, timestep `t + 0.001` (musubi-tuner's
//! `(t·1000 + 1) / 1000`), the pooled CLIP-L vector and guidance 1.0, as musubi-tuner and sd-scripts train dev.

use std::path::{Path, PathBuf};

use crate::train::noise::StepRng;
use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use crate::family::image::items::{load_image_items, ImageCacheReader, ImageItems};
use crate::family::image::run::{model_timesteps, noisy_latents, BatchOptions, ImageModel};
use crate::train::data::TrainItem;
use crate::train::timesteps::TimestepDraw;
use framesmith_config::plan::ModelSource;
use framesmith_config::{RunConfig, RunPlan};
use framesmith_data::cache::parse_latent_cache_name;
use framesmith_data::family::flux::cache::{
    flux_text_cache_name, parse_flux_latent_cache_name, read_flux_text_cache, FLUX_CACHES,
};
use framesmith_data::{DatasetKind, Unreadable};
use framesmith_models::flux::rope::image_ids;
use framesmith_models::flux::sampling::prepare;
use framesmith_models::flux::weights::{
    identify, identify_expected, FluxComponent, FluxFormatError, FluxKind, FluxVariant,
};
use framesmith_models::flux::{Flux, FluxConfig, FluxInputs};

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
    match train_dit(path)? {
        (config, FluxVariant::Dev) => Ok(config),
        _ => Err(dit_error(path, Some(FluxVariant::Dev))),
    }
}

/// The sizes and variant of the DiT at `path` a run trains: FLUX.1 [dev], or FLUX.1 Kontext [dev] (an edit LoRA on
/// control images); any other file is named with what to pick, as for [`dev_config`].
pub fn train_dit(path: &Path) -> anyhow::Result<(FluxConfig, FluxVariant)> {
    let file = identify_expected(path, FluxComponent::Dit, None)
        .map_err(|e| anyhow::anyhow!("model.dit: {e}"))?;
    match file.kind {
        FluxKind::Dit { config, variant } if variant != FluxVariant::Schnell => {
            Ok((config, variant))
        }
        _ => Err(dit_error(path, Some(FluxVariant::Dev))),
    }
}

/// What [`identify_expected`] says of `path` when `variant` is expected.
fn dit_error(path: &Path, variant: Option<FluxVariant>) -> anyhow::Error {
    match identify_expected(path, FluxComponent::Dit, variant) {
        Err(e) => anyhow::anyhow!("model.dit: {e}"),
        Ok(_) => anyhow::anyhow!("model.dit holds no FLUX.1 DiT: {}", path.display()),
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

/// FLUX.1's `_flux` caches as a run reads them, checked against the DiT's sizes and variant (Kontext trains on
/// one control image per item, dev on none).
struct FluxCaches<'a>(&'a FluxConfig, FluxVariant);

impl ImageCacheReader for FluxCaches<'_> {
    fn family(&self) -> &'static str {
        "FLUX.1"
    }

    fn latent_stem(&self, file_name: &str) -> Option<String> {
        parse_flux_latent_cache_name(file_name).map(|p| p.stem)
    }

    fn found_instead(&self, listing: &[String]) -> String {
        let wan = listing
            .iter()
            .any(|n| parse_latent_cache_name(n, DatasetKind::Image).is_some());
        if wan {
            "only Wan caches (*_wan.safetensors), which FLUX.1 cannot use".into()
        } else {
            "no FLUX.1 latent caches (*_flux.safetensors)".into()
        }
    }

    fn text_cache_name(&self, stem: &str) -> String {
        flux_text_cache_name(stem)
    }

    fn how_to_cache(&self, dataset_toml: &Path) -> String {
        format!("run {} with the FLUX.1 files", cache_commands(dataset_toml))
    }

    fn latent_channels(&self) -> usize {
        self.0.in_channels / 4
    }

    fn read_latents(&self, path: &Path, device: &Device) -> anyhow::Result<(Tensor, Vec<Tensor>)> {
        Ok(FLUX_CACHES.read_latent_cache_with_controls(path, device)?)
    }

    fn check_controls(&self, count: usize, path: &Path) -> anyhow::Result<()> {
        match (self.1, count) {
            (FluxVariant::Kontext, 1) | (FluxVariant::Dev, 0) => Ok(()),
            (FluxVariant::Kontext, 0) => anyhow::bail!(
                "model.dit is FLUX.1 Kontext [dev], which learns to edit a source image, but this item was cached \
                 without one: give the dataset its control images (control_directory, or control_path in the \
                 JSONL), run `framesmith cache latents` again, or train FLUX.1 [dev] instead: {}",
                path.display()
            ),
            (FluxVariant::Kontext, n) => anyhow::bail!(
                "FLUX.1 Kontext [dev] takes one control image per item, this item was cached with {n}; keep one \
                 and cache the latents again: {}",
                path.display()
            ),
            _ => anyhow::bail!(
                "this item was cached with control images, which only FLUX.1 Kontext [dev] trains on; point \
                 model.dit at flux1-kontext-dev.safetensors, or cache the dataset without control images: {}",
                path.display()
            ),
        }
    }

    fn read_text(&self, path: &Path, device: &Device) -> anyhow::Result<(Tensor, Option<Tensor>)> {
        let text = read_flux_text_cache(path, device)?;
        Ok((text.t5, Some(text.clip_l_pooler.flatten_all()?)))
    }

    fn check_text(&self, t5: &Tensor, pooled: Option<&Tensor>, path: &Path) -> anyhow::Result<()> {
        let cfg = self.0;
        let pooled = pooled.context("a FLUX.1 text cache without CLIP-L's pooled vector")?;
        if t5.rank() != 2 || t5.dim(1)? != cfg.context_in_dim || pooled.dim(0)? != cfg.vec_in_dim {
            anyhow::bail!(
                "the text cache holds T5 output {:?} and a CLIP-L vector {:?}, but the model takes [L, {}] and [{}] \
                 (made with other text encoders?): {}",
                t5.dims(),
                pooled.dims(),
                cfg.context_in_dim,
                cfg.vec_in_dim,
                path.display()
            );
        }
        Ok(())
    }
}

/// The cached FLUX.1 items of every training dataset of a musubi-tuner dataset config, each with its
/// `num_repeats`: the latents `[16, 1, H, W]` as [`TrainItem::latents`], T5's output `[L, 4096]` as
/// [`TrainItem::context`] and CLIP-L's pooled vector `[768]` as [`TrainItem::clip`]. A dataset not cached for
/// FLUX.1 — nothing there, or only Wan caches — fails with the commands that cache it.
pub fn load_flux_items(
    dataset: (&Path, Unreadable),
    (cfg, variant): (&FluxConfig, FluxVariant),
    device: &Device,
) -> anyhow::Result<ImageItems> {
    load_image_items(dataset, &FluxCaches(cfg, variant), device)
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
    rng: &mut StepRng,
    dtype: DType,
) -> anyhow::Result<FluxBatch> {
    let (noisy, targets) =
        noisy_latents(batch, draws, rng, framesmith_models::flux::sampling::pack)?;
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
    let (img, img_ids) = with_control_tokens(batch, img, img_ids)?;
    let device = img.device();
    let b = batch.len();
    let inputs = FluxInputs {
        img: img.to_dtype(dtype)?,
        img_ids,
        txt,
        txt_ids,
        timesteps: model_timesteps(draws, device)?,
        y,
        guidance: Some(Tensor::full(TRAIN_GUIDANCE as f32, b, device)?),
    };
    Ok(FluxBatch { inputs, targets })
}

/// `img` and `img_ids` with Kontext's conditioning tokens appended: each item's control latents packed like the
/// image, their ids' axis 0 = 1 (as the official Kontext pipeline and musubi-tuner); unchanged without controls.
fn with_control_tokens(
    batch: &[&TrainItem],
    img: Tensor,
    img_ids: Tensor,
) -> anyhow::Result<(Tensor, Tensor)> {
    if batch[0].control.is_empty() {
        return Ok((img, img_ids));
    }
    let mut controls = Vec::with_capacity(batch.len());
    for item in batch {
        let [control] = item.control.as_slice() else {
            anyhow::bail!(
                "FLUX.1 Kontext takes one control image per item; {} has {}",
                item.key,
                item.control.len()
            );
        };
        controls.push(control.to_dtype(img.dtype())?.transpose(0, 1)?);
    }
    control_tokens(&Tensor::cat(&controls, 0)?, img, img_ids)
}

/// `img` and `img_ids` with the control latents `control` [b, C, h, w] packed and appended as Kontext's
/// conditioning tokens (ids axis 0 = 1).
pub fn control_tokens(
    control: &Tensor,
    img: Tensor,
    img_ids: Tensor,
) -> anyhow::Result<(Tensor, Tensor)> {
    let (b, _, h, w) = control.dims4()?;
    let packed = framesmith_models::flux::sampling::pack(&control.to_dtype(img.dtype())?)?;
    let ids = image_ids(b, h / 2, w / 2, 1.0, img.device())?;
    Ok((
        Tensor::cat(&[&img, &packed], 1)?,
        Tensor::cat(&[&img_ids, &ids], 1)?,
    ))
}

impl ImageModel for Flux {
    const NO_VALIDATION: Option<&'static str> = Some(
        "FLUX.1 runs do not validate yet: remove [validation] (validate_every_n_steps, validate_every_n_epochs, \
         validate_at_save) from the run config",
    );

    fn image_batch(
        batch: &[&TrainItem],
        draws: &[TimestepDraw],
        rng: &mut StepRng,
        dtype: DType,
        _options: &BatchOptions,
    ) -> anyhow::Result<(FluxInputs, Vec<Tensor>)> {
        let FluxBatch { inputs, targets } = flux_batch(batch, draws, rng, dtype)?;
        Ok((inputs, targets))
    }
}

#[cfg(test)]
pub(crate) mod tests;
