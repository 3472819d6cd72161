//! Samples during FLUX.1 training on the CPU with the official code's tiny fixtures: a run with
//! `sample_every_n_steps` writes one PNG per prompt at the due steps, of each prompt's size, each the image
//! `flux::pipeline` makes from the saved LoRA with the same seed and prompt (bit for bit); Wan-only prompt options
//! and wrong files are refused by name; a streamed model samples the resident model's image, records no autograd
//! graph and trains on exactly as before.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::family::flux::pipeline::{
    decode_image, denoise_image, encode_prompts, FluxImageSettings, FluxPrompt, DEV_T5_TOKENS,
};
use crate::family::flux::plan::flux_streamed_blocks;
use crate::family::flux::run::tests::config as run_config;
use crate::family::flux::tests::streaming::{config, inputs, model, random_weights};
use crate::parity::Fixture;
use crate::train::step::{checkpointed_step, LossTarget, StepOptions};
use crate::train::tests::try_start;
use framesmith_config::protocol::Event;
use framesmith_config::run::FluxStreamOrder;
use framesmith_config::RunConfig;
use framesmith_models::flux::text_encoder::TextEncoderFiles;
use framesmith_models::flux::weights::{load_autoencoder, load_dit, FluxVariant};
use framesmith_nn::init::randn;
use framesmith_nn::lora_file::LoraFile;

const WORDS: [&str; 6] = ["thing", "a", "red", "fox", "in", "snow"];
const PROMPTS: &str = "# two images\na red fox in snow --w 24 --h 16 --s 3 --d 7 --l 2.5\nsnow --w 16 --h 16 --s 2 --d 8\n";

/// The tiny autoencoder and text encoders beside a FLUX.1 run in `dir`: (ae, clip_l, t5).
fn companions(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf, PathBuf)> {
    let ae = dir.join("ae.safetensors");
    std::fs::copy(
        framesmith_models::fixtures::case_dir("flux", "flux_ae").join("weights.safetensors"),
        &ae,
    )?;
    let (clip_l, t5) = framesmith_models::fixtures::flux_text_encoders(dir, &WORDS)?;
    Ok((ae, clip_l, t5))
}

/// A `steps`-long FLUX.1 run in `dir` sampling `prompts` every 2 steps.
fn sampled_run(dir: &Path, steps: usize, prompts: &str) -> anyhow::Result<RunConfig> {
    let mut config = run_config(dir, steps)?;
    let (ae, clip_l, t5) = companions(dir)?;
    config.model.vae = ae;
    config.model.clip = clip_l;
    config.model.text_encoder = t5;
    let file = dir.join("prompts.txt");
    std::fs::write(&file, prompts)?;
    config.sampling.prompts = Some(file);
    config.sampling.sample_every_n_steps = Some(2);
    // A LoRA that moves the image visibly within a few steps.
    config.optimizer.learning_rate = 5e-2;
    Ok(config)
}

/// The image `flux::pipeline` makes with the LoRA file `lora` for `prompt` at `settings` (as `framesmith generate`
/// does on the CPU: f32, the DiT and encoders from `config`'s files).
fn generated(
    config: &RunConfig,
    lora: Option<&Path>,
    prompt: &str,
    settings: &FluxImageSettings,
) -> anyhow::Result<image::RgbImage> {
    let dev = &Device::Cpu;
    let files = TextEncoderFiles {
        clip: &config.model.clip,
        clip_tokenizer: None,
        t5: &config.model.text_encoder,
        t5_tokenizer: None,
        t5_max_tokens: DEV_T5_TOKENS,
    };
    let encoded = encode_prompts(files, &[prompt], (DType::F32, dev))?.remove(0);
    let mut dit = load_dit(
        &config.model.dit,
        Some(FluxVariant::Dev),
        DType::F32,
        dev,
        None,
    )?;
    if let Some(lora) = lora {
        LoraFile::load(lora, dev)?.apply(dit.linears_mut(), 1.0, DType::F32)?;
    }
    let ae = load_autoencoder(&config.model.vae, DType::F32, dev)?;
    let latent = settings.latent_size(ae.config().downsample_factor())?;
    let z = denoise_image(&dit, &encoded, settings, latent, DType::F32, &|| false)?;
    decode_image(&ae, &z, DType::F32)
}

