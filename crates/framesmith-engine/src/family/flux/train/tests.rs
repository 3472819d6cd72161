//! FLUX.1 [dev] training on the CPU with the tiny fixture model: the run's DiT is checked as dev (schnell, Kontext
//! and Wan files are refused by name), items come from `_flux` caches of a musubi-tuner image dataset (Wan caches
//! are refused with the commands that cache it), and N optimizer steps through the model-agnostic checkpointed step
//! give a finite loss, a LoRA under sd-scripts' FLUX.1 names, and a continuation from saved LoRA and optimizer
//! state that is bit-identical to the uninterrupted steps.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use crate::train::noise::StepRng;
use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::family::flux::train::{dev_config, flux_batch, is_flux_file, load_flux_items};
use crate::train::data::TrainSet;
use crate::train::optimizer::AdamW;
use crate::train::step::{try_checkpointed_step, LossTarget, StepOptions};
use crate::train::timesteps::sample_timesteps;
use crate::train::trainer::mix;
use framesmith_config::run::TimestepSampling;
use framesmith_config::training::TimestepConfig;
use framesmith_data::cache::{image_latent_cache_name, text_cache_name, write_wan_text_cache};
use framesmith_data::family::flux::cache::{
    flux_latent_cache_name, flux_text_cache_name, write_flux_latent_cache, write_flux_text_cache,
    FluxTextCache,
};
use framesmith_data::Unreadable;
use framesmith_models::flux::weights::{official_shapes, FluxVariant};
use framesmith_models::flux::{Flux, FluxConfig};
use framesmith_nn::init::randn;
use framesmith_nn::lora::{attach_family_loras, LoraFamily, LoraSet, LoraSpec};
use framesmith_nn::lora_file::LoraFile;
use framesmith_nn::vb::Vb;

fn fixture_weights(case: &str) -> std::path::PathBuf {
    framesmith_models::fixtures::case_dir("flux", case).join("weights.safetensors")
}

fn tiny_config() -> anyhow::Result<FluxConfig> {
    let dir = framesmith_models::fixtures::case_dir("flux", "flux_dit");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    Ok(FluxConfig::from_json(&json["init"].to_string())?)
}

#[test]
fn the_dit_must_be_flux_dev_and_other_files_are_named() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let dev = dir.path().join("flux1-dev.safetensors");
    std::fs::copy(fixture_weights("flux_dit"), &dev)?;
    assert_eq!(dev_config(&dev)?, tiny_config()?);
    assert!(is_flux_file(&dev));

    let schnell = dir.path().join("flux1-schnell.safetensors");
    std::fs::copy(fixture_weights("flux_dit_schnell"), &schnell)?;
    let kontext = dir.path().join("flux1-kontext-dev.safetensors");
    std::fs::copy(fixture_weights("flux_dit"), &kontext)?;
    let wan = dir.path().join("wan2.1_t2v_1.3B.safetensors");
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &Device::Cpu);
    let wan_tensors: HashMap<String, Tensor> = [
        ("patch_embedding.weight".to_string(), z(&[8, 16, 1, 2, 2])?),
        ("blocks.0.self_attn.q.weight".to_string(), z(&[8, 8])?),
    ]
    .into();
    candle_core::safetensors::save(&wan_tensors, &wan)?;
    for (path, says) in [
        (&schnell, "FLUX.1 [schnell]"),
        (&kontext, "FLUX.1 Kontext [dev]"),
        (&wan, "a Wan diffusion transformer"),
    ] {
        assert_eq!(is_flux_file(path), path != &wan, "{}", path.display());
        let err = format!("{:#}", dev_config(path).unwrap_err());
        assert!(err.starts_with("model.dit: "), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(err.ends_with(&path.display().to_string()), "{err}");
    }
    Ok(())
}

/// A musubi-tuner image dataset config with its cache directory `cache`, and one image.
fn dataset(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let images = dir.join("images");
    std::fs::create_dir_all(&images)?;
    image::RgbImage::new(16, 16).save(images.join("a.png"))?;
    std::fs::write(images.join("a.txt"), "a black square")?;
    let toml = dir.join("data.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [64, 64]\ncaption_extension = \".txt\"\nenable_bucket = true\n\
         [[datasets]]\nimage_directory = \"images\"\ncache_directory = \"cache\"\nnum_repeats = 2\n",
    )?;
    Ok(toml)
}

