//! The cached items of an image family's run: every training dataset of a musubi-tuner dataset config (images
//! only, each with a cache directory and its `num_repeats`), the latent caches found in each directory by the
//! family's file names and each read beside its text cache; the family says how its files are named, read and
//! checked ([`ImageCacheReader`]).

use std::path::Path;

use anyhow::Context;
use candle_core::{Device, Tensor};

use crate::plan::{largest_cached_clip_of, ClipShape};
use crate::train::data::{list_cache_dir, TrainItem};
use crate::train::validation::{hold_out, Validation};
use framesmith_config::RunPlan;
use framesmith_data::problem::summary_lines;
use framesmith_data::{DatasetKind, Unreadable, ValidConfig};

/// How an image family's cached items are found, read and checked against its model.
pub(crate) trait ImageCacheReader {
    /// The family's name in messages (`FLUX.1`, `Qwen-Image`).
    fn family(&self) -> &'static str;
    /// The stem of `file_name` when it is one of the family's latent caches; `None` for any other file.
    fn latent_stem(&self, file_name: &str) -> Option<String>;
    /// What a cache directory holds instead when it has none of the family's latent caches (`listing`: its
    /// file names), e.g. "no FLUX.1 latent caches (*_flux.safetensors)".
    fn found_instead(&self, listing: &[String]) -> String;
    /// The text cache file name beside the latent cache of `stem`.
    fn text_cache_name(&self, stem: &str) -> String;
    /// How to make the dataset's caches, as the start of a sentence ("run `framesmith cache …`").
    fn how_to_cache(&self, dataset_toml: &Path) -> String;
    /// The latent channels the model takes (its latents are `[channels, 1, H, W]`, H and W even).
    fn latent_channels(&self) -> usize;
    /// Reads the latents of the cache at `path` and its control latents (an edit model's source images).
    fn read_latents(&self, path: &Path, device: &Device) -> anyhow::Result<(Tensor, Vec<Tensor>)>;
    /// Checks that an item with `count` control latents (read from `path`) suits the model: an edit model needs
    /// its control images, a text-to-image model takes none.
    fn check_controls(&self, count: usize, path: &Path) -> anyhow::Result<()>;
    /// Reads the text cache at `path`: the item's [`TrainItem::context`] and [`TrainItem::clip`].
    fn read_text(&self, path: &Path, device: &Device) -> anyhow::Result<(Tensor, Option<Tensor>)>;
    /// Checks a text cache's tensors (read from `path`) against the model.
    fn check_text(
        &self,
        context: &Tensor,
        clip: Option<&Tensor>,
        path: &Path,
    ) -> anyhow::Result<()>;
}

/// The cached items of a dataset config.
pub struct ImageItems {
    /// Each training item once, with its `num_repeats`.
    pub items: Vec<(TrainItem, usize)>,
    /// The first dataset's batch size.
    pub batch_size: usize,
    /// Entries left out because they cannot be read (`skip_unreadable`), as lines to log.
    pub skipped: Vec<String>,
}