#[test]
fn a_flux_run_samples_pngs_on_schedule_that_generate_makes_from_its_lora() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = sampled_run(dir.path(), 4, PROMPTS)?;
    let mut trainer = try_start(&config, None)?;
    let mut events = Vec::new();
    while trainer.step() < 4 {
        trainer.train_step(&|| false)?;
        if trainer.sample_due() {
            events.extend(trainer.sample(&|| false)?);
        }
    }
    let samples = trainer.output_dir().join("samples");
    let mut seen = Vec::new();
    for event in &events {
        let Event::SampleReady {
            step,
            file,
            frames,
            prompt,
            controls,
        } = event
        else {
            panic!("not a sample: {event:?}");
        };
        assert_eq!(file, frames, "an image is its own frame");
        assert!(
            controls.is_empty(),
            "no prompt edits an image: {controls:?}"
        );
        seen.push((*step, file.clone(), prompt.clone()));
    }
    let expected: Vec<(usize, PathBuf, String)> = [2, 4]
        .into_iter()
        .flat_map(|step| {
            let samples = &samples;
            [(0, "a red fox in snow"), (1, "snow")]
                .into_iter()
                .map(move |(i, p)| {
                    (
                        step,
                        samples.join(format!("{step:06}-{i:02}.png")),
                        p.into(),
                    )
                })
        })
        .collect();
    assert_eq!(seen, expected);
    for (_, file, prompt) in &seen {
        let size = image::image_dimensions(file)?;
        let want = if prompt == "snow" { (16, 16) } else { (24, 16) };
        assert_eq!(size, want, "{}", file.display());
    }
    // Nothing else is written: no clip, no frames folder.
    assert_eq!(std::fs::read_dir(&samples)?.count(), 4);

    // The last sample is `generate`'s image from the LoRA saved at that step, with the prompt's seed and settings.
    let saved = trainer.save(true)?;
    let settings = FluxImageSettings {
        width: 24,
        height: 16,
        steps: 3,
        guidance: 2.5,
        seed: 7,
    };
    let want = generated(
        &config,
        Some(saved.loras[0].as_path()),
        "a red fox in snow",
        &settings,
    )?;
    let got = image::open(samples.join("000004-00.png"))?.to_rgb8();
    assert!(got == want, "the sample is not generate's image");
    let base = generated(&config, None, "a red fox in snow", &settings)?;
    assert!(got != base, "the sample does not show the LoRA");
    Ok(())
}

fn start_error(config: &RunConfig) -> String {
    try_start(config, None)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default()
}

#[test]
fn wan_prompt_options_and_wrong_files_are_refused_by_name() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let wan = sampled_run(dir.path(), 2, "a red fox --w 16 --h 16 --f 33 --n blurry\n")?;
    let err = start_error(&wan);
    for part in ["\"a red fox\"", "--f", "--n", "remove them", "prompts.txt"] {
        assert!(err.contains(part), "{part}: {err}");
    }

    let odd = sampled_run(dir.path(), 2, "a red fox --w 26 --h 16\n")?;
    let err = start_error(&odd);
    assert!(
        err.contains("--w 26") && err.contains("multiples of 4"),
        "{err}"
    );

    let mut swapped = sampled_run(dir.path(), 2, PROMPTS)?;
    swapped.model.clip = swapped.model.vae.clone();
    let err = start_error(&swapped);
    assert!(
        err.contains("model.clip: ") && err.contains("clip_l.safetensors"),
        "{err}"
    );

    let mut missing = sampled_run(dir.path(), 2, PROMPTS)?;
    missing.model.clip = PathBuf::new();
    let err = start_error(&missing);
    assert!(err.contains("`model.clip`: sampling needs CLIP-L"), "{err}");
    Ok(())
}

