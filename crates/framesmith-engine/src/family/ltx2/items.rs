//! The cached items of an LTX-2 run: every training dataset of a musubi-tuner dataset config (videos or images,
//! each with a cache directory and its `num_repeats`), the `_ltx2` latent caches of musubi-tuner's LTX-2 branch
//! found in each directory and each read beside its `_ltx2_te` text cache, checked against the transformer: the
//! normalised latents `[128, F, H, W]` as [`TrainItem::latents`] and the text connector's output `[L, D]` as
//! [`TrainItem::context`]; with an `_ltx2_audio` cache beside a clip's (musubi-tuner's `--ltx2_mode av`), its audio
//! latents `[8, T, 16]` (cut to the frames that hold audio) as [`TrainItem::audio`] and the audio connector's
//! output as [`TrainItem::second_text`]. Framesmith makes the video latent and text caches (`framesmith cache
//! latents`, `framesmith cache text`), not the audio ones (no audio VAE): a dataset not cached fails with the
//! commands that make them.

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use crate::family::image::items::{ImageItems, VideoVae};
use crate::train::data::{list_cache_dir, TrainItem};
use framesmith_data::family::ltx2::cache::{
    ltx2_audio_cache_name, ltx2_text_cache_name, parse_ltx2_latent_cache_name,
    read_ltx2_audio_cache, read_ltx2_latent_cache, read_ltx2_text_cache,
};
use framesmith_data::problem::summary_lines;
use framesmith_data::{DatasetKind, Unreadable};
use framesmith_models::ltx2::Ltx2Config;

/// Pixels per latent pixel of LTX-2's video VAE.
pub const VAE_FACTOR: usize = 32;
/// Frames per latent frame of LTX-2's video VAE (after the first).
pub const VAE_TEMPORAL: usize = 8;

/// How LTX-2's caches are made.
pub const LTX2_CACHES: &str = "make them with `framesmith cache latents --vae <the LTX-2 checkpoint>` and \
     `framesmith cache text --text-encoder <Gemma 3 12B> --dit <the checkpoint>` (the `_ltx2` caches of \
     musubi-tuner's LTX-2 branch, --ltx2_mode video, are read as they are)";

/// The width of the text context the model takes: the connector's output, before LTX-2's caption projection.
pub fn context_width(cfg: &Ltx2Config) -> usize {
    match (cfg.has_caption_projection(), cfg.caption_channels) {
        (true, Some(channels)) => channels,
        _ => cfg.cross_attention_dim,
    }
}

/// The cached items of every training dataset of the musubi-tuner dataset config `dataset_toml`, each with its
/// `num_repeats`, checked against `cfg` and read onto `device`.
pub fn load_ltx2_items(
    (dataset_toml, unreadable): (&Path, Unreadable),
    cfg: &Ltx2Config,
    device: &Device,
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
        for item in load_dir(&dir, dataset.kind(), cfg, device)? {
            items.push((item, repeats));
        }
    }
    Ok(ImageItems {
        items,
        batch_size,
        skipped: summary_lines(&valid.warnings),
    })
}

/// The items cached for LTX-2 in `dir` (a dataset of `kind`), in file-name order.
fn load_dir(
    dir: &Path,
    kind: DatasetKind,
    cfg: &Ltx2Config,
    device: &Device,
) -> anyhow::Result<Vec<TrainItem>> {
    let mut names: Vec<(String, String)> = list_cache_dir(dir)?
        .into_iter()
        .filter_map(|n| parse_ltx2_latent_cache_name(&n, kind).map(|p| (n, p.stem)))
        .collect();
    names.sort();
    if names.is_empty() {
        anyhow::bail!(
            "the dataset is not cached for LTX-2: its cache directory holds no *_ltx2.safetensors; \
             {LTX2_CACHES}: {}",
            dir.display()
        );
    }
    names
        .into_iter()
        .map(|(file, stem)| load_item(dir, file, &stem, (cfg, device)))
        .collect()
}

