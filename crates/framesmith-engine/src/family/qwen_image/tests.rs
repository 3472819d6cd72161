//! Qwen-Image on the CPU with the tiny model (`testkit`): images and captions cache through the VAE and the
//! text-encoder seam (a stand-in encoder) under musubi-tuner's names, a fixed batch learns, a run config trains
//! through the same `Trainer` as every family, saves a LoRA with musubi-tuner's Qwen-Image metadata and resumes
//! bit-identically, samples encode their prompts once (then come from the prompt cache), and `generate` writes a
//! PNG with true CFG.

mod edit;
mod edit_text;

use std::path::{Path, PathBuf};

use crate::train::noise::StepRng;
use candle_core::{DType, Device};

use super::encoder::{EditPromptEncoder, EncoderFiles, EncoderLoaders, PromptEncoder, WordEncoder};
use super::prep::{cache_qwen_latents, cache_qwen_text, CaptionEncoder, QwenLatentEncoder};
use super::setup::start_run_with;
use super::testkit::{dataset, stand_ins, tiny_config, tiny_dit, tiny_vae};
use super::train::{load_qwen_items, qwen_batch};
use crate::family::testkit::run::{
    assert_a_fixed_batch_learns, assert_family_named, assert_trains_and_resumes, cached_run_config,
    fixed_draws, tiny_lora_spec,
};
use crate::generate::request::{DitSource, GenerationRequest};
use crate::generate::run::Session;
use crate::prep::CacheOptions;
use crate::train::optimizer::AdamW;
use crate::train::tests::try_start;
use framesmith_config::run::TimestepSampling;
use framesmith_config::validate::validate_for;
use framesmith_config::{HostInfo, ModelFamily, RunConfig};
use framesmith_data::Unreadable;
use framesmith_models::qwen25vl::EditPipeline;
use framesmith_models::qwen_image::vae::load_vae;
use framesmith_models::qwen_image::weights::load_dit;
use framesmith_nn::lora::{attach_family_loras, LoraFamily};
use framesmith_nn::lora_file::LoraFile;

/// A dataset in `dir` cached for Qwen-Image through the tiny VAE and the stand-in encoder; returns its TOML.
fn cached_dataset(dir: &Path, batch_size: usize) -> anyhow::Result<PathBuf> {
    let toml = dataset(dir, batch_size)?;
    let valid = framesmith_data::load_valid(&toml)?;
    let vae = load_vae(&tiny_vae(dir)?, DType::F32, &Device::Cpu)?;
    let encoder = QwenLatentEncoder {
        vae: &vae,
        device: Device::Cpu,
        dtype: DType::F32,
    };
    let options = CacheOptions::default();
    let latents = cache_qwen_latents(&valid, &encoder, &options, &mut ())?;
    assert_eq!(latents.written, 3, "{latents:?}");
    let text = WordEncoder {
        dim: tiny_config().joint_attention_dim,
    };
    let captions = cache_qwen_text(
        &valid,
        CaptionEncoder::Text(&text),
        DType::F32,
        &options,
        &mut (),
    )?;
    assert_eq!(captions.written, 3, "{captions:?}");
    Ok(toml)
}

#[test]
fn images_and_captions_cache_under_musubi_names_and_a_fixed_batch_learns() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = cached_dataset(dir.path(), 1)?;
    let cache = dir.path().join("cache");
    for name in ["a_0032x0032_qi.safetensors", "c_qi_te.safetensors"] {
        assert!(cache.join(name).is_file(), "{name}");
    }
    // A second pass finds every cache in place.
    let valid = framesmith_data::load_valid(&toml)?;
    let text = WordEncoder { dim: 24 };
    let again = cache_qwen_text(
        &valid,
        CaptionEncoder::Text(&text),
        DType::F32,
        &CacheOptions::default(),
        &mut (),
    )?;
    assert_eq!((again.written, again.skipped), (0, 3));

    let cfg = tiny_config();
    let items = load_qwen_items((&toml, Unreadable::Refuse), &cfg, &Device::Cpu)?.items;
    assert_eq!(items.len(), 3);
    let c = items
        .iter()
        .find(|(i, _)| i.key.starts_with("c_"))
        .map(|(i, _)| i);
    let c = c.ok_or_else(|| anyhow::anyhow!("no item c"))?;
    assert_eq!(c.latents.dims(), &[16, 1, 4, 4]);
    assert_eq!(c.context.dims(), &[6, 24], "six words of the caption");

    let dit_dir = dir.path().join("dit");
    let mut model = load_dit(&tiny_dit(&dit_dir)?, DType::F32, &Device::Cpu, None)?;
    let loras = attach_family_loras(
        model.linears_mut(),
        &tiny_lora_spec(),
        LoraFamily::QwenImage,
    )?;
    let named = crate::train::setup::named_vars(&loras);
    let mut optimizer = AdamW::new(named, Default::default())?;
    let batch: Vec<_> = items.iter().map(|(i, _)| i).collect();
    let draws = fixed_draws(batch.len(), 0.6, 601.0);
    assert_a_fixed_batch_learns(&model, &loras, &mut optimizer, || {
        // The same noise every step: the loss of one fixed batch.
        let b = qwen_batch(&batch, &draws, &mut StepRng::seeded(9), DType::F32)?;
        assert_eq!(b.inputs.txt_lens.as_deref(), Some(&[3, 3, 6][..]));
        Ok((b.inputs, b.targets))
    })
}

