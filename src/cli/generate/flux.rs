//! `framesmith generate` with a FLUX.1 DiT: one PNG image from a prompt — FLUX.1 [dev] (or [schnell]) with its
//! LoRAs, CLIP-L and T5-XXL, the autoencoder. Every file is checked to be the component its flag names (and the
//! text encoders and autoencoder to fit the DiT) before anything loads; then the text encoders run and are dropped,
//! the autoencoder and the DiT load, and the engine samples ([`framesmith_engine::generate::flux`]).

use std::cell::RefCell;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use candle_core::Device;
use framesmith_engine::generate::flux::{
    check_companions, decode_image, denoise_image, encode_prompts, Companion, Companions,
    FluxImageSettings, FluxPrompt, DEV_GUIDANCE, DEV_T5_TOKENS,
};
use framesmith_models::flux::text_encoder::TextEncoderFiles;
use framesmith_models::flux::weights::{
    identify_expected, load_autoencoder, load_dit, FluxComponent, FluxFile, FluxKind, FluxVariant,
};
use framesmith_models::flux::FluxConfig;
use framesmith_models::identify::{identify, IdentifyError, ModelFile};
use framesmith_nn::device::{hold_vram_budget, VramUse};

use super::{loras_as_one, timing_line, GenerateArgs};
use crate::cli::models::{open_device, pick_dtype, progress_bar};
use framesmith_engine::generate::denoise::Solver;

/// Image side when --width / --height are not given (the official `cli.py`'s default).
const DEFAULT_SIDE: usize = 1024;
/// Sampling steps when --steps is not given: the official defaults.
const DEV_STEPS: usize = 50;
const SCHNELL_STEPS: usize = 4;
/// T5 tokens of schnell (256, as the official `load_t5` is called for it; dev takes [`DEV_T5_TOKENS`]).
const SCHNELL_T5_TOKENS: usize = 256;

/// Whether `path` is a FLUX.1 file of any kind (so `generate` goes the FLUX.1 way and names it if it is not the DiT).
pub(super) fn is_flux(path: &Path) -> bool {
    !path.is_dir()
        && matches!(
            identify(path),
            Ok(ModelFile::Flux(_)) | Err(IdentifyError::Flux(_))
        )
}

/// The Wan options given with a FLUX.1 DiT, by name.
fn wan_options(args: &GenerateArgs) -> Vec<&'static str> {
    [
        (args.dit_low_noise.is_some(), "--dit-low-noise"),
        (args.boundary.is_some(), "--boundary"),
        (!args.loras_low_noise.is_empty(), "--lora-low-noise"),
        (args.text_encoder.is_some(), "--text-encoder"),
        (args.image.is_some(), "--image"),
        (args.clip.is_some(), "--clip"),
        (args.negative.is_some(), "--negative"),
        (args.frames.is_some(), "--frames"),
        (args.shift.is_some(), "--shift"),
        (args.tiled, "--tiled"),
        (args.blocks_to_swap > 0, "--blocks-to-swap"),
        (
            args.solver.is_some_and(|s| s != Solver::Euler),
            "--solver (FLUX.1 samples with euler)",
        ),
    ]
    .into_iter()
    .filter_map(|(given, name)| given.then_some(name))
    .collect()
}

/// `identify_expected` with the flag the file was given to in the message.
fn expect(path: &Path, flag: &str, component: FluxComponent) -> anyhow::Result<FluxFile> {
    identify_expected(path, component, None).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
}

/// The DiT's sizes and variant; Kontext (which edits an input image) is refused.
fn dit_of(args: &GenerateArgs) -> anyhow::Result<(FluxVariant, FluxConfig)> {
    let file = expect(&args.dit, "--dit", FluxComponent::Dit)?;
    let FluxKind::Dit { variant, config } = file.kind else {
        anyhow::bail!("--dit holds no FLUX.1 DiT: {}", args.dit.display());
    };
    if variant == FluxVariant::Kontext {
        anyhow::bail!(
            "--dit is FLUX.1 Kontext [dev], which edits an input image; `framesmith generate` makes images from text \
             with FLUX.1 [dev] or [schnell]: pick flux1-dev.safetensors ({})",
            args.dit.display()
        );
    }
    Ok((variant, config))
}

/// Checks the autoencoder and the text encoders against the DiT ([`check_companions`]). Returns the CLIP-L and T5
/// paths.
fn check_files<'a>(
    args: &'a GenerateArgs,
    cfg: &FluxConfig,
) -> anyhow::Result<(&'a Path, &'a Path)> {
    let (Some(clip_l), Some(t5)) = (args.clip_l.as_deref(), args.t5.as_deref()) else {
        anyhow::bail!(
            "a FLUX.1 DiT needs both of its text encoders: --clip-l clip_l.safetensors and --t5 \
             t5xxl_fp16.safetensors (or t5xxl_fp8_e4m3fn_scaled.safetensors) ({})",
            args.dit.display()
        );
    };
    let files = Companions {
        autoencoder: Companion {
            key: "--vae",
            path: &args.vae,
        },
        clip_l: Companion {
            key: "--clip-l",
            path: clip_l,
        },
        t5: Companion {
            key: "--t5",
            path: t5,
        },
    };
    check_companions(&files, cfg)?;
    Ok((clip_l, t5))
}