#[test]
fn a_streamed_model_samples_the_resident_image_and_trains_on_unchanged() -> anyhow::Result<()> {
    let fixture = Fixture::load(&framesmith_models::fixtures::case_dir("flux", "flux_dit"))?;
    let cfg = config(&fixture)?;
    let weights = random_weights(&cfg)?;
    let rng = &mut StdRng::seed_from_u64(3);
    let prompt = FluxPrompt {
        txt: randn(rng, (1, 5, cfg.context_in_dim), 0.0, 1.0, &Device::Cpu)?,
        vec: randn(rng, (1, cfg.vec_in_dim), 0.0, 1.0, &Device::Cpu)?,
        control: None,
    };
    let settings = FluxImageSettings {
        width: 24,
        height: 16,
        steps: 3,
        guidance: 3.5,
        seed: 5,
    };
    let latent = [8, 12];
    let (resident, resident_vars) = model(&cfg, &weights, None, &[])?;
    let want = denoise_image(&resident, &prompt, &settings, latent, DType::F32, &|| false)?;
    assert!(!want.track_op(), "sampling recorded an autograd graph");

    let inputs = inputs(&fixture)?;
    let (b, l, c) = inputs.img.dims3()?;
    let targets = (0..b)
        .map(|_| randn(rng, (l, c), 0.0, 1.0, &Device::Cpu))
        .collect::<candle_core::Result<Vec<Tensor>>>()?;
    let target = LossTarget {
        targets: &targets,
        weights: None,
        skip_frames: 0,
    };
    let options = StepOptions::default();
    let step = checkpointed_step(&resident, &inputs, &target, &resident_vars, &options)?;

    let streamed = flux_streamed_blocks(&cfg, 3, FluxStreamOrder::SingleFirst);
    let (m, vars) = model(&cfg, &weights, None, &streamed)?;
    // A training step, a sample, then the next step: each as without streaming.
    let before = checkpointed_step(&m, &inputs, &target, &vars, &options)?;
    let got = denoise_image(&m, &prompt, &settings, latent, DType::F32, &|| false)?;
    let diff = (&got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert_eq!(diff, 0.0, "the streamed sample differs by {diff}");
    let after = checkpointed_step(&m, &inputs, &target, &vars, &options)?;
    for out in [&before, &after] {
        assert_eq!(out.loss, step.loss);
        for (a, g) in step.grads.iter().zip(&out.grads) {
            assert_eq!((a - g)?.abs()?.max_all()?.to_scalar::<f32>()?, 0.0);
        }
    }
    Ok(())
}

#[test]
fn a_second_start_takes_the_prompts_from_the_cache_without_the_encoders() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = sampled_run(dir.path(), 2, PROMPTS)?;
    let files = TextEncoderFiles {
        clip: &config.model.clip,
        clip_tokenizer: None,
        t5: &config.model.text_encoder,
        t5_tokenizer: None,
        t5_max_tokens: DEV_T5_TOKENS,
    };
    let texts = ["a red fox in snow", "snow"];
    let out = &config.output.output_dir;
    let run = |logs: &mut Vec<String>| {
        super::cached_prompts(
            files,
            &texts,
            out,
            (DType::F32, &Device::Cpu),
            &mut |_, l| logs.push(l),
        )
    };
    let mut logs = Vec::new();
    let first = run(&mut logs)?;
    assert!(
        logs[0].contains("2 sample prompts encoded (0 from the prompt cache"),
        "{logs:?}"
    );
    logs.clear();
    let second = run(&mut logs)?;
    assert!(
        logs[0].contains("CLIP-L and T5-XXL were not loaded"),
        "{logs:?}"
    );
    let fresh = encode_prompts(files, &texts, (DType::F32, &Device::Cpu))?;
    for ((a, b), c) in first.iter().zip(&second).zip(&fresh) {
        for (x, y, z) in [(&a.txt, &b.txt, &c.txt), (&a.vec, &b.vec, &c.vec)] {
            let (x, y, z) = (
                x.flatten_all()?.to_vec1::<f32>()?,
                y.flatten_all()?.to_vec1::<f32>()?,
                z.flatten_all()?.to_vec1::<f32>()?,
            );
            assert!(x == y && y == z, "cached embeddings differ from fresh ones");
        }
    }
    Ok(())
}
