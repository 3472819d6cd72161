//! The cached items of a HunyuanVideo 1.5 run: every training dataset of a musubi-tuner dataset config (videos or
//! images, each with a cache directory and its `num_repeats`), the `_hv15` latent caches found in each directory
//! by musubi-tuner's names and each read beside its text cache, checked against the transformer's sizes: the
//! latents `[32, F, H, W]` as [`TrainItem::latents`], Qwen2.5-VL's hidden states `[L, 3584]` as
//! [`TrainItem::context`], byT5's glyph states `[L2, 1472]` as [`TrainItem::second_text`] (`None` when the caption
//! quotes nothing), and for image-to-video (as musubi-tuner, whenever the caches hold them, unless the run says
//! `training.mode = "text_to_video"`) the first frame's latents and mask `[33, F, H, W]` as [`TrainItem::image`]
//! and its SigLIP features `[729, 1152]` as [`TrainItem::clip`]. The latent caches come from `super::prep` or
//! musubi-tuner, the text caches from `super::text_cache` or musubi-tuner: a dataset not cached fails saying so.

use std::path::Path;

use anyhow::Context;
use candle_core::{Device, Tensor};

use crate::family::image::items::{ImageItems, VideoVae};
use crate::train::data::{list_cache_dir, TrainItem};
use framesmith_config::run::TrainingMode;
use framesmith_data::family::hunyuan_video15::cache::Hv15LatentCache;
use framesmith_data::family::hunyuan_video15::cache::{
    hv15_text_cache_name, parse_hv15_latent_cache_name, read_hv15_latent_cache,
    read_hv15_text_cache,
};
use framesmith_data::problem::summary_lines;
use framesmith_data::{DatasetKind, Unreadable};
use framesmith_models::hunyuan_video15::HunyuanVideo15Config;

/// Pixels per latent pixel of HunyuanVideo 1.5's VAE.
pub const VAE_FACTOR: usize = 16;
/// Frames per latent frame of HunyuanVideo 1.5's VAE (after the first).
pub const VAE_TEMPORAL: usize = 4;

/// Where a dataset's `_hv15` caches come from.
pub const MUSUBI_CACHES: &str =
    "cache its latents with `framesmith cache latents --vae <HunyuanVideo 1.5 VAE>` \
     (for image-to-video also `--clip <SigLIP>`; or musubi-tuner's hv_1_5_cache_latents.py) and its captions \
     with `framesmith cache text --text-encoder <Qwen2.5-VL-7B> --dit <HunyuanVideo 1.5 transformer>` (the byT5 \
     glyph encoder beside the text encoder), or musubi-tuner's hv_1_5_cache_text_encoder_outputs.py";

/// What an item is read for: the transformer's sizes, the run's training mode and the device.
#[derive(Clone, Copy)]
pub struct ItemReader<'a> {
    pub cfg: &'a HunyuanVideo15Config,
    pub mode: TrainingMode,
    pub device: &'a Device,
}

/// The cached items of every training dataset of the musubi-tuner dataset config `dataset_toml`, each with its
/// `num_repeats`, checked against the transformer and the mode of `reader` and read onto its device.
pub fn load_hv15_items(
    (dataset_toml, unreadable): (&Path, Unreadable),
    reader: ItemReader<'_>,
) -> anyhow::Result<ImageItems> {
    let valid = framesmith_data::load_valid_with(dataset_toml, unreadable)?;
    let batch_size = valid.datasets.first().map_or(1, |d| d.batch_size as usize);
    let mut items = Vec::new();
    for dataset in &valid.datasets {
        let dir = dataset.cache_directory.clone().with_context(|| {
            format!(
                "datasets[{}] has no cache_directory; set one in {}",
                dataset.index,
                dataset_toml.display()
            )
        })?;
        let repeats = dataset.num_repeats.max(1) as usize;
        for item in load_dir(&dir, dataset.kind(), reader)? {
            items.push((item, repeats));
        }
    }
    Ok(ImageItems {
        items,
        batch_size,
        skipped: summary_lines(&valid.warnings),
    })
}

/// The items cached for HunyuanVideo 1.5 in `dir` (a dataset of `kind`), in file-name order.
fn load_dir(
    dir: &Path,
    kind: DatasetKind,
    reader: ItemReader<'_>,
) -> anyhow::Result<Vec<TrainItem>> {
    let mut names: Vec<(String, String)> = list_cache_dir(dir)?
        .into_iter()
        .filter_map(|n| parse_hv15_latent_cache_name(&n, kind).map(|p| (n, p.stem)))
        .collect();
    names.sort();
    if names.is_empty() {
        anyhow::bail!(
            "the dataset is not cached for HunyuanVideo 1.5: its cache directory holds no *_hv15.safetensors; \
             {MUSUBI_CACHES}: {}",
            dir.display()
        );
    }
    names
        .into_iter()
        .map(|(file, stem)| load_item(dir, file, &stem, reader))
        .collect()
}

