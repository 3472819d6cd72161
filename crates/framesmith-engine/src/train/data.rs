//! The training set as the engine sees it: cached latents and text embeddings, grouped into batches of equal
//! latent shape (buckets), in an order that depends only on the seed and the epoch — so a resumed run sees
//! exactly the batches the uninterrupted run would have.

use std::collections::BTreeMap;
use std::path::Path;

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
    /// Image-to-video conditioning `y` [4 + C, F, H, W]: the first-frame mask and the latents of the first frame
    /// followed by zeros (the cache's `latents_image`); `None` for text-to-video models.
    pub image: Option<Tensor>,
    /// A second conditioning the family's caches hold for the item: image features [tokens, dim] of the first
    /// frame (CLIP or SigLIP vision features), or CLIP-L's pooled caption vector [768].
    pub clip: Option<Tensor>,
    /// An edit model's control latents [C, 1, h, w] (its source images), in order; empty for other models.
    pub control: Vec<Tensor>,
    /// A second text encoder's hidden states of the caption [L2, dim2], kept apart from `context` (e.g. a glyph
    /// encoder's states of the caption's quoted text, or the text states a second stream reads); `None` when the
    /// family has none or it is empty.
    pub second_text: Option<Tensor>,
    /// A second stream's latents trained jointly with `latents` (audio latents [C, T, mel] beside a clip's);
    /// `None` when the family has none or the cache holds none.
    pub audio: Option<Tensor>,
}

impl TrainItem {
    /// What items of one batch share: the latents' shape, each control latent's and the second stream's.
    fn bucket_key(&self) -> Vec<Vec<usize>> {
        std::iter::once(self.latents.dims().to_vec())
            .chain(self.control.iter().map(|c| c.dims().to_vec()))
            .chain(self.audio.iter().map(|a| a.dims().to_vec()))
            .collect()
    }
}

/// Items grouped into batches of one latent shape.
pub struct TrainSet {
    items: Vec<TrainItem>,
    /// Batches as item indices; every batch holds items of one shape.
    batches: Vec<Vec<usize>>,
    seed: u64,
}

impl TrainSet {
    /// Groups `items` by latent shape (and control latents' shapes) into batches of at most `batch_size` (each item
    /// `repeats` times).
    pub fn new(
        items: Vec<TrainItem>,
        batch_size: usize,
        repeats: usize,
        seed: u64,
    ) -> Result<Self> {
        if items.is_empty() {
            candle_core::bail!("the dataset has no cached items");
        }
        let mut buckets: BTreeMap<Vec<Vec<usize>>, Vec<usize>> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            for _ in 0..repeats.max(1) {
                buckets.entry(item.bucket_key()).or_default().push(i);
            }
        }
        // A batch takes items of one bucket: a larger batch_size would silently become the bucket's size.
        let largest = buckets.values().map(Vec::len).max().unwrap_or(0);
        if batch_size > largest {
            candle_core::bail!(
                "batch_size = {batch_size} but the largest bucket (cached items of one size, times num_repeats) holds \
                 {largest}, and a batch takes items of one bucket, so no batch could be that large; set batch_size \
                 to {largest} or less in the dataset config"
            );
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
            for part in [&mut item.image, &mut item.clip, &mut item.second_text] {
                *part = part.as_ref().map(|t| t.to_device(device)).transpose()?;
            }
            for control in &mut item.control {
                *control = control.to_device(device)?;
            }
        }
        Ok(())
    }
}

/// The file names in a cache directory; none when it does not exist yet.
pub(crate) fn list_cache_dir(dir: &Path) -> anyhow::Result<Vec<String>> {
    Ok(match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        listing => anyhow::Context::with_context(listing, || {
            format!("cannot list the cache directory {}", dir.display())
        })?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect(),
    })
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
            image: None,
            clip: None,
            control: Vec::new(),
            second_text: None,
            audio: None,
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

    #[test]
    fn a_batch_size_no_bucket_can_fill_is_refused_not_shrunk() -> Result<()> {
        let items = || {
            (0..8)
                .map(|i| item(&format!("i{i}"), 1))
                .collect::<Result<Vec<_>>>()
        };
        let err = TrainSet::new(items()?, 100_000, 1, 7)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("batch_size = 100000")
                && err.contains("holds 8")
                && err.contains("set batch_size to 8"),
            "{err}"
        );
        // Repeats fill a bucket too: 8 items twice make batches of 16.
        assert_eq!(TrainSet::new(items()?, 16, 2, 7)?.batches_per_epoch(), 1);
        Ok(())
    }
}
