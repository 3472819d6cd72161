//! A FLUX.1 [dev] run from a run config on the CPU, through the same `Trainer` and engine calls as a Wan run:
//! `model.dit` is the tiny dev fixture (detected from the file), the dataset a musubi-tuner image dataset cached as
//! `_flux` caches. It trains with a finite loss, saves its LoRA under sd-scripts' FLUX.1 names with FLUX.1
//! metadata, and resumes bit-identically; schnell, a Wan cache and Wan-only settings are refused by name.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::train::tests::{all_lora_values, try_start};
use framesmith_config::run::{Checkpointing, TimestepSampling};
use framesmith_config::{presets, RunConfig};
use framesmith_models::flux::weights::official_shapes;
use framesmith_models::flux::FluxConfig;
use framesmith_nn::lora_file::LoraFile;

/// The tiny dev fixture DiT copied into `dir` as `name`.
pub(crate) fn dit(dir: &Path, case: &str, name: &str) -> anyhow::Result<PathBuf> {
    let from = framesmith_models::fixtures::case_dir("flux", case).join("weights.safetensors");
    let to = dir.join(name);
    std::fs::copy(from, &to)?;
    Ok(to)
}

/// A `steps`-long FLUX.1 run on three cached images (two buckets) in `dir`.
pub(crate) fn config(dir: &Path, steps: usize) -> anyhow::Result<RunConfig> {
    std::fs::create_dir_all(dir)?;
    let images = dir.join("images");
    std::fs::create_dir_all(&images)?;
    let toml = dir.join("data.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [64, 64]\ncaption_extension = \".txt\"\nenable_bucket = true\n\
         [[datasets]]\nimage_directory = \"images\"\ncache_directory = \"cache\"\nbatch_size = 2\n",
    )?;
    let cache = dir.join("cache");
    for (stem, hw, seed) in [("a", (4, 4), 1), ("b", (4, 4), 2), ("c", (4, 6), 3)] {
        image::RgbImage::new(16, 16).save(images.join(format!("{stem}.png")))?;
        std::fs::write(images.join(format!("{stem}.txt")), "a square")?;
        crate::family::flux::train::tests::cache_flux(&cache, stem, hw, seed)?;
    }
    let mut config = presets::builtin("demo-cpu")?
        .apply(&RunConfig::default())?
        .config;
    config.model.demo = false;
    config.model.dit = dit(dir, "flux_dit", "flux1-dev.safetensors")?;
    config.dataset.synthetic = false;
    config.dataset.config = toml;
    config.lora.rank = 4;
    config.lora.alpha = 4.0;
    config.training.max_train_steps = steps;
    config.training.timestep_sampling = TimestepSampling::FluxShift;
    config.optimizer.lr_warmup_steps = 0;
    config.memory.checkpointing = Checkpointing::Blocks;
    config.output.output_dir = dir.join("run");
    config.output.save_every_n_steps = Some(0);
    Ok(config)
}

