//! Wan's cached training items: the latent and text caches of a musubi-tuner dataset config (`*_wan.safetensors`
//! beside the text cache of its media stem, with `[[validation_datasets]]`), checked against the model they train,
//! the `framesmith cache` commands a dataset not cached yet needs, and the image-to-video parts of a batch.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use framesmith_data::cache::WanLatentCache;
use framesmith_data::problem::summary_lines;
use framesmith_data::Unreadable;
use framesmith_models::wan::vae::VaeVariant;
use framesmith_models::wan::{ModelType, WanConfig};

use crate::train::data::{list_cache_dir, TrainItem};

/// The image-to-video inputs of a batch, as musubi-tuner's trainer feeds the DiT: each item's `y` (its cached
/// image latents) for an I2V model, and the items' CLIP features stacked to [b, tokens, clip_dim] for Wan2.1
/// I2V; `None` where the model takes none. In f32, like the noisy latents `y` is concatenated to (the model casts
/// both to its compute dtype).
pub fn image_inputs(
    batch: &[&TrainItem],
    cfg: &WanConfig,
) -> anyhow::Result<(Option<Vec<Tensor>>, Option<Tensor>)> {
    if cfg.model_type != ModelType::I2v {
        return Ok((None, None));
    }
    let part = |item: &TrainItem, t: &Option<Tensor>, what: &str| match t {
        Some(t) => Ok(t.to_dtype(DType::F32)?),
        None => Err(anyhow::anyhow!(
            "{} has no {what}, which the image-to-video model needs",
            item.key
        )),
    };
    let y = batch
        .iter()
        .map(|item| part(item, &item.image, "image latents"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let clip = if cfg.has_clip() {
        let rows = batch
            .iter()
            .map(|item| part(item, &item.clip, "CLIP image features"))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Some(Tensor::stack(&rows, 0)?)
    } else {
        None
    };
    Ok((Some(y), clip))
}

/// Refuses latents whose height or width the DiT's patches do not divide (a clip cached at a size that is not a
/// multiple of the VAE's stride × the patch: 16 pixels for the Wan2.1 VAE, 32 for the Wan2.2 VAE of TI2V-5B).
fn check_patches(latents: &Tensor, cfg: &WanConfig, file: &str, path: &Path) -> anyhow::Result<()> {
    let (_, _, h, w) = latents.dims4()?;
    let [_, ph, pw] = cfg.patch_size;
    if h % ph.max(1) == 0 && w % pw.max(1) == 0 {
        return Ok(());
    }
    let (stride, _) = super::plan::latent_factors(cfg);
    let step = stride * ph.max(pw);
    anyhow::bail!(
        "{file} has latents of {h}x{w} (height x width), which the model's {ph}x{pw} patches do not divide: the clip \
         was cached at {}x{} pixels, not a multiple of {step}. Set the dataset's resolution to multiples of {step} \
         and cache it again: {}",
        w * stride,
        h * stride,
        path.display()
    )
}

/// The model files a run names, for the `framesmith cache` commands its messages suggest.
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheModels<'a> {
    /// The Wan VAE (`model.vae`).
    pub vae: Option<&'a Path>,
    /// The umT5 text encoder (`model.text_encoder`).
    pub text_encoder: Option<&'a Path>,
    /// The DiT (`model.dit`): `cache latents` reads from it whether to cache image-to-video conditioning.
    pub dit: Option<&'a Path>,
    /// The CLIP image encoder of Wan2.1 I2V (`model.clip`).
    pub clip: Option<&'a Path>,
}

/// What the CLIP image encoder file of Wan2.1 I2V is called, for messages.
pub const CLIP_FILE_HINT: &str = "<models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth>";

impl CacheModels<'_> {
    /// `framesmith cache latents …` for `dataset_toml`, with the VAE filled in when the run names one. For an
    /// image-to-video model `cfg` it names the DiT (or `--i2v`) and, for Wan2.1 I2V, the CLIP image encoder, so
    /// the caches get the first-frame conditioning the model needs.
    pub fn latents_command(&self, dataset_toml: &Path, cfg: &WanConfig) -> String {
        let vae_hint = match super::plan::vae_for(cfg).variant {
            VaeVariant::Wan22 => "<Wan2.2_VAE.pth>",
            VaeVariant::Wan21 => "<Wan2.1_VAE.pth>",
        };
        let mut command = format!(
            "framesmith cache latents --dataset {} --vae {}",
            shell_word(dataset_toml),
            self.vae.map_or(vae_hint.into(), shell_word)
        );
        if cfg.model_type == ModelType::I2v {
            match self.dit {
                Some(dit) => command.push_str(&format!(" --dit {}", shell_word(dit))),
                None => command.push_str(" --i2v"),
            }
            if cfg.has_clip() {
                let clip = self.clip.map_or(CLIP_FILE_HINT.into(), shell_word);
                command.push_str(&format!(" --clip {clip}"));
            }
        }
        command
    }

    /// `framesmith cache text …` for `dataset_toml`, with the text encoder filled in when the run names one.
    pub fn text_command(&self, dataset_toml: &Path) -> String {
        format!(
            "framesmith cache text --dataset {} --text-encoder {}",
            shell_word(dataset_toml),
            self.text_encoder
                .map_or("<models_t5_umt5-xxl-enc-bf16.pth>".into(), shell_word)
        )
    }
}