/// A `steps`-long Qwen-Image run on the cached tiny dataset in `dir`.
fn config(dir: &Path, steps: usize) -> anyhow::Result<RunConfig> {
    std::fs::create_dir_all(dir)?;
    let toml = cached_dataset(dir, 2)?;
    let files = (tiny_dit(dir)?, toml);
    cached_run_config(dir, files, steps, TimestepSampling::QwenShift)
}

#[test]
fn a_qwen_image_run_config_trains_saves_musubi_metadata_and_resumes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let steps = 4;
    let config_a = config(&dir.path().join("a"), steps)?;
    assert_family_named(&config_a, "Qwen-Image");
    let config_b = config(&dir.path().join("b"), steps)?;
    let (_, lora) = assert_trains_and_resumes(&config_a, &config_b, steps)?;
    let file = LoraFile::load(&lora, &Device::Cpu)?;
    assert!(
        file.modules
            .iter()
            .all(|m| m.name.starts_with("lora_unet_transformer_blocks_")),
        "musubi-tuner's module names"
    );
    let meta = |k: &str| file.metadata.get(k).map(String::as_str);
    assert_eq!(meta("ss_network_module"), Some("networks.lora_qwen_image"));
    assert_eq!(meta("ss_base_model_version"), Some("qwen_image"));
    assert_eq!(meta("modelspec.architecture"), Some("Qwen-Image/lora"));
    assert_eq!(meta("ss_timestep_sampling"), Some("qwen_shift"));

    Ok(())
}

#[test]
fn generate_writes_a_png_with_true_cfg_and_refuses_other_families_options() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let dit = tiny_dit(dir.path())?;
    let mut request = GenerationRequest::new(
        DitSource::File(dit.clone()),
        "a red square",
        dir.path().join("out/red.png"),
    );
    request.files.vae = Some(tiny_vae(dir.path())?);
    request.files.text_encoder = Some(dit.clone());
    request.negative = Some("blurry".into());
    (request.width, request.height, request.steps, request.seed) =
        (Some(32), Some(48), Some(2), Some(7));
    request.placement.device = framesmith_config::run::DeviceSpec::Cpu;
    let lines = std::cell::RefCell::new(Vec::new());
    let mut events = |e| lines.borrow_mut().push(format!("{e:?}"));
    let mut session = Session::new(&mut events, &|| false);
    let out = super::generate::generate_with(&request, &mut session, stand_ins())?;
    assert_eq!((out.width, out.height, out.seed), (32, 48, 7));
    let png = image::open(&out.file)?;
    assert_eq!((png.width(), png.height()), (32, 48));
    assert!(
        lines
            .borrow()
            .iter()
            .any(|l: &String| l.contains("true CFG 4")),
        "{lines:?}"
    );

    request.frames = Some(9);
    let err = super::generate::generate_with(&request, &mut session, stand_ins())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("--frames") && err.contains("drop it"), "{err}");
    // The real loader names a file that is not Qwen2.5-VL, and what to pick instead.
    request.frames = None;
    let err = super::generate::generate(&request, &mut session)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(
        err.contains("qwen_2.5_vl_7b.safetensors") && err.contains(&dit.display().to_string()),
        "{err}"
    );
    Ok(())
}