/// The cached items of every training dataset of the musubi-tuner dataset config `dataset_toml`, each with its
/// `num_repeats`, read by `reader` on `device`. A video dataset, a dataset without a cache directory or not cached
/// for the family fails with what to do.
pub(crate) fn load_image_items(
    (dataset_toml, unreadable): (&Path, Unreadable),
    reader: &dyn ImageCacheReader,
    device: &Device,
) -> anyhow::Result<ImageItems> {
    let valid = framesmith_data::load_valid_with(dataset_toml, unreadable)?;
    let batch_size = valid.datasets.first().map_or(1, |d| d.batch_size as usize);
    let mut items = Vec::new();
    for dataset in &valid.datasets {
        if dataset.kind() != DatasetKind::Image {
            anyhow::bail!(
                "datasets[{}] is a video dataset; {} trains on images (image_directory or image_jsonl_file): {}",
                dataset.index,
                reader.family(),
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
        for item in load_dir(&dir, dataset_toml, reader, device)? {
            items.push((item, repeats));
        }
    }
    Ok(ImageItems {
        items,
        batch_size,
        skipped: summary_lines(&valid.warnings),
    })
}

/// The family's items cached in `dir`, in file-name order.
fn load_dir(
    dir: &Path,
    dataset_toml: &Path,
    reader: &dyn ImageCacheReader,
    device: &Device,
) -> anyhow::Result<Vec<TrainItem>> {
    let listing = list_cache_dir(dir)?;
    let mut names: Vec<(String, String)> = listing
        .iter()
        .filter_map(|n| reader.latent_stem(n).map(|stem| (n.clone(), stem)))
        .collect();
    names.sort();
    if names.is_empty() {
        anyhow::bail!(
            "the dataset is not cached for {}: its cache directory holds {}; {}, then start the run again: {}",
            reader.family(),
            reader.found_instead(&listing),
            reader.how_to_cache(dataset_toml),
            dir.display()
        );
    }
    names
        .into_iter()
        .map(|(file, stem)| load_item(dir, file, &stem, dataset_toml, (reader, device)))
        .collect()
}

/// Reads one item's caches and checks its latents against the model.
fn load_item(
    dir: &Path,
    file: String,
    stem: &str,
    dataset_toml: &Path,
    (reader, device): (&dyn ImageCacheReader, &Device),
) -> anyhow::Result<TrainItem> {
    let latent_path = dir.join(&file);
    let text_path = dir.join(reader.text_cache_name(stem));
    if !text_path.exists() {
        anyhow::bail!(
            "the captions are not cached for {}: {file} has no text cache beside it; {}, then start the run \
             again: {}",
            reader.family(),
            reader.how_to_cache(dataset_toml),
            text_path.display()
        );
    }
    let (latents, control) = reader.read_latents(&latent_path, device)?;
    let channels = reader.latent_channels();
    for t in std::iter::once(&latents).chain(&control) {
        let (c, _, h, w) = t.dims4()?;
        if c != channels || h % 2 != 0 || w % 2 != 0 {
            anyhow::bail!(
                "{file} has latents of shape {:?}; {} takes [{channels}, 1, H, W] with H and W even (a cache made \
                 with another VAE?): {}",
                t.dims(),
                reader.family(),
                latent_path.display()
            );
        }
    }
    reader.check_controls(control.len(), &latent_path)?;
    let (context, clip) = reader
        .read_text(&text_path, device)
        .with_context(|| format!("the text cache for {file} is unreadable"))?;
    reader.check_text(&context, clip.as_ref(), &text_path)?;
    Ok(TrainItem {
        key: file,
        latents,
        context,
        image: None,
        clip,
        control,
        second_text: None,
        audio: None,
    })
}

/// The clip an image run's steps see: the largest cached latent (× the autoencoder's `factor`) and the batch size.
/// An edit model's control images add their tokens to the image sequence, so an item with controls counts as one
/// image of the same width whose height also holds the controls' latents (the planner counts tokens, not sides).
pub(crate) fn largest_clip(items: &ImageItems, factor: usize) -> anyhow::Result<ClipShape> {
    let mut largest = (0, 0, 0);
    for (item, _) in &items.items {
        let (_, _, h, w) = item.latents.dims4()?;
        let mut area = h * w;
        for control in &item.control {
            let (_, _, ch, cw) = control.dims4()?;
            area += ch * cw;
        }
        if area > largest.0 {
            largest = (area, h, w);
        }
    }
    let (area, _, w) = largest;
    // Whole 2×2 patches: the height rounded up to an even number of latent rows.
    let h = if w == 0 {
        0
    } else {
        area.div_ceil(w).div_ceil(2) * 2
    };
    Ok(ClipShape {
        width: w * factor,
        height: h * factor,
        frames: 1,
        batch: items.batch_size.max(1),
    })
}

/// The training items, each repeated `num_repeats` times, and, when the run validates, the items held out for
/// it; a family whose runs do not validate has the config validator refuse `[validation]` first.
pub(crate) fn split_items(
    plan: &RunPlan,
    items: Vec<(TrainItem, usize)>,
    family: &str,
) -> anyhow::Result<(Vec<TrainItem>, Option<Validation>)> {
    let (train, validation) = match &plan.validation {
        Some(v) => {
            let Some(split) = v.split.filter(|s| *s > 0.0) else {
                anyhow::bail!(
                    "a {family} run validates on items held out of its dataset: set validation.validation_split \
                     (e.g. 0.1), or remove the [validation] schedule"
                );
            };
            let (train, held) = hold_out(items, split, v.seed)?;
            let validation = Validation {
                plan: v.clone(),
                items: held,
            };
            (train, Some(validation))
        }
        None => (items, None),
    };
    Ok((repeated(train), validation))
}

/// Each item repeated its `num_repeats` times.
pub(crate) fn repeated(items: Vec<(TrainItem, usize)>) -> Vec<TrainItem> {
    items
        .into_iter()
        .flat_map(|(item, repeats)| std::iter::repeat_n(item, repeats.max(1)))
        .collect()
}

/// A video VAE's compression: pixels per latent a side, and frames per latent frame after the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VideoVae {
    pub spatial: usize,
    pub temporal: usize,
}

impl VideoVae {
    /// The clip of `frames` × `height` × `width` latents: its pixels through the VAE's factors.
    pub(crate) fn clip_of_latents(
        self,
        [frames, height, width]: [usize; 3],
        batch: usize,
    ) -> ClipShape {
        ClipShape {
            width: width * self.spatial,
            height: height * self.spatial,
            frames: (frames.max(1) - 1) * self.temporal + 1,
            batch,
        }
    }

    /// The largest clip among the latent caches of `valid`'s datasets that `is_cache` says are the family's
    /// (given a file name and its dataset's kind), read from the cache files' headers; `None` when there is none.
    pub(crate) fn largest_cached_clip(
        self,
        valid: &ValidConfig,
        is_cache: impl Fn(&str, DatasetKind) -> bool,
    ) -> Option<ClipShape> {
        largest_cached_clip_of(valid, is_cache, |[_, frames, height, width], batch| {
            self.clip_of_latents([frames, height, width], batch)
        })
    }

    /// The clip a video run's steps see: the cached latent `[C, F, H, W]` of the most tokens, and the batch size.
    pub(crate) fn largest_clip(self, items: &ImageItems) -> anyhow::Result<ClipShape> {
        let mut largest = [0, 0, 0];
        for (item, _) in &items.items {
            let (_, f, h, w) = item.latents.dims4()?;
            if f * h * w > largest.iter().product() {
                largest = [f, h, w];
            }
        }
        Ok(self.clip_of_latents(largest, items.batch_size.max(1)))
    }
}