#[test]
fn a_flux_run_config_trains_saves_and_resumes_bit_identically() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let steps = 4;
    let config_a = config(&dir.path().join("a"), steps)?;
    let mut straight = try_start(&config_a, None)?;
    assert_eq!(straight.total_steps(), steps);
    let start = all_lora_values(&straight)?;
    let mut losses = Vec::new();
    while straight.step() < steps {
        let report = straight.train_step(&|| false)?;
        let loss = report.loss.expect("a finite loss");
        assert!(loss.is_finite() && loss > 0.0, "{loss}");
        assert!(report.warning.is_none(), "{:?}", report.warning);
        losses.push(loss);
    }
    assert_ne!(all_lora_values(&straight)?, start, "the LoRA learnt");
    let saved = straight.save(true)?;
    let file = LoraFile::load(&saved.loras[0], &candle_core::Device::Cpu)?;
    let names: BTreeSet<String> = file.modules.iter().map(|m| m.name.clone()).collect();
    let cfg = FluxConfig::from_json(
        &serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(
            framesmith_models::fixtures::case_dir("flux", "flux_dit").join("config.json"),
        )?)?["init"]
            .to_string(),
    )?;
    let expected: BTreeSet<String> = official_shapes(&cfg)
        .into_iter()
        .filter_map(|(name, shape)| {
            let module = name.strip_suffix(".weight")?;
            let block =
                module.starts_with("double_blocks.") || module.starts_with("single_blocks.");
            let modulation = module.ends_with("_mod.lin") || module.ends_with("modulation.lin");
            (block && !modulation && shape.len() == 2)
                .then(|| format!("lora_unet_{}", module.replace('.', "_")))
        })
        .collect();
    assert_eq!(names, expected);
    let meta = |k: &str| file.metadata.get(k).map(String::as_str);
    assert_eq!(meta("ss_network_module"), Some("networks.lora_flux"));
    assert_eq!(meta("modelspec.architecture"), Some("flux-1-dev/lora"));
    assert_eq!(meta("ss_guidance_scale"), Some("1.0"));
    assert_eq!(meta("ss_timestep_sampling"), Some("flux_shift"));

    let config_b = config(&dir.path().join("b"), steps)?;
    let mut first = try_start(&config_b, None)?;
    let mut resumed = Vec::new();
    while first.step() < 2 {
        resumed.push(first.train_step(&|| false)?.loss.expect("finite"));
    }
    first.save(false)?;
    drop(first);
    let mut second = try_start(&config_b, Some(&dir.path().join("b").join("run")))?;
    assert_eq!(second.step(), 2);
    while second.step() < steps {
        resumed.push(second.train_step(&|| false)?.loss.expect("finite"));
    }
    assert_eq!(losses, resumed);
    assert_eq!(all_lora_values(&straight)?, all_lora_values(&second)?);
    Ok(())
}

fn start_error(config: &RunConfig) -> String {
    try_start(config, None)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default()
}

#[test]
fn wrong_files_and_wan_only_settings_are_refused_by_name() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let base = config(dir.path(), 2)?;

    let mut schnell = base.clone();
    schnell.model.dit = dit(dir.path(), "flux_dit_schnell", "flux1-schnell.safetensors")?;
    let err = start_error(&schnell);
    assert!(
        err.contains("FLUX.1 [schnell]") && err.contains("FLUX.1 [dev]"),
        "{err}"
    );
    assert!(
        err.ends_with(&schnell.model.dit.display().to_string()),
        "{err}"
    );

    let mut kontext = base.clone();
    kontext.model.dit = dit(dir.path(), "flux_dit", "flux1-kontext-dev.safetensors")?;
    let err = start_error(&kontext);
    assert!(err.contains("FLUX.1 Kontext [dev]"), "{err}");

    let mut diffusers = base.clone();
    diffusers.model.dit = dir.path().join("diffusion_pytorch_model.safetensors");
    let z = candle_core::Tensor::zeros((4, 4), candle_core::DType::F32, &candle_core::Device::Cpu)?;
    let names = [
        "transformer_blocks.0.attn.to_q.weight",
        "single_transformer_blocks.0.attn.to_q.weight",
    ];
    let tensors: std::collections::HashMap<String, candle_core::Tensor> =
        names.iter().map(|n| (n.to_string(), z.clone())).collect();
    candle_core::safetensors::save(&tensors, &diffusers.model.dit)?;
    let err = start_error(&diffusers);
    assert!(
        err.contains("FLUX.1 transformer in diffusers format"),
        "{err}"
    );

    let mut sampled = base.clone();
    sampled.model.variant = "t2v-1.3b".into();
    let err = start_error(&sampled);
    assert!(
        err.contains("`model.variant`: names the Wan variant `t2v-1.3b`"),
        "{err}"
    );

    // Only Wan caches in the cache directory.
    let cache = dir.path().join("cache");
    for entry in std::fs::read_dir(&cache)? {
        std::fs::remove_file(entry?.path())?;
    }
    std::fs::write(cache.join("a_0016x0016_wan.safetensors"), b"a Wan cache")?;
    let err = start_error(&base);
    assert!(err.contains("only Wan caches (*_wan.safetensors)"), "{err}");
    assert!(
        err.contains("framesmith cache latents") && err.ends_with(&cache.display().to_string()),
        "{err}"
    );
    Ok(())
}