/// `--out` must name a PNG; its folder is made.
fn check_out(out: &Path) -> anyhow::Result<()> {
    let png = out
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !png {
        anyhow::bail!(
            "--out: FLUX.1 makes an image, written as PNG: give a path ending in .png ({})",
            out.display()
        );
    }
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| {
            format!(
                "cannot create the folder for --out {}; pick a folder you can write to",
                out.display()
            )
        })?;
    }
    Ok(())
}

/// The prompt through CLIP-L and T5-XXL (dropped before returning, their memory given back).
fn encode_prompt(
    args: &GenerateArgs,
    (clip_l, t5): (&Path, &Path),
    t5_max_tokens: usize,
    (dtype, device): (candle_core::DType, &Device),
) -> anyhow::Result<FluxPrompt> {
    let files = TextEncoderFiles {
        clip: clip_l,
        clip_tokenizer: args.clip_l_tokenizer.as_deref(),
        t5,
        t5_tokenizer: args.tokenizer.as_deref(),
        t5_max_tokens,
    };
    encode_prompts(files, &[args.prompt.as_str()], (dtype, device))?
        .pop()
        .context("the text encoders returned no prompt")
}

/// Loads the DiT and attaches the LoRAs (several are combined into one adapter per layer).
fn load_dit_with_loras(
    args: &GenerateArgs,
    variant: FluxVariant,
    (dtype, device): (candle_core::DType, &Device),
) -> anyhow::Result<framesmith_models::flux::Flux> {
    let mut model = load_dit(&args.dit, Some(variant), dtype, device, args.fp8)?;
    eprintln!("DiT: {variant} ({})", args.dit.display());
    if let Some((lora, multiplier)) = loras_as_one(&args.loras, device)? {
        lora.apply(model.linears_mut(), multiplier, dtype)
            .context("the LoRA does not fit this FLUX.1 DiT (a LoRA made for another model?)")?;
    }
    Ok(model)
}

/// Runs `generate` with the FLUX.1 DiT `args.dit`.
pub(super) fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    let (variant, cfg) = dit_of(args)?;
    let wan = wan_options(args);
    if !wan.is_empty() {
        anyhow::bail!(
            "{} {} for Wan; a FLUX.1 DiT makes one image from --prompt with --vae, --clip-l and --t5: drop {} ({})",
            wan.join(", "),
            if wan.len() == 1 { "is" } else { "are" },
            if wan.len() == 1 { "it" } else { "them" },
            args.dit.display()
        );
    }
    let encoders = check_files(args, &cfg)?;
    check_out(&args.out)?;
    let schnell = variant == FluxVariant::Schnell;
    let mut settings = FluxImageSettings {
        width: args.width.unwrap_or(DEFAULT_SIDE),
        height: args.height.unwrap_or(DEFAULT_SIDE),
        steps: args
            .steps
            .unwrap_or(if schnell { SCHNELL_STEPS } else { DEV_STEPS }),
        guidance: args.guidance.unwrap_or(DEV_GUIDANCE),
        seed: 0,
    };
    // FLUX.1 runs on one device: two GPUs are for a Wan2.2 A14B pair, and refused here.
    let device = open_device(super::gpu_placement(&args.gpus, args.device, false)?.main)?;
    let dtype = pick_dtype(args.dtype, &device)?;
    // Before anything takes device memory: what the encoders, the autoencoder and the DiT take counts against it.
    let held = args
        .vram_budget()?
        .map(|b| hold_vram_budget(&device, b))
        .transpose()?;
    let ae = load_autoencoder(&args.vae, dtype, &device)?;
    let latent = settings.latent_size(ae.config().downsample_factor())?;
    let t5_tokens = if schnell {
        SCHNELL_T5_TOKENS
    } else {
        DEV_T5_TOKENS
    };
    let prompt = encode_prompt(args, encoders, t5_tokens, (dtype, &device))?;
    let dit = load_dit_with_loras(args, variant, (dtype, &device))?;
    settings.seed = args.seed.unwrap_or_else(rand::random);
    eprintln!(
        "seed {}, {}x{}, {} steps{}",
        settings.seed,
        settings.width,
        settings.height,
        settings.steps,
        if cfg.guidance_embed {
            format!(", guidance {}", settings.guidance)
        } else {
            String::new()
        }
    );
    let bar = progress_bar(
        settings.steps as u64,
        "{bar:30} {pos}/{len} steps  [{elapsed_precise} < {eta_precise}]",
    );
    // Polled once before each step: a progress tick, and the time each step starts (after the device has finished
    // the last one).
    let starts = RefCell::new(Vec::with_capacity(settings.steps + 1));
    let tick = || {
        let _ = device.synchronize();
        starts.borrow_mut().push(Instant::now());
        bar.inc(1);
        false
    };
    let z = denoise_image(&dit, &prompt, &settings, latent, dtype, &tick)?;
    device.synchronize()?;
    let denoised = Instant::now();
    bar.finish_and_clear();
    drop(dit);
    let image = decode_image(&ae, &z, dtype)?;
    let decode_secs = denoised.elapsed().as_secs_f64();
    let mut starts = starts.into_inner();
    starts.push(denoised);
    let held_back = held
        .as_ref()
        .and_then(Option::as_ref)
        .map_or(0, |h| h.bytes);
    eprintln!(
        "{}",
        timing_line(
            &starts,
            decode_secs,
            VramUse::measure(&device, held_back).as_slice()
        )
    );
    image
        .save(&args.out)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    println!(
        "wrote {} ({}x{})",
        args.out.display(),
        image.width(),
        image.height()
    );
    Ok(())
}