/// Reads one item's caches and checks them against the model.
fn load_item(
    dir: &Path,
    file: String,
    stem: &str,
    (cfg, device): (&Ltx2Config, &Device),
) -> anyhow::Result<TrainItem> {
    let latent_path = dir.join(&file);
    let text_path = dir.join(ltx2_text_cache_name(stem));
    if !text_path.exists() {
        anyhow::bail!(
            "the captions are not cached for LTX-2: {file} has no text cache beside it; run `framesmith cache \
             text --dataset <this dataset> --text-encoder <Gemma 3 12B> --dit <this checkpoint>`: {}",
            text_path.display()
        );
    }
    let latents = read_ltx2_latent_cache(&latent_path, device)?;
    let channels = cfg.in_channels;
    if latents.dim(0)? != channels {
        anyhow::bail!(
            "{file} has latents of shape {:?}; LTX-2 takes [{channels}, F, H, W] (a cache made with another VAE?): {}",
            latents.dims(),
            latent_path.display()
        );
    }
    let text = read_ltx2_text_cache(&text_path, device)
        .with_context(|| format!("the text cache for {file} is unreadable"))?;
    let context = text.video_prompt_embeds;
    let width = context_width(cfg);
    if context.rank() != 2 || context.dim(1)? != width || context.dim(0)? == 0 {
        anyhow::bail!(
            "the text cache holds video_prompt_embeds {:?}, but this {} takes [L, {width}] (made for the other \
             release, or an audio-video cache?); cache the captions again with this checkpoint: {}",
            context.dims(),
            cfg.version().name(),
            text_path.display()
        );
    }
    check_mask(
        text.prompt_attention_mask.as_ref(),
        context.dim(0)?,
        &text_path,
    )?;
    let audio = match ltx2_audio_cache_name(&file).map(|name| dir.join(name)) {
        Some(path) if path.exists() => Some(load_audio(&path, &file, cfg, device)?),
        _ => None,
    };
    let second_text = match (&audio, text.audio_prompt_embeds) {
        (None, _) => None,
        (Some(_), Some(a)) => {
            let width = audio_context_width(cfg);
            if a.rank() != 2 || a.dims() != [context.dim(0)?, width] {
                anyhow::bail!(
                    "the text cache holds audio_prompt_embeds {:?}, but this {} takes [{}, {width}] (as many \
                     tokens as video_prompt_embeds); cache the captions again with this checkpoint: {}",
                    a.dims(),
                    cfg.version().name(),
                    context.dim(0)?,
                    text_path.display()
                );
            }
            Some(a)
        }
        (Some(_), None) => anyhow::bail!(
            "{file} has audio latents but its text cache no audio_prompt_embeds; cache the captions for \
             audio-video (`framesmith cache text` with the audio-video checkpoint as --dit, or musubi-tuner's \
             ltx2_cache_text_encoder_outputs.py --ltx2_mode av): {}",
            text_path.display()
        ),
    };
    Ok(TrainItem {
        key: file,
        latents,
        context,
        image: None,
        clip: None,
        control: Vec::new(),
        second_text,
        audio,
    })
}

/// The width of the audio text context the model takes: the audio connector's output, before LTX-2's audio
/// caption projection.
pub fn audio_context_width(cfg: &Ltx2Config) -> usize {
    match (cfg.has_caption_projection(), cfg.caption_channels) {
        (true, Some(channels)) => channels,
        _ => cfg.audio_cross_attention_dim,
    }
}

/// Reads the audio latents of `file` at `path` as `[C, T, mel]`, cut to the frames that hold audio, checked
/// against the model's audio channels (`C · mel`).
fn load_audio(
    path: &Path,
    file: &str,
    cfg: &Ltx2Config,
    device: &Device,
) -> anyhow::Result<Tensor> {
    let cache = read_ltx2_audio_cache(path, device)
        .with_context(|| format!("the audio cache for {file} is unreadable"))?;
    let (c, t, mel) = cache.latents.dims3()?;
    if c * mel != cfg.audio_in_channels {
        anyhow::bail!(
            "{} holds audio latents [{c}, {t}, {mel}]; this {} takes {} channels × mel bins per frame (a cache \
             made with another audio VAE?): {}",
            file,
            cfg.version().name(),
            cfg.audio_in_channels,
            path.display()
        );
    }
    let frames = cache.length.map_or(t, |n| n.min(t));
    if frames == 0 {
        anyhow::bail!(
            "the audio cache of {file} holds no audio frames: {}",
            path.display()
        );
    }
    Ok(cache.latents.narrow(1, 0, frames)?)
}

/// Refuses a mask that does not cover the `tokens` context rows. Every row is attended to: the connector gave
/// the caption's padding its learnable registers, and ltx-core attends to them all after it.
fn check_mask(mask: Option<&Tensor>, tokens: usize, path: &Path) -> anyhow::Result<()> {
    let Some(mask) = mask else {
        return Ok(());
    };
    let valid = mask.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?;
    if mask.dims() != [tokens] || valid < 1.0 {
        anyhow::bail!(
            "the text cache's prompt_attention_mask {:?} does not fit its {tokens} text tokens (or marks none); \
             cache the captions again: {}",
            mask.dims(),
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