/// Caches `stem` for FLUX.1 with random latents [16, 1, h, w] and text outputs of the tiny model's widths.
pub(crate) fn cache_flux(
    dir: &Path,
    stem: &str,
    (h, w): (usize, usize),
    seed: u64,
) -> anyhow::Result<()> {
    let cfg = tiny_config()?;
    let rng = &mut StdRng::seed_from_u64(seed);
    let dev = &Device::Cpu;
    std::fs::create_dir_all(dir)?;
    let latents = randn(rng, (16, 1, h, w), 0.0, 1.0, dev)?;
    write_flux_latent_cache(
        &dir.join(flux_latent_cache_name(stem, (64, 64))),
        &latents,
        (64, 64),
    )?;
    let text = FluxTextCache {
        t5: randn(rng, (5, cfg.context_in_dim), 0.0, 1.0, dev)?,
        clip_l_pooler: randn(rng, cfg.vec_in_dim, 0.0, 1.0, dev)?,
        caption: format!("caption of {stem}"),
    };
    write_flux_text_cache(&dir.join(flux_text_cache_name(stem)), &text)?;
    Ok(())
}

#[test]
fn a_dataset_not_cached_for_flux_says_which_commands_cache_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = dataset(dir.path())?;
    let cfg = tiny_config()?;
    let cache = dir.path().join("cache");
    let message = || {
        load_flux_items(
            (&toml, Unreadable::Refuse),
            (&cfg, FluxVariant::Dev),
            &Device::Cpu,
        )
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default()
    };
    let err = message();
    assert!(err.contains("no FLUX.1 latent caches"), "{err}");
    assert!(
        err.contains("framesmith cache latents") && err.contains("framesmith cache text"),
        "{err}"
    );
    assert!(err.ends_with(&cache.display().to_string()), "{err}");

    // Wan caches of the same images are not FLUX.1 caches.
    std::fs::create_dir_all(&cache)?;
    std::fs::write(
        cache.join(image_latent_cache_name("a", (16, 16))),
        b"a Wan latent cache",
    )?;
    write_wan_text_cache(
        &cache.join(text_cache_name("a")),
        &Tensor::zeros((3, 32), DType::F32, &Device::Cpu)?,
        "a",
    )?;
    let err = message();
    assert!(err.contains("only Wan caches (*_wan.safetensors)"), "{err}");

    // A Wan text cache renamed as a FLUX.1 one is refused by its metadata.
    cache_flux(&cache, "a", (4, 4), 1)?;
    std::fs::copy(
        cache.join(text_cache_name("a")),
        cache.join(flux_text_cache_name("a")),
    )?;
    let err = message();
    assert!(err.contains("made for architecture wan, not flux"), "{err}");

    cache_flux(&cache, "a", (4, 4), 1)?;
    std::fs::remove_file(cache.join(flux_text_cache_name("a")))?;
    let err = message();
    assert!(
        err.starts_with("the captions are not cached for FLUX.1"),
        "{err}"
    );

    cache_flux(&cache, "a", (4, 4), 1)?;
    let items = load_flux_items(
        (&toml, Unreadable::Refuse),
        (&cfg, FluxVariant::Dev),
        &Device::Cpu,
    )?
    .items;
    assert_eq!(items.len(), 1);
    let (item, repeats) = &items[0];
    assert_eq!(*repeats, 2);
    assert_eq!(item.latents.dims(), [16, 1, 4, 4]);
    assert_eq!(
        item.clip.as_ref().map(|c| c.dims().to_vec()),
        Some(vec![cfg.vec_in_dim])
    );
    Ok(())
}

/// A FLUX.1 run in miniature: the tiny dev model, a LoRA on musubi-tuner's default targets, AdamW.
struct MiniRun {
    model: Flux,
    loras: LoraSet,
    optimizer: AdamW,
    set: TrainSet,
    timesteps: TimestepConfig,
}

const SEED: u64 = 42;

impl MiniRun {
    fn new(toml: &Path) -> anyhow::Result<Self> {
        let cfg = tiny_config()?;
        let weights = candle_core::safetensors::load(fixture_weights("flux_dit"), &Device::Cpu)?;
        let mut model = Flux::new(&cfg, &Vb::from_tensors(weights, DType::F32, &Device::Cpu))?;
        let spec = LoraSpec {
            rank: 4,
            alpha: 4.0,
            dtype: DType::F32,
            include_patterns: vec![],
            exclude_patterns: vec![],
            seed: SEED,
            kind: Default::default(),
        };
        let loras = attach_family_loras(model.linears_mut(), &spec, LoraFamily::Flux)?;
        let named = loras
            .iter()
            .flat_map(|(p, l)| {
                let l = l.as_lora().expect("a plain LoRA");
                [
                    (format!("{p}.lora_down"), l.down.clone()),
                    (format!("{p}.lora_up"), l.up.clone()),
                ]
            })
            .collect();
        let optimizer = AdamW::new(named, Default::default())?;
        let items = load_flux_items(
            (toml, Unreadable::Refuse),
            (&cfg, FluxVariant::Dev),
            &Device::Cpu,
        )?
        .items;
        let items = items.into_iter().map(|(item, _)| item).collect();
        Ok(Self {
            model,
            loras,
            optimizer,
            set: TrainSet::new(items, 2, 1, SEED)?,
            timesteps: TimestepConfig {
                sampling: TimestepSampling::FluxShift,
                ..TimestepConfig::default()
            },
        })
    }

