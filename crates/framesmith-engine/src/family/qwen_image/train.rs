//! Qwen-Image training pieces the engine composes: which run `model.dit` is a Qwen-Image transformer, the cached
//! items of a musubi-tuner image dataset (`*_qi.safetensors` latents beside `*_qi_te.safetensors` Qwen2.5-VL
//! outputs), and the flow-matching batch the model-agnostic checkpointed step takes, as musubi-tuner's
//! `qwen_image_train_network.py` trains it: noisy latents `(1 − t)·x + t·noise` packed into 2×2 tokens, one image
//! grid per sample (`img_shapes`), the captions' hidden states padded to the longest with their lengths
//! (`txt_seq_lens`), timestep `t + 0.001` (musubi-tuner's `(t·1000 + 1) / 1000`) and the target `noise − latents`
//! packed as the model's output.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;

use crate::train::data::TrainItem;
use crate::train::timesteps::TimestepDraw;
use framesmith_config::plan::ModelSource;
use framesmith_config::training::NUM_TRAIN_TIMESTEPS;
use framesmith_config::{RunConfig, RunPlan};
use framesmith_data::family::qwen_image::cache::{
    parse_qwen_latent_cache_name, qwen_text_cache_name, read_qwen_latent_cache,
    read_qwen_text_cache,
};
use framesmith_data::problem::summary_lines;
use framesmith_data::{DatasetKind, Unreadable};
use framesmith_models::qwen_image::latents::pack;
use framesmith_models::qwen_image::rope::ImageGrid;
use framesmith_models::qwen_image::weights::{identify, is_unrecognised};
use framesmith_models::qwen_image::{QwenImageConfig, QwenImageInputs};
use framesmith_nn::init::randn;

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
    let dit = &config.model.dit;
    !config.model.demo && !dit.as_os_str().is_empty() && is_qwen_image_file(dit)
}

