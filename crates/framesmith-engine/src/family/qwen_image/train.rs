//! Qwen-Image training pieces the engine composes: which run `model.dit` is a Qwen-Image transformer, the cached
//! items of a musubi-tuner image dataset (`*_qi.safetensors` latents beside `*_qi_te.safetensors` Qwen2.5-VL
//! outputs), and the flow-matching batch the model-agnostic checkpointed step takes, as musubi-tuner's
//! `qwen_image_train_network.py` trains it: noisy latents `(1 − t)·x + t·noise` packed into 2×2 tokens, one image
//! grid per sample (`img_shapes`), the captions' hidden states padded to the longest with their lengths
//! (`txt_seq_lens`), timestep `t + 0.001` (musubi-tuner's `(t·1000 + 1) / 1000`) and the target `noise − latents`
//! packed as the model's output. An edit item (Qwen-Image-Edit, -2509) appends its control latents' tokens after
//! the noisy ones, each control image its own grid (`img_shapes`: frame k of the MSRoPE), and the loss covers the
//! target's tokens only.

use std::path::{Path, PathBuf};

use crate::train::noise::StepRng;
use candle_core::{DType, Device, Tensor};

use crate::family::image::items::{load_image_items, ImageCacheReader, ImageItems};
use crate::family::image::run::{model_timesteps, noisy_latents, BatchOptions, ImageModel};
use crate::family::image::{dit_of, is_dit_run};
use crate::train::data::TrainItem;
use crate::train::timesteps::TimestepDraw;
use framesmith_config::{RunConfig, RunPlan};
use framesmith_data::family::qwen_image::cache::{
    parse_qwen_latent_cache_name, qwen_text_cache_name, read_qwen_text_cache, QWEN_IMAGE_CACHES,
};
use framesmith_data::Unreadable;
use framesmith_models::qwen_image::latents::pack;
use framesmith_models::qwen_image::rope::ImageGrid;
use framesmith_models::qwen_image::weights::{identify, is_unrecognised};
use framesmith_models::qwen_image::{QwenImageConfig, QwenImageInputs, QwenImageTransformer};

/// Whether `path` is a Qwen-Image transformer (a file or a diffusers folder), or Qwen-Image tensors that do not
/// make one (a lone shard), so the run goes the Qwen-Image way and [`dit_config`] names what is wrong.
pub fn is_qwen_image_file(path: &Path) -> bool {
    match identify(path) {
        Ok(_) => true,
        Err(err) => !is_unrecognised(&err),
    }
}

/// Whether the run `config` describes trains Qwen-Image: its `model.dit` is a Qwen-Image transformer.
pub fn is_qwen_image_run(config: &RunConfig) -> bool {
    is_dit_run(config, is_qwen_image_file)
}

/// The run's `model.dit` when it is a Qwen-Image transformer.
pub fn qwen_dit_of(plan: &RunPlan) -> Option<PathBuf> {
    dit_of(plan, is_qwen_image_file)
}

/// The sizes of the Qwen-Image transformer at `path`, or an error naming the file and what is wrong with it.
pub fn dit_config(path: &Path) -> anyhow::Result<QwenImageConfig> {
    let file = identify(path).map_err(|e| anyhow::anyhow!("model.dit: {e}"))?;
    file.config
        .validate()
        .map_err(|e| anyhow::anyhow!("model.dit: {e}: {}", path.display()))?;
    Ok(file.config)
}

/// The `framesmith cache` commands that make a dataset's Qwen-Image caches.
fn cache_commands(dataset_toml: &Path) -> String {
    let toml = dataset_toml.display();
    format!(
        "`framesmith cache latents --dataset {toml} --vae <qwen_image_vae.safetensors> --dit <the Qwen-Image DiT>` \
         and `framesmith cache text --dataset {toml} --text-encoder \
         <qwen_2.5_vl_7b.safetensors>` (musubi-tuner's `_qi_te` caches are read as they are)"
    )
}

/// Qwen-Image's `_qi` caches as a run reads them, checked against the transformer's sizes.
struct QwenImageCaches<'a>(&'a QwenImageConfig);

impl ImageCacheReader for QwenImageCaches<'_> {
    fn family(&self) -> &'static str {
        "Qwen-Image"
    }

    fn latent_stem(&self, file_name: &str) -> Option<String> {
        parse_qwen_latent_cache_name(file_name).map(|p| p.stem)
    }

    fn found_instead(&self, _listing: &[String]) -> String {
        "no Qwen-Image latent caches (*_qi.safetensors)".into()
    }

    fn text_cache_name(&self, stem: &str) -> String {
        qwen_text_cache_name(stem)
    }

    fn how_to_cache(&self, dataset_toml: &Path) -> String {
        format!("make them with {}", cache_commands(dataset_toml))
    }

    fn latent_channels(&self) -> usize {
        self.0.in_channels / 4
    }

    fn read_latents(&self, path: &Path, device: &Device) -> anyhow::Result<(Tensor, Vec<Tensor>)> {
        Ok(QWEN_IMAGE_CACHES.read_latent_cache_with_controls(path, device)?)
    }

    /// Any number: an item with control latents trains Qwen-Image-Edit (the transformer has the same tensors).
    fn check_controls(&self, _count: usize, _path: &Path) -> anyhow::Result<()> {
        Ok(())
    }

    fn read_text(&self, path: &Path, device: &Device) -> anyhow::Result<(Tensor, Option<Tensor>)> {
        Ok((read_qwen_text_cache(path, device)?.vl_embed, None))
    }

    fn check_text(
        &self,
        embed: &Tensor,
        _clip: Option<&Tensor>,
        path: &Path,
    ) -> anyhow::Result<()> {
        let dim = self.0.joint_attention_dim;
        if embed.rank() != 2 || embed.dim(1)? != dim || embed.dim(0)? == 0 {
            anyhow::bail!(
                "the text cache holds hidden states {:?}, but the model takes [L, {dim}] (made with another text \
                 encoder?): {}",
                embed.dims(),
                path.display()
            );
        }
        Ok(())
    }
}