    /// Optimizer step `index` (one micro-batch): its loss.
    fn step(&mut self, index: usize) -> anyhow::Result<f32> {
        let (_, batch) = self.set.batch_at(index);
        let rng = &mut StepRng::seeded(mix(SEED, index as u64));
        let (_, _, h, w) = batch[0].latents.dims4()?;
        let draws = sample_timesteps(&self.timesteps, batch.len(), (h, w), rng);
        let flux = flux_batch(&batch, &draws, rng, DType::F32)?;
        let target = LossTarget {
            targets: &flux.targets,
            weights: None,
            skip_frames: 0,
        };
        let vars = self.loras.vars();
        let out = try_checkpointed_step(
            &self.model,
            &flux.inputs,
            &target,
            &vars,
            &StepOptions::default(),
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        self.optimizer.step(&out.grads, 1e-3)?;
        Ok(out.loss)
    }

    fn lora_bits(&self) -> anyhow::Result<Vec<u32>> {
        let mut bits = Vec::new();
        for var in self.loras.vars() {
            bits.extend(framesmith_nn::testing::f32_bits(var.as_tensor())?);
        }
        Ok(bits)
    }
}

#[test]
fn a_flux_run_trains_saves_sd_scripts_keys_and_continues_bit_identically() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = dataset(dir.path())?;
    let cache = dir.path().join("cache");
    // Two buckets: 4×4 and 4×6 latents.
    cache_flux(&cache, "a", (4, 4), 1)?;
    cache_flux(&cache, "b", (4, 4), 2)?;
    cache_flux(&cache, "c", (4, 6), 3)?;

    let steps = 4;
    let mut run = MiniRun::new(&toml)?;
    let start = run.lora_bits()?;
    let mut losses = Vec::new();
    for i in 0..steps {
        losses.push(run.step(i)?);
    }
    assert!(
        losses.iter().all(|l| l.is_finite() && *l > 0.0),
        "{losses:?}"
    );
    assert_ne!(run.lora_bits()?, start, "the LoRA learnt");

    // The LoRA file: exactly sd-scripts' / musubi-tuner's default FLUX.1 modules of this model.
    let path = dir.path().join("flux_lora.safetensors");
    run.loras.save(&path, DType::F32, &HashMap::new())?;
    let written: BTreeSet<String> = candle_core::safetensors::load(&path, &Device::Cpu)?
        .into_keys()
        .collect();
    let expected: BTreeSet<String> = official_shapes(&tiny_config()?)
        .into_iter()
        .filter_map(|(name, shape)| {
            let module = name.strip_suffix(".weight")?;
            let block =
                module.starts_with("double_blocks.") || module.starts_with("single_blocks.");
            let modulation = module.ends_with("_mod.lin") || module.ends_with("modulation.lin");
            (block && !modulation && shape.len() == 2)
                .then(|| format!("lora_unet_{}", module.replace('.', "_")))
        })
        .flat_map(|m| ["lora_down.weight", "lora_up.weight", "alpha"].map(|s| format!("{m}.{s}")))
        .collect();
    assert_eq!(written, expected);

    // Stop after two steps, keep LoRA and optimizer state, continue in a fresh run: the same bits.
    let mut first = MiniRun::new(&toml)?;
    for i in 0..2 {
        first.step(i)?;
    }
    let lora = dir.path().join("state_lora.safetensors");
    first.loras.save(&lora, DType::F32, &HashMap::new())?;
    let moments: HashMap<String, Tensor> = first.optimizer.export_state()?.into_iter().collect();
    let mut resumed = MiniRun::new(&toml)?;
    resumed
        .loras
        .load_weights(&LoraFile::load(&lora, &Device::Cpu)?)?;
    resumed.optimizer.import_state(&moments)?;
    let mut resumed_losses = Vec::new();
    for i in 2..steps {
        resumed_losses.push(resumed.step(i)?);
    }
    assert_eq!(resumed_losses, losses[2..]);
    assert_eq!(resumed.lora_bits()?, run.lora_bits()?);
    Ok(())
}