/// The run's `model.dit` when it is a Qwen-Image transformer.
pub fn qwen_dit_of(plan: &RunPlan) -> Option<PathBuf> {
    match &plan.model.source {
        ModelSource::File(path) if is_qwen_image_file(path) => Some(path.clone()),
        _ => None,
    }
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

/// The cached items of a dataset config.
pub struct QwenImageItems {
    /// Each training item once, with its `num_repeats`.
    pub items: Vec<(TrainItem, usize)>,
    /// The first dataset's batch size.
    pub batch_size: usize,
    /// Entries left out because they cannot be read (`skip_unreadable`), as lines to log.
    pub skipped: Vec<String>,
}

/// The cached Qwen-Image items of every training dataset of a musubi-tuner dataset config, each with its
/// `num_repeats`: the latents `[16, 1, H, W]` as [`TrainItem::latents`] and Qwen2.5-VL's hidden states `[L, D]` as
/// [`TrainItem::context`]. A dataset not cached for Qwen-Image fails with the commands that cache it.
pub fn load_qwen_items(
    (dataset_toml, unreadable): (&Path, Unreadable),
    cfg: &QwenImageConfig,
    device: &Device,
) -> anyhow::Result<QwenImageItems> {
    let valid = framesmith_data::load_valid_with(dataset_toml, unreadable)?;
    let batch_size = valid.datasets.first().map_or(1, |d| d.batch_size as usize);
    let mut items = Vec::new();
    for dataset in &valid.datasets {
        if dataset.kind() != DatasetKind::Image {
            anyhow::bail!(
                "datasets[{}] is a video dataset; Qwen-Image trains on images (image_directory or \
                 image_jsonl_file): {}",
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
    Ok(QwenImageItems {
        items,
        batch_size,
        skipped: summary_lines(&valid.warnings),
    })
}

/// Reads one item's caches and checks them against the model `cfg`.
fn load_item(
    dir: &Path,
    file: String,
    stem: &str,
    dataset_toml: &Path,
    (cfg, device): (&QwenImageConfig, &Device),
) -> anyhow::Result<TrainItem> {
    let latent_path = dir.join(&file);
    let text_path = dir.join(qwen_text_cache_name(stem));
    if !text_path.exists() {
        anyhow::bail!(
            "the captions are not cached for Qwen-Image: {file} has no text cache beside it; make it with {}, then \
             start the run again: {}",
            cache_commands(dataset_toml),
            text_path.display()
        );
    }
    let latents = read_qwen_latent_cache(&latent_path, device)?;
    let channels = cfg.in_channels / 4;
    let (c, _, h, w) = latents.dims4()?;
    if c != channels || h % 2 != 0 || w % 2 != 0 {
        anyhow::bail!(
            "{file} has latents of shape {:?}; this Qwen-Image transformer takes [{channels}, 1, H, W] with H and W \
             even (a cache made with another VAE?): {}",
            latents.dims(),
            latent_path.display()
        );
    }
    let text = read_qwen_text_cache(&text_path, device)
        .with_context(|| format!("the text cache for {file} is unreadable"))?;
    let embed = text.vl_embed;
    if embed.rank() != 2 || embed.dim(1)? != cfg.joint_attention_dim || embed.dim(0)? == 0 {
        anyhow::bail!(
            "the text cache holds hidden states {:?}, but the model takes [L, {}] (made with another text \
             encoder?): {}",
            embed.dims(),
            cfg.joint_attention_dim,
            text_path.display()
        );
    }
    Ok(TrainItem {
        key: file,
        latents,
        context: embed,
        image: None,
        clip: None,
    })
}

/// The Qwen-Image items cached in `dir`.
fn load_dir(
    dir: &Path,
    dataset_toml: &Path,
    cfg: &QwenImageConfig,
    device: &Device,
) -> anyhow::Result<Vec<TrainItem>> {
    let listing = crate::train::data::list_cache_dir(dir)?;
    let mut names: Vec<(String, String)> = listing
        .iter()
        .filter_map(|n| parse_qwen_latent_cache_name(n).map(|p| (n.clone(), p.stem)))
        .collect();
    names.sort();
    if names.is_empty() {
        anyhow::bail!(
            "the dataset is not cached for Qwen-Image: its cache directory holds no Qwen-Image latent caches \
             (*_qi.safetensors); make them with {}, then start the run again: {}",
            cache_commands(dataset_toml),
            dir.display()
        );
    }
    names
        .into_iter()
        .map(|(file, stem)| load_item(dir, file, &stem, dataset_toml, (cfg, device)))
        .collect()
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

/// The transformer's timesteps [b] of `draws`: `model_timestep / 1000` (t + 0.001 in the continuous modes).
pub fn model_timesteps(draws: &[TimestepDraw], device: &Device) -> candle_core::Result<Tensor> {
    let ts: Vec<f32> = draws
        .iter()
        .map(|d| (d.model_timestep / NUM_TRAIN_TIMESTEPS as f64) as f32)
        .collect();
    Tensor::new(ts, device)
}

/// Noisy packed latents, the image grid, text and targets of `batch` (items of one latent shape) at `draws`, noise
/// drawn from `rng` item by item; the model computes in `dtype`.
pub fn qwen_batch(
    batch: &[&TrainItem],
    draws: &[TimestepDraw],
    rng: &mut StdRng,
    dtype: DType,
) -> anyhow::Result<QwenImageBatch> {
    let mut noisy = Vec::with_capacity(batch.len());
    let mut targets = Vec::with_capacity(batch.len());
    for (item, draw) in batch.iter().zip(draws) {
        // [C, 1, H, W] → [1, C, H, W].
        let x = item.latents.to_dtype(DType::F32)?.transpose(0, 1)?;
        let noise = randn(rng, x.shape(), 0.0, 1.0, x.device())?;
        noisy.push(((&x * (1.0 - draw.t))? + (&noise * draw.t)?)?);
        targets.push(pack(&(noise - x)?)?.squeeze(0)?);
    }
    let noisy = Tensor::cat(&noisy, 0)?;
    let (_, _, h, w) = noisy.dims4()?;
    let contexts: Vec<&Tensor> = batch.iter().map(|i| &i.context).collect();
    let (txt, lens) = padded_text(&contexts, dtype)?;
    let inputs = QwenImageInputs {
        img: pack(&noisy)?.to_dtype(dtype)?,
        img_grids: vec![ImageGrid::image(h / 2, w / 2)],
        txt,
        txt_lens: Some(lens),
        timesteps: model_timesteps(draws, noisy.device())?,
    };
    Ok(QwenImageBatch { inputs, targets })
}