/// The cached Qwen-Image items of every training dataset of a musubi-tuner dataset config, each with its
/// `num_repeats`: the latents `[16, 1, H, W]` as [`TrainItem::latents`] and Qwen2.5-VL's hidden states `[L, D]` as
/// [`TrainItem::context`]. A dataset not cached for Qwen-Image fails with the commands that cache it.
pub fn load_qwen_items(
    dataset: (&Path, Unreadable),
    cfg: &QwenImageConfig,
    device: &Device,
) -> anyhow::Result<ImageItems> {
    load_image_items(dataset, &QwenImageCaches(cfg), device)
}

/// One Qwen-Image batch made ready for the transformer.
pub struct QwenImageBatch {
    pub inputs: QwenImageInputs,
    /// Flow-matching targets `noise − latents`, packed as the model's output: one [tokens, 4c] per item.
    pub targets: Vec<Tensor>,
}

/// The captions' hidden states `contexts` [L_i, D] padded to the longest as [b, L, D] in `dtype`, with each length.
pub fn padded_text(contexts: &[&Tensor], dtype: DType) -> anyhow::Result<(Tensor, Vec<usize>)> {
    let lens = contexts
        .iter()
        .map(|c| c.dim(0))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let longest = lens.iter().copied().max().unwrap_or(0);
    let rows = contexts
        .iter()
        .zip(&lens)
        .map(|(c, &n)| c.to_dtype(dtype)?.pad_with_zeros(0, 0, longest - n))
        .collect::<candle_core::Result<Vec<_>>>()?;
    Ok((Tensor::stack(&rows, 0)?, lens))
}

/// Noisy packed latents, the image grid, text and targets of `batch` (items of one latent shape) at `draws`, noise
/// drawn from `rng` item by item; the model computes in `dtype`.
pub fn qwen_batch(
    batch: &[&TrainItem],
    draws: &[TimestepDraw],
    rng: &mut StepRng,
    dtype: DType,
) -> anyhow::Result<QwenImageBatch> {
    let (noisy, targets) = noisy_latents(batch, draws, rng, pack)?;
    let (_, _, h, w) = noisy.dims4()?;
    let contexts: Vec<&Tensor> = batch.iter().map(|i| &i.context).collect();
    let (txt, lens) = padded_text(&contexts, dtype)?;
    let (img, img_grids) =
        with_control_tokens(batch, pack(&noisy)?, ImageGrid::image(h / 2, w / 2))?;
    let inputs = QwenImageInputs {
        img: img.to_dtype(dtype)?,
        img_grids,
        txt,
        txt_lens: Some(lens),
        timesteps: model_timesteps(draws, noisy.device())?,
    };
    Ok(QwenImageBatch { inputs, targets })
}

/// The packed noisy tokens `img` (of `grid`) followed by each control image's packed latents, and the grids in
/// that order, as the Qwen-Image-Edit pipelines concatenate them; unchanged without controls.
fn with_control_tokens(
    batch: &[&TrainItem],
    img: Tensor,
    grid: ImageGrid,
) -> anyhow::Result<(Tensor, Vec<ImageGrid>)> {
    let count = batch[0].control.len();
    let mut tokens = vec![img];
    let mut grids = vec![grid];
    for k in 0..count {
        let controls = batch
            .iter()
            .map(|item| {
                let control = item.control.get(k).ok_or_else(|| {
                    anyhow::anyhow!(
                        "{} has {} control images, not {count}",
                        item.key,
                        item.control.len()
                    )
                })?;
                Ok(control.to_dtype(tokens[0].dtype())?.transpose(0, 1)?)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let control = Tensor::cat(&controls, 0)?;
        let (_, _, ch, cw) = control.dims4()?;
        tokens.push(pack(&control)?);
        grids.push(ImageGrid::image(ch / 2, cw / 2));
    }
    Ok((Tensor::cat(&tokens, 1)?, grids))
}

impl ImageModel for QwenImageTransformer {
    fn image_batch(
        batch: &[&TrainItem],
        draws: &[TimestepDraw],
        rng: &mut StepRng,
        dtype: DType,
        _options: &BatchOptions,
    ) -> anyhow::Result<(QwenImageInputs, Vec<Tensor>)> {
        let QwenImageBatch { inputs, targets } = qwen_batch(batch, draws, rng, dtype)?;
        Ok((inputs, targets))
    }
}