#[test]
fn samples_encode_once_through_the_seam_and_come_from_the_prompt_cache_after() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let mut config = config(dir.path(), 2)?;
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(
        &prompts,
        "a red square --w 32 --h 32 --s 2 --d 5\na blue square --n red --l 3 --w 48 --h 32 --s 2\n",
    )?;
    config.sampling.prompts = Some(prompts);
    config.sampling.sample_every_n_steps = Some(1);
    config.model.vae = tiny_vae(dir.path())?;
    config.model.text_encoder = config.model.dit.clone();
    let plan = validate_for(&config, &HostInfo::cpu_only(), ModelFamily::QwenImage)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut lines = Vec::new();
    let mut parts = start_run_with(&plan, &config.model.dit, stand_ins(), &mut |_, l| {
        lines.push(l)
    })?;
    assert_eq!(parts.family.sample_count(), 2);
    assert_eq!(parts.family.sample_prompt(1), "a blue square");
    let out = dir.path().join("samples");
    std::fs::create_dir_all(&out)?;
    let files = parts.family.sample(1, &out, "000001-01", &|| false)?;
    let png = image::open(&files.file)?;
    assert_eq!((png.width(), png.height()), (48, 32));
    assert!(
        lines.iter().any(|l| l.contains("4 sample prompts encoded")),
        "{lines:?}"
    );
    // A second start finds the four texts (two prompts, "red" and the default " " negative) in the cache.
    let refuse =
        |_: EncoderFiles<'_>, _: DType, _: &Device| -> anyhow::Result<Box<dyn PromptEncoder>> {
            anyhow::bail!("the encoder was loaded")
        };
    let refuse_edit = |_: EncoderFiles<'_>,
                       _: EditPipeline,
                       _: DType,
                       _: &Device|
     -> anyhow::Result<Box<dyn EditPromptEncoder>> {
        anyhow::bail!("the edit encoder was loaded")
    };
    let refusing = EncoderLoaders {
        text: &refuse,
        edit: &refuse_edit,
    };
    let mut again = Vec::new();
    start_run_with(&plan, &config.model.dit, refusing, &mut |_, l| {
        again.push(l)
    })?;
    assert!(
        again
            .iter()
            .any(|l| l.contains("the text encoder was not loaded")),
        "{again:?}"
    );
    Ok(())
}

#[test]
fn a_run_validates_on_held_out_items_and_plans_from_its_caches() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut config = config(dir.path(), 2)?;
    config.validation.validate_every_n_steps = Some(1);
    config.validation.validation_split = 0.34;
    let mut trainer = try_start(&config, None)?;
    trainer.train_step(&|| false)?;
    let first = trainer
        .validate(&|| false)?
        .ok_or_else(|| anyhow::anyhow!("no validation"))?;
    assert_eq!(first.items, 1, "one of three items held out");
    assert!(first.loss.is_finite() && first.loss > 0.0, "{first:?}");
    // The same LoRA, the same held-out noise: the same loss.
    let again = trainer
        .validate(&|| false)?
        .ok_or_else(|| anyhow::anyhow!("no validation"))?;
    assert_eq!(first.loss, again.loss);

    let valid = framesmith_data::load_valid(&config.dataset.config)?;
    let clip = crate::family::largest_cached_clip(&valid, false);
    assert_eq!(
        clip.map(|c| (c.width, c.height, c.frames, c.batch)),
        Some((32, 32, 1, 2))
    );
    Ok(())
}

#[test]
fn cache_passes_go_to_qwen_image_by_their_files() -> anyhow::Result<()> {
    use crate::prep::pass::{CachePass, LatentFiles, TextFiles};
    let dir = tempfile::tempdir()?;
    let dit = tiny_dit(dir.path())?;
    let vae = tiny_vae(dir.path())?;
    let family = |pass: &CachePass| crate::family::family_of_cache(pass).name();
    // ComfyUI's VAE has Wan 2.1's names: the DiT says the pass is Qwen-Image's.
    let latents = |dit: Option<PathBuf>| {
        CachePass::Latents(LatentFiles {
            vae: vae.clone(),
            dit,
            ..LatentFiles::default()
        })
    };
    assert_eq!(family(&latents(Some(dit))), "Qwen-Image");
    assert_eq!(family(&latents(None)), "Wan");
    let te = dir.path().join("qwen_2.5_vl_7b.safetensors");
    let embedding = candle_core::Tensor::zeros((4, 3584), DType::BF16, &Device::Cpu)?;
    candle_core::safetensors::save(
        &std::collections::HashMap::from([("model.embed_tokens.weight".to_string(), embedding)]),
        &te,
    )?;
    let text = CachePass::Text(TextFiles {
        text_encoder: Some(te),
        ..TextFiles::default()
    });
    assert_eq!(family(&text), "Qwen-Image");
    Ok(())
}