/// Reads one item's caches and checks them against the model.
fn load_item(
    dir: &Path,
    file: String,
    stem: &str,
    reader: ItemReader<'_>,
) -> anyhow::Result<TrainItem> {
    let (cfg, device) = (reader.cfg, reader.device);
    let latent_path = dir.join(&file);
    let text_path = dir.join(hv15_text_cache_name(stem));
    if !text_path.exists() {
        anyhow::bail!(
            "the captions are not cached for HunyuanVideo 1.5: {file} has no text cache beside it; run \
             musubi-tuner's hv_1_5_cache_text_encoder_outputs.py on the dataset: {}",
            text_path.display()
        );
    }
    let cache = read_hv15_latent_cache(&latent_path, device)?;
    let (image, siglip) = image_parts(&cache, reader, &latent_path)?;
    let latents = cache.latents;
    let channels = cfg.out_channels;
    let (c, _, h, w) = latents.dims4()?;
    let p = cfg.patch_size.max(1);
    if c != channels || h % p != 0 || w % p != 0 {
        anyhow::bail!(
            "{file} has latents of shape {:?}; HunyuanVideo 1.5 takes [{channels}, F, H, W] (a cache made with \
             another VAE?): {}",
            latents.dims(),
            latent_path.display()
        );
    }
    let text = read_hv15_text_cache(&text_path, device)
        .with_context(|| format!("the text cache for {file} is unreadable"))?;
    check_width(&text.vl_embed, cfg.text_embed_dim, "Qwen2.5-VL", &text_path)?;
    let glyph = if text.byt5_embed.dim(0)? == 0 {
        None
    } else {
        check_width(&text.byt5_embed, cfg.text_embed_2_dim, "byT5", &text_path)?;
        Some(text.byt5_embed)
    };
    Ok(TrainItem {
        key: file,
        latents,
        context: text.vl_embed,
        image,
        clip: siglip,
        second_text: glyph,
        audio: None,
        control: Vec::new(),
    })
}

/// The image-to-video parts of a latent cache read from `path` (the first frame's latents and mask, its SigLIP
/// features), checked against the model; `None` for text-to-video, and an error when the run asks for
/// image-to-video and the cache has none.
fn image_parts(
    cache: &Hv15LatentCache,
    reader: ItemReader<'_>,
    path: &Path,
) -> anyhow::Result<(Option<Tensor>, Option<Tensor>)> {
    if reader.mode == TrainingMode::TextToVideo {
        return Ok((None, None));
    }
    let (Some(image), Some(siglip)) = (&cache.latents_image, &cache.siglip) else {
        if reader.mode == TrainingMode::ImageToVideo {
            anyhow::bail!(
                "training.mode = \"image_to_video\" needs each clip's first-frame latents and SigLIP features, which \
                 this cache does not hold; cache the dataset with `framesmith cache latents --clip <SigLIP>` (or \
                 musubi-tuner's hv_1_5_cache_latents.py --i2v --image_encoder <SigLIP>): {}",
                path.display()
            );
        }
        return Ok((None, None));
    };
    let (c, f, h, w) = cache.latents.dims4()?;
    let dim = reader.cfg.image_embed_dim;
    let siglip_ok = siglip.rank() == 2 && siglip.dim(1)? == dim && siglip.dim(0)? > 0;
    if image.dims() != [c + 1, f, h, w] || !siglip_ok {
        anyhow::bail!(
            "the cache's first-frame latents {:?} and SigLIP features {:?} do not fit the latents {:?}: the model \
             takes [{}, {f}, {h}, {w}] and [tokens, {dim}]: {}",
            image.dims(),
            siglip.dims(),
            cache.latents.dims(),
            c + 1,
            path.display()
        );
    }
    Ok((Some(image.clone()), Some(siglip.clone())))
}

/// Refuses hidden states `states` that are not `[L, dim]` with `L > 0` (`encoder`'s, read from `path`).
fn check_width(states: &Tensor, dim: usize, encoder: &str, path: &Path) -> anyhow::Result<()> {
    if states.rank() != 2 || states.dim(1)? != dim || states.dim(0)? == 0 {
        anyhow::bail!(
            "the text cache holds {encoder} states {:?}, but the model takes [L, {dim}] (made with another text \
             encoder?): {}",
            states.dims(),
            path.display()
        );
    }
    Ok(())
}

/// The VAE's compression, for the clips of cached latents.
pub(crate) const VAE: VideoVae = VideoVae {
    spatial: VAE_FACTOR,
    temporal: VAE_TEMPORAL,
};
