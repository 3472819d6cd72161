//! The training set as the engine sees it: cached latents and text embeddings, grouped into batches of equal
//! latent shape (buckets), in an order that depends only on the seed and the epoch — so a resumed run sees
//! exactly the batches the uninterrupted run would have.

use std::collections::BTreeMap;

use candle_core::{Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// One cached training item.
#[derive(Clone, Debug)]
pub struct TrainItem {
    /// Where it came from (cache file or clip name), for messages.
    pub key: String,
    /// Latents [C, F, H, W] (normalised, as the VAE cache stores them).
    pub latents: Tensor,
    /// Text embedding [L, text_dim].
    pub context: Tensor,
}

/// Items grouped into batches of one latent shape.
pub struct TrainSet {
    items: Vec<TrainItem>,
    /// Batches as item indices; every batch holds items of one shape.
    batches: Vec<Vec<usize>>,
    seed: u64,
}

impl TrainSet {
    /// Groups `items` by latent shape into batches of at most `batch_size` (each item `repeats` times).
    pub fn new(
        items: Vec<TrainItem>,
        batch_size: usize,
        repeats: usize,
        seed: u64,
    ) -> Result<Self> {
        if items.is_empty() {
            candle_core::bail!("the dataset has no cached items");
        }
        let mut buckets: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            for _ in 0..repeats.max(1) {
                buckets
                    .entry(item.latents.dims().to_vec())
                    .or_default()
                    .push(i);
            }
        }
        let batches = buckets
            .into_values()
            .flat_map(|idx| {
                idx.chunks(batch_size.max(1))
                    .map(|c| c.to_vec())
                    .collect::<Vec<_>>()
            })
            .collect();
        Ok(Self {
            items,
            batches,
            seed,
        })
    }

    /// Batches per epoch.
    pub fn batches_per_epoch(&self) -> usize {
        self.batches.len()
    }

    pub fn items(&self) -> &[TrainItem] {
        &self.items
    }

    /// Mutable access to the items (tests corrupt them to exercise the non-finite guard).
    #[cfg(test)]
    pub fn items_mut(&mut self) -> &mut [TrainItem] {
        &mut self.items
    }

    /// The batch used at global micro-step `index` (0-based) and its epoch (1-based).
    pub fn batch_at(&self, index: usize) -> (usize, Vec<&TrainItem>) {
        let n = self.batches.len();
        let epoch = index / n;
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut StdRng::seed_from_u64(
            self.seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        ));
        let batch = &self.batches[order[index % n]];
        (epoch + 1, batch.iter().map(|&i| &self.items[i]).collect())
    }

    /// Moves every item to `device` (done once before training).
    pub fn to_device(&mut self, device: &Device) -> Result<()> {
        for item in &mut self.items {
            item.latents = item.latents.to_device(device)?;
            item.context = item.context.to_device(device)?;
        }
        Ok(())
    }
}

/// Cached items of a musubi-tuner dataset config, as musubi-tuner's trainer finds them: every
/// `*_wan.safetensors` latent cache in each dataset's cache directory, with the text cache of its media stem.
/// Returns the items (each repeated `num_repeats` times) and the first dataset's batch size.
pub fn load_cached_items(
    dataset_toml: &std::path::Path,
    cfg: &crate::models::wan::WanConfig,
    device: &Device,
) -> anyhow::Result<(Vec<TrainItem>, usize)> {
    use crate::data::cache::{
        parse_latent_cache_name, read_wan_latent_cache, read_wan_text_cache, text_cache_name,
    };
    use anyhow::Context;

    let valid = crate::data::load_valid(dataset_toml)?;
    let mut items = Vec::new();
    let batch_size = valid.datasets.first().map_or(1, |d| d.batch_size as usize);
    for dataset in &valid.datasets {
        let dir = dataset.cache_directory.clone().with_context(|| {
            format!(
                "dataset {} has no cache_directory; set one in {}",
                dataset.index,
                dataset_toml.display()
            )
        })?;
        let mut names: Vec<(String, String)> = std::fs::read_dir(&dir)
            .with_context(|| format!("cannot list the cache directory {}", dir.display()))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| parse_latent_cache_name(&n, dataset.kind()).map(|p| (n, p.stem)))
            .collect();
        names.sort();
        if names.is_empty() {
            anyhow::bail!(
                "no latent caches (*_wan.safetensors) in {}: cache the dataset first (framesmith cache, or \
                 musubi-tuner's wan_cache_latents.py and wan_cache_text_encoder_outputs.py)",
                dir.display()
            );
        }
        for (name, stem) in names {
            let latent_path = dir.join(&name);
            let (latent, _) = read_wan_latent_cache(&latent_path, device)?;
            let text_path = dir.join(text_cache_name(&stem));
            let text = read_wan_text_cache(&text_path, device).with_context(|| {
                format!(
                    "the text cache for {} is missing or unreadable",
                    latent_path.display()
                )
            })?;
            let channels = latent.latents.dim(0)?;
            if channels != cfg.out_dim {
                anyhow::bail!(
                    "{} has {channels}-channel latents but the model expects {} (a cache made with another VAE?): {}",
                    name,
                    cfg.out_dim,
                    latent_path.display()
                );
            }
            let width = text.t5.dim(1)?;
            if width != cfg.text_dim {
                anyhow::bail!(
                    "the text embedding is {width} wide but the model expects {}: {}",
                    cfg.text_dim,
                    text_path.display()
                );
            }
            for _ in 0..dataset.num_repeats.max(1) {
                items.push(TrainItem {
                    key: name.clone(),
                    latents: latent.latents.clone(),
                    context: text.t5.clone(),
                });
            }
        }
    }
    Ok((items, batch_size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;

    fn item(key: &str, f: usize) -> Result<TrainItem> {
        Ok(TrainItem {
            key: key.into(),
            latents: Tensor::zeros((16, f, 2, 2), DType::F32, &Device::Cpu)?,
            context: Tensor::zeros((3, 4), DType::F32, &Device::Cpu)?,
        })
    }

    #[test]
    fn batches_share_a_shape_and_order_is_reproducible() -> Result<()> {
        let items = vec![
            item("a", 1)?,
            item("b", 2)?,
            item("c", 1)?,
            item("d", 2)?,
            item("e", 1)?,
        ];
        let set = TrainSet::new(items, 2, 1, 7)?;
        assert_eq!(set.batches_per_epoch(), 3);
        for step in 0..9 {
            let (epoch, batch) = set.batch_at(step);
            assert_eq!(epoch, step / 3 + 1);
            let shape = batch[0].latents.dims().to_vec();
            assert!(batch.iter().all(|i| i.latents.dims() == shape.as_slice()));
            let (_, again) = set.batch_at(step);
            let keys: Vec<_> = batch.iter().map(|i| &i.key).collect();
            assert_eq!(keys, again.iter().map(|i| &i.key).collect::<Vec<_>>());
        }
        Ok(())
    }
}