/// A path as one shell word: quoted when it holds anything a shell would split or expand.
fn shell_word(path: &Path) -> String {
    let text = path.display().to_string();
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:@%,=\\".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// The cached items of a dataset config: each training item once, with its `num_repeats`, and the held-out
/// items of `[[validation_datasets]]` (each once).
pub struct CachedItems {
    pub items: Vec<(TrainItem, usize)>,
    pub validation: Vec<TrainItem>,
    /// The first dataset's batch size.
    pub batch_size: usize,
    /// `[[validation_datasets]]` in the config (read only when `with_validation`).
    pub validation_datasets: usize,
    /// Entries left out because they cannot be read (`skip_unreadable`), as lines to log.
    pub skipped: Vec<String>,
}

/// Cached items of a musubi-tuner dataset config, as musubi-tuner's trainer finds them: every
/// `*_wan.safetensors` latent cache in each dataset's cache directory, with the text cache of its media stem.
/// `[[validation_datasets]]` are read the same way when `with_validation`. A dataset not cached yet fails with
/// the `framesmith cache` commands that cache it, with `models`' paths filled in. Entries that cannot be read
/// fail the load ([`load_cached_items_with`] can skip them).
pub fn load_cached_items(
    dataset_toml: &Path,
    cfg: &WanConfig,
    models: CacheModels<'_>,
    with_validation: bool,
    device: &Device,
) -> anyhow::Result<CachedItems> {
    load_cached_items_with(
        (dataset_toml, Unreadable::Refuse),
        cfg,
        models,
        with_validation,
        device,
    )
}

/// [`load_cached_items`], with entries that cannot be read left out with a warning when `unreadable` skips them.
pub fn load_cached_items_with(
    (dataset_toml, unreadable): (&Path, Unreadable),
    cfg: &WanConfig,
    models: CacheModels<'_>,
    with_validation: bool,
    device: &Device,
) -> anyhow::Result<CachedItems> {
    let valid = framesmith_data::load_valid_with(dataset_toml, unreadable)?;
    let batch_size = valid.datasets.first().map_or(1, |d| d.batch_size as usize);
    let place = CachePlace {
        dataset_toml,
        cfg,
        models,
        device,
    };
    let mut items = Vec::new();
    for dataset in &valid.datasets {
        let repeats = dataset.num_repeats.max(1) as usize;
        let name = format!("datasets[{}]", dataset.index);
        items.extend(
            place
                .load(dataset, &name, "the dataset")?
                .into_iter()
                .map(|item| (item, repeats)),
        );
    }
    let mut validation = Vec::new();
    if with_validation {
        for dataset in &valid.validation_datasets {
            let name = format!("validation_datasets[{}]", dataset.index);
            validation.extend(place.load(dataset, &name, "the validation dataset")?);
        }
    }
    Ok(CachedItems {
        items,
        validation,
        batch_size,
        validation_datasets: valid.validation_datasets.len(),
        skipped: summary_lines(&valid.warnings),
    })
}

/// Where cached items are read from and what they must fit.
struct CachePlace<'a> {
    dataset_toml: &'a Path,
    cfg: &'a WanConfig,
    models: CacheModels<'a>,
    device: &'a Device,
}

impl CachePlace<'_> {
    /// The items of one dataset (`name`: its section, `what`: how messages call it), each once.
    fn load(
        &self,
        dataset: &framesmith_data::config::ResolvedDataset,
        name: &str,
        what: &str,
    ) -> anyhow::Result<Vec<TrainItem>> {
        use anyhow::Context;
        use framesmith_data::cache::{
            parse_latent_cache_name, read_wan_latent_cache, read_wan_text_cache, text_cache_name,
        };
        let (toml, models, cfg) = (self.dataset_toml, self.models, self.cfg);
        let dir = dataset.cache_directory.clone().with_context(|| {
            format!(
                "{name} has no cache_directory; set one in {}",
                toml.display()
            )
        })?;
        let listing = list_cache_dir(&dir)?;
        let mut names: Vec<(String, String)> = listing
            .into_iter()
            .filter_map(|n| parse_latent_cache_name(&n, dataset.kind()).map(|p| (n, p.stem)))
            .collect();
        names.sort();
        if names.is_empty() {
            let which = if name.starts_with("validation") {
                format!(" ({name})")
            } else {
                String::new()
            };
            anyhow::bail!(
                "{what}{which} is not cached: no latent caches (*_wan.safetensors) in its cache directory; run `{}` \
                 and `{}` (musubi-tuner's caches work too), then start the run again: {}",
                models.latents_command(toml, cfg),
                models.text_command(toml),
                dir.display()
            );
        }
        let mut items = Vec::with_capacity(names.len());
        for (file, stem) in names {
            framesmith_nn::cancel::check()?;
            let latent_path = dir.join(&file);
            let text_path = dir.join(text_cache_name(&stem));
            if !text_path.exists() {
                anyhow::bail!(
                    "the captions are not cached: {file} has no text cache beside it; run `{}`, then start the \
                     run again: {}",
                    models.text_command(toml),
                    text_path.display()
                );
            }
            let (latent, _) = read_wan_latent_cache(&latent_path, self.device)?;
            let text = read_wan_text_cache(&text_path, self.device).with_context(|| {
                format!("the text cache for {} is unreadable", latent_path.display())
            })?;
            let channels = latent.latents.dim(0)?;
            if channels != cfg.out_dim {
                anyhow::bail!(
                    "{} has {channels}-channel latents but the model expects {} (a cache made with another VAE?): {}",
                    file,
                    cfg.out_dim,
                    latent_path.display()
                );
            }
            check_patches(&latent.latents, cfg, &file, &latent_path)?;
            let width = text.t5.dim(1)?;
            if width != cfg.text_dim {
                anyhow::bail!(
                    "the text embedding is {width} wide but the model expects {}: {}",
                    cfg.text_dim,
                    text_path.display()
                );
            }
            let (image, clip) = self.image_parts(&latent, &file, &latent_path)?;
            items.push(TrainItem {
                key: file,
                latents: latent.latents,
                context: text.t5,
                image,
                clip,
                control: Vec::new(),
                second_text: None,
                audio: None,
            });
        }
        Ok(items)
    }

    /// The image-to-video parts of one cache that the model takes: the image latents `y` for I2V models (checked
    /// against the latents' shape) and the CLIP features for Wan2.1 I2V. A cache without them fails with the
    /// command that makes them; other models ignore them, as musubi-tuner does.
    fn image_parts(
        &self,
        cache: &WanLatentCache,
        file: &str,
        path: &Path,
    ) -> anyhow::Result<(Option<Tensor>, Option<Tensor>)> {
        let cfg = self.cfg;
        if cfg.model_type != ModelType::I2v {
            return Ok((None, None));
        }
        let command = self.models.latents_command(self.dataset_toml, cfg);
        let Some(image) = &cache.latents_image else {
            anyhow::bail!(
                "{file} has no image latents (latents_image_…), which the image-to-video model needs: the cache was \
                 made for a text-to-video model. Run `{command}` (it adds the first frame's conditioning to the \
                 caches; musubi-tuner's caches made with --i2v work too), then start the run again: {}",
                path.display()
            );
        };
        let (c, f, h, w) = cache.latents.dims4()?;
        let want = cfg.in_dim.saturating_sub(cfg.out_dim);
        if image.dims() != [want, f, h, w] {
            anyhow::bail!(
                "{file} has image latents of shape {:?} but the model takes [{want}, {f}, {h}, {w}] (4 mask channels \
                 and {c} latent channels beside latents of shape [{c}, {f}, {h}, {w}]); cache it again with `{command}`: \
                 {}",
                image.dims(),
                path.display()
            );
        }
        if !cfg.has_clip() {
            return Ok((Some(image.clone()), None));
        }
        let Some(clip) = &cache.clip else {
            anyhow::bail!(
                "{file} has no CLIP image features (clip_…), which Wan2.1 I2V needs: run `{command}` with the CLIP \
                 image encoder (musubi-tuner's caches made with --clip work too), then start the run again: {}",
                path.display()
            );
        };
        // One-frame caches store [1, tokens, dim]; musubi-tuner squeezes that axis before the DiT.
        let clip = match clip.dims() {
            [1, _, _] => clip.squeeze(0)?,
            _ => clip.clone(),
        };
        match clip.dims() {
            [tokens, d] if *tokens > 0 && *d == cfg.clip_dim => Ok((Some(image.clone()), Some(clip))),
            dims => anyhow::bail!(
                "{file} has CLIP features of shape {dims:?} but the model takes [tokens, {}] (made with another \
                 image encoder?); cache it again with `{command}`: {}",
                cfg.clip_dim,
                path.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uncached_dataset_says_which_commands_cache_it() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let images = dir.path().join("images");
        std::fs::create_dir(&images)?;
        image::RgbImage::new(16, 16).save(images.join("a.png"))?;
        std::fs::write(images.join("a.txt"), "a black square")?;
        let toml = dir.path().join("my data.toml");
        std::fs::write(
            &toml,
            "[[datasets]]\nimage_directory = \"images\"\ncaption_extension = \".txt\"\n\
             cache_directory = \"cache\"\n",
        )?;
        let cfg = framesmith_models::wan::WanConfig::tiny(2);
        let vae = Path::new("/models/Wan2.1_VAE.pth");
        let models = CacheModels {
            vae: Some(vae),
            ..CacheModels::default()
        };
        let message = |models| {
            load_cached_items(&toml, &cfg, models, true, &Device::Cpu)
                .err()
                .map(|e| format!("{e:#}"))
                .unwrap_or_default()
        };
        let err = message(models);
        let quoted = format!("'{}'", toml.display());
        assert!(err.starts_with("the dataset is not cached"), "{err}");
        assert!(
            err.contains(&format!(
                "`framesmith cache latents --dataset {quoted} --vae /models/Wan2.1_VAE.pth`"
            )) && err.contains(&format!(
                "`framesmith cache text --dataset {quoted} --text-encoder <models_t5_umt5-xxl-enc-bf16.pth>`"
            )),
            "{err}"
        );
        assert!(
            err.ends_with(&dir.path().join("cache").display().to_string()),
            "{err}"
        );

        // Latents cached, captions not: only the text command.
        std::fs::create_dir(dir.path().join("cache"))?;
        let latent = dir.path().join("cache/a_0016x0016_wan.safetensors");
        std::fs::write(&latent, b"not read before the text cache is looked for")?;
        let err = message(CacheModels::default());
        assert!(
            err.starts_with("the captions are not cached")
                && err.contains("framesmith cache text")
                && !err.contains("framesmith cache latents"),
            "{err}"
        );
        Ok(())
    }

    /// Writes one cached image item (`stem`) into `dir` for a model of `cfg`'s shape.
    fn cache_item(dir: &Path, stem: &str, cfg: &WanConfig) -> anyhow::Result<()> {
        use framesmith_data::cache::{
            image_latent_cache_name, text_cache_name, write_wan_latent_cache, write_wan_text_cache,
            LatentCacheMetadata, WanLatentCache,
        };
        std::fs::create_dir_all(dir)?;
        let cache = WanLatentCache {
            latents: Tensor::zeros((cfg.out_dim, 1, 2, 2), DType::F32, &Device::Cpu)?,
            latents_image: None,
            latents_control: None,
            clip: None,
            f_indices: None,
        };
        let latent = dir.join(image_latent_cache_name(stem, (16, 16)));
        write_wan_latent_cache(&latent, &cache, &LatentCacheMetadata::wan((16, 16), None))?;
        let t5 = Tensor::zeros((3, cfg.text_dim), DType::F32, &Device::Cpu)?;
        write_wan_text_cache(&dir.join(text_cache_name(stem)), &t5, "a caption")?;
        Ok(())
    }

    #[test]
    fn validation_datasets_load_beside_the_training_set_and_say_when_uncached() -> anyhow::Result<()>
    {
        let dir = tempfile::tempdir()?;
        let images = dir.path().join("images");
        std::fs::create_dir(&images)?;
        let toml = dir.path().join("data.toml");
        std::fs::write(
            &toml,
            "[general]\ncaption_extension = \".txt\"\n[[datasets]]\nimage_directory = \"images\"\ncache_directory = \"cache\"\nnum_repeats = 3\n\
             [[validation_datasets]]\nimage_directory = \"images\"\ncache_directory = \"val_cache\"\n",
        )?;
        let cfg = framesmith_models::wan::WanConfig::tiny(2);
        cache_item(&dir.path().join("cache"), "a", &cfg)?;
        cache_item(&dir.path().join("cache"), "b", &cfg)?;
        let load = |with_validation| {
            load_cached_items(
                &toml,
                &cfg,
                CacheModels::default(),
                with_validation,
                &Device::Cpu,
            )
        };
        // Without validation the validation datasets are not read (nor required to be cached).
        let cached = load(false)?;
        assert_eq!(
            cached.items.len(),
            2,
            "each item once, with its repeats beside it"
        );
        assert!(cached.items.iter().all(|(_, repeats)| *repeats == 3));
        assert_eq!(cached.validation_datasets, 1);
        assert!(cached.validation.is_empty());

        let err = load(true)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(
            err.starts_with("the validation dataset (validation_datasets[0]) is not cached")
                && err.contains("framesmith cache latents --dataset")
                && err.contains("framesmith cache text --dataset")
                && err.ends_with(&dir.path().join("val_cache").display().to_string()),
            "{err}"
        );

        cache_item(&dir.path().join("val_cache"), "v", &cfg)?;
        let cached = load(true)?;
        assert_eq!(cached.items.len(), 2);
        assert_eq!(cached.validation.len(), 1);
        assert!(cached.validation[0].key.starts_with("v_"));
        Ok(())
    }
}
