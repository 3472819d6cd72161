//! `framesmith generate`: one clip from a prompt with a Wan DiT, its LoRAs (and, for Wan2.2 A14B, the low-noise
//! expert), the umT5 text encoder and the Wan VAE; or, when `--dit` is a FLUX.1 DiT, one PNG image ([`flux`]).
//! Models are loaded one after the other and the text encoder is dropped before the DiT loads, so peak memory is
//! the DiT's plus the VAE's.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device};
use clap::Args;
use framesmith_config::run::DeviceSpec;
use framesmith_engine::dit::load_dit;
use framesmith_engine::generate::denoise::{Experts, ImageConditioning, Residency, Solver};
use framesmith_engine::generate::pipeline::{
    combine_loras, denoise_clip, latent_shape, write_clip, ClipSettings, Conditioning, VaeDecoder,
    CLIP_FPS,
};
use framesmith_engine::generate::start_image::{
    check_image_use, default_max_area, image_conditioning, load_start_image, official_size,
    StartImageError,
};
use framesmith_engine::plan::vae_for;
use framesmith_models::wan::clip::{load_clip_vision, ClipVisionConfig};
use framesmith_models::wan::text_encoder::TextEncoder;
use framesmith_models::wan::vae::{load_vae_auto, LatentStats, TileConfig};
use framesmith_models::wan::{weights, ModelOptions, ModelType, WanConfig, WanModel};
use framesmith_nn::device::{hold_vram_budget, VramHold, VramUse};
use framesmith_nn::fp8::Fp8Scale;
use framesmith_nn::lora_file::LoraFile;
use framesmith_nn::offload::{
    release_cached_memory, streamed_blocks, OffloadOptions, StreamPlacement,
};
use image::RgbImage;

use super::models::{open_device, pick_dtype, progress_bar, DtypeArg};

mod flux;

/// `--solver`: the engine's solver names, listed in `--help` and checked by clap.
fn solver_parser() -> impl clap::builder::TypedValueParser<Value = Solver> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Solver::NAMES).try_map(|name| name.parse::<Solver>())
}

/// `--fp8`: nn's FP8 scale names, listed in `--help` and checked by clap.
fn fp8_parser() -> impl clap::builder::TypedValueParser<Value = Fp8Scale> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Fp8Scale::NAMES)
        .try_map(|name| name.parse::<Fp8Scale>())
}

/// `generate` options.
#[derive(Args)]
pub struct GenerateArgs {
    /// DiT checkpoint (file or folder); for Wan2.2 A14B the high-noise expert. A FLUX.1 DiT
    /// (flux1-dev.safetensors) makes an image: give --vae ae.safetensors, --clip-l, --t5 and a .png --out
    #[arg(long)]
    dit: PathBuf,
    /// Wan2.2 A14B low-noise expert (denoises below the boundary)
    #[arg(long)]
    dit_low_noise: Option<PathBuf>,
    /// Switch to the low-noise expert below this fraction of the timesteps (default: the model's; 0.875 T2V, 0.9 I2V)
    #[arg(long, allow_negative_numbers = true)]
    boundary: Option<f64>,
    /// LoRA for the DiT, FILE or FILE:MULTIPLIER; repeat for several
    #[arg(long = "lora", value_name = "FILE[:MULT]")]
    loras: Vec<String>,
    /// LoRA for the low-noise expert, FILE or FILE:MULTIPLIER; repeat for several
    #[arg(long = "lora-low-noise", value_name = "FILE[:MULT]")]
    loras_low_noise: Vec<String>,
    /// umT5 weights (models_t5_umt5-xxl-enc-bf16.pth or a ComfyUI umt5_xxl .safetensors); Wan only
    #[arg(long)]
    text_encoder: Option<PathBuf>,
    /// tokenizer.json or spiece.model of google/umt5-xxl (default: one beside the text encoder weights, else the
    /// tokenizer inside ComfyUI's umt5_xxl .safetensors); for FLUX.1, the tokenizer.json of google/t5-v1_1-xxl
    /// (default: one beside the --t5 weights)
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// FLUX.1: the T5-XXL weights (t5xxl_fp16.safetensors or t5xxl_fp8_e4m3fn_scaled.safetensors)
    #[arg(long)]
    t5: Option<PathBuf>,
    /// FLUX.1: the CLIP-L weights (clip_l.safetensors)
    #[arg(long)]
    clip_l: Option<PathBuf>,
    /// FLUX.1: CLIP-L's tokenizer.json (default: one beside clip_l.safetensors)
    #[arg(long)]
    clip_l_tokenizer: Option<PathBuf>,
    /// Wan VAE weights, or FLUX.1's autoencoder (ae.safetensors)
    #[arg(long)]
    vae: PathBuf,
    /// Start image (PNG, JPEG, WebP, BMP) for image-to-video models (Wan2.1 I2V, Wan2.2 I2V-A14B, TI2V-5B);
    /// centre-cropped to the clip's aspect ratio
    #[arg(long)]
    image: Option<PathBuf>,
    /// CLIP image encoder for Wan2.1 I2V (models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth or ComfyUI's
    /// clip_vision_h.safetensors)
    #[arg(long)]
    clip: Option<PathBuf>,
    /// What the clip shows
    #[arg(long)]
    prompt: String,
    /// Negative prompt (default: the official Wan one, used when --guidance > 1)
    #[arg(long)]
    negative: Option<String>,
    /// Clip width (default 832; with --image and no size given, the official size for the image's aspect ratio;
    /// FLUX.1: 1024, a multiple of 16)
    #[arg(long)]
    width: Option<usize>,
    /// Clip height (default 480; see --width; FLUX.1: 1024)
    #[arg(long)]
    height: Option<usize>,
    /// Frames, 4k + 1 (default 81)
    #[arg(long)]
    frames: Option<usize>,
    /// Sampling steps (default 50; FLUX.1 [schnell] 4)
    #[arg(long)]
    steps: Option<usize>,
    /// Flow shift of the sampling schedule (default 5; FLUX.1 shifts by the image size)
    #[arg(long, allow_negative_numbers = true)]
    shift: Option<f64>,
    /// Classifier-free guidance scale, 1 turns it off (default 5); for FLUX.1 [dev] the distilled guidance
    /// strength the model takes (default 3.5)
    #[arg(long, allow_negative_numbers = true)]
    guidance: Option<f64>,
    /// Noise seed (default: random, printed)
    #[arg(long)]
    seed: Option<u64>,
    /// Solver (default unipc; FLUX.1 samples with euler)
    #[arg(long, value_parser = solver_parser())]
    solver: Option<Solver>,
    /// auto, cpu, cuda or cuda:N
    #[arg(long, default_value = "auto")]
    device: DeviceSpec,
    /// CUDA GPUs to run on, instead of --device: one (`--gpus 1`, as --device cuda:1), or for Wan2.2 A14B two
    /// (`--gpus 0,1`): the high-noise expert on the first, the low-noise expert on the second, both resident
    /// (nothing parked in RAM; --vram-budget-gb and --blocks-to-swap then apply to each card)
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "IDS",
        conflicts_with = "device"
    )]
    gpus: Vec<usize>,
    /// Compute dtype (default: bf16 on a GPU, f32 on the CPU)
    #[arg(long, value_enum)]
    dtype: Option<DtypeArg>,
    /// Keep the DiT's block weights in FP8 with these scales (about half the memory of bf16)
    #[arg(long, value_parser = fp8_parser())]
    fp8: Option<Fp8Scale>,
    /// Decode in overlapping spatial tiles (less memory for large frames; approximate)
    #[arg(long)]
    tiled: bool,
    /// Blocks of each DiT kept in RAM and streamed to the GPU as they run (block swap), for cards too small for
    /// the whole model; with two experts on one GPU, the one not in use waits in RAM either way (Wan)
    #[arg(long, default_value_t = 0)]
    blocks_to_swap: usize,
    /// Use at most this many GiB of the card (the rest is held back for the command's lifetime), so a run that
    /// fits here fits a card of that size; with --gpus 0,1, of each card
    #[arg(long)]
    vram_budget_gb: Option<f64>,
    /// The MP4 to write; PNG frames go to a `<name>_frames` folder beside it. FLUX.1: the PNG to write
    #[arg(long)]
    out: PathBuf,
}

/// Wan's defaults for the options FLUX.1 fills in otherwise.
const WAN_FRAMES: usize = 81;
const WAN_STEPS: usize = 50;
const WAN_SHIFT: f64 = 5.0;
const WAN_GUIDANCE: f64 = 5.0;

impl GenerateArgs {
    fn frames(&self) -> usize {
        self.frames.unwrap_or(WAN_FRAMES)
    }

    fn steps(&self) -> usize {
        self.steps.unwrap_or(WAN_STEPS)
    }

    fn shift(&self) -> f64 {
        self.shift.unwrap_or(WAN_SHIFT)
    }

    fn guidance(&self) -> f64 {
        self.guidance.unwrap_or(WAN_GUIDANCE)
    }

    fn solver(&self) -> Solver {
        self.solver.unwrap_or(Solver::Unipc)
    }

    /// The umT5 weights, which a Wan DiT needs.
    fn text_encoder(&self) -> anyhow::Result<&Path> {
        self.text_encoder.as_deref().ok_or_else(|| {
            anyhow::anyhow!(
                "a Wan DiT needs --text-encoder: the umT5 weights (models_t5_umt5-xxl-enc-bf16.pth or a ComfyUI \
                 umt5_xxl .safetensors) ({})",
                self.dit.display()
            )
        })
    }

    /// `--vram-budget-gb` in bytes.
    fn vram_budget(&self) -> anyhow::Result<Option<u64>> {
        Ok(match self.vram_budget_gb {
            Some(gb) if gb.is_finite() && gb > 0.0 => Some((gb * (1u64 << 30) as f64) as u64),
            Some(gb) => anyhow::bail!("--vram-budget-gb {gb}: give a positive number of GiB"),
            None => None,
        })
    }

    /// Where this command runs ([`gpu_placement`] of `--gpus`, `--device` and whether a low-noise expert is given).
    fn placement(&self) -> anyhow::Result<GpuPlacement> {
        gpu_placement(&self.gpus, self.device, self.dit_low_noise.is_some())
    }

    /// FLUX.1 options given to a Wan DiT, by name.
    fn flux_options(&self) -> Vec<&'static str> {
        [
            (self.t5.is_some(), "--t5"),
            (self.clip_l.is_some(), "--clip-l"),
            (self.clip_l_tokenizer.is_some(), "--clip-l-tokenizer"),
        ]
        .into_iter()
        .filter_map(|(given, name)| given.then_some(name))
        .collect()
    }
}

/// Where `generate` runs: the device of the text encoder, the VAE and the DiT (of a Wan2.2 A14B pair, the
/// high-noise expert), and, for a pair over two GPUs, the low-noise expert's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct GpuPlacement {
    main: DeviceSpec,
    low_noise: Option<DeviceSpec>,
}

/// The placement `--gpus` asks for (else `--device`'s): one GPU runs everything; two split a Wan2.2 A14B pair
/// (`pair`), the high-noise expert on the first and the low-noise one on the second. Two GPUs for one DiT, the
/// same GPU twice, or more than two are errors that say what to give instead.
fn gpu_placement(gpus: &[usize], device: DeviceSpec, pair: bool) -> anyhow::Result<GpuPlacement> {
    let list = gpus
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    match *gpus {
        [] => Ok(GpuPlacement {
            main: device,
            low_noise: None,
        }),
        [one] => Ok(GpuPlacement {
            main: DeviceSpec::Cuda(one),
            low_noise: None,
        }),
        [first, second] if first == second => anyhow::bail!(
            "--gpus {list} names GPU {first} twice: give two different GPUs (e.g. --gpus 0,1) to put one Wan2.2 \
             A14B expert on each, or one (--gpus {first}) to run on it alone"
        ),
        [first, _] if !pair => anyhow::bail!(
            "--gpus {list}: only Wan2.2 A14B (--dit with --dit-low-noise) splits over two GPUs, one expert on \
             each; this DiT runs on one GPU: give --gpus {first}"
        ),
        [first, second] => Ok(GpuPlacement {
            main: DeviceSpec::Cuda(first),
            low_noise: Some(DeviceSpec::Cuda(second)),
        }),
        _ => anyhow::bail!(
            "--gpus {list}: generation uses at most two GPUs (Wan2.2 A14B: the high-noise expert on the first, the \
             low-noise expert on the second); give one or two"
        ),
    }
}

/// `FILE` or `FILE:MULT` (the multiplier only when what follows the last `:` is a number, so `C:\x` stays a path).
pub fn parse_lora(spec: &str) -> (PathBuf, f64) {
    match spec.rsplit_once(':') {
        Some((path, mult)) if !path.is_empty() => match mult.parse::<f64>() {
            Ok(m) => (PathBuf::from(path), m),
            Err(_) => (PathBuf::from(spec), 1.0),
        },
        _ => (PathBuf::from(spec), 1.0),
    }
}

/// Loads a DiT and attaches its LoRAs (several are combined into one adapter per layer).
fn load_dit_with_loras(
    path: &Path,
    expected: Option<&WanConfig>,
    loras: &[String],
    args: &GenerateArgs,
    (dtype, device): (DType, &Device),
) -> anyhow::Result<WanModel> {
    let options = ModelOptions {
        residual_dtype: DType::F32,
        blocks_fp8: args.fp8,
        fp8_products: false,
    };
    let swap = args.blocks_to_swap;
    let mut model = load_dit(path, expected, (dtype, device), &options, |cfg, name| {
        eprintln!("DiT: {name} ({})", path.display());
        if swap == 0 {
            return Ok(None);
        }
        if swap >= cfg.num_layers {
            anyhow::bail!(
                "--blocks-to-swap {swap}: this DiT has {} blocks; stream at most {}",
                cfg.num_layers,
                cfg.num_layers - 1
            );
        }
        let streamed = streamed_blocks(cfg.num_layers, swap, StreamPlacement::Spread);
        Ok(Some((streamed, OffloadOptions::default())))
    })?
    .model;
    if let Some((lora, multiplier)) = loras_as_one(loras, device)? {
        lora.apply(model.linears_mut(), multiplier, dtype)
            .context("the LoRA does not fit this DiT")?;
    }
    Ok(model)
}

/// The `--lora FILE[:MULT]` adapters loaded on `device` as one, with the multiplier to apply it at: one file as
/// it is, several combined into one adapter per layer (their multipliers inside it). `None` when there are none.
fn loras_as_one(specs: &[String], device: &Device) -> anyhow::Result<Option<(LoraFile, f64)>> {
    if specs.is_empty() {
        return Ok(None);
    }
    let files = specs
        .iter()
        .map(|spec| {
            let (file, multiplier) = parse_lora(spec);
            eprintln!("LoRA: {} × {multiplier}", file.display());
            Ok((LoraFile::load(&file, device)?, multiplier))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Some(match files.as_slice() {
        [(one, m)] => (one.clone(), *m),
        _ => (combine_loras(&files)?, 1.0),
    }))
}

/// `cfg` (a DiT file's configuration) read as a Wan2.2 expert: Wan 2.2, with its task's official boundary when
/// the file gives none. The shapes stay the file's.
fn a14b_expert(cfg: &WanConfig) -> WanConfig {
    let official = match cfg.model_type {
        ModelType::I2v => WanConfig::wan22_i2v_a14b(),
        _ => WanConfig::wan22_t2v_a14b(),
    };
    WanConfig {
        generation: official.generation,
        expert_boundary: cfg.expert_boundary.or(official.expert_boundary),
        ..cfg.clone()
    }
}

/// The start image, checked against the DiT's task before any model is loaded: an image for a T2V model, none
/// for an I2V model, or no `--clip` for Wan2.1 I2V is an error that says what to change.
/// Returns the DiT's configuration (read from the headers) with the image.
fn start_image(args: &GenerateArgs) -> anyhow::Result<(WanConfig, Option<RgbImage>)> {
    let report = weights::inspect(&args.dit)?;
    let name = weights::variant_name(&report.config, report.expert);
    check_image_use(&report.config, &name, args.image.is_some())?;
    let Some(path) = &args.image else {
        return Ok((report.config, None));
    };
    if report.config.has_clip() && args.clip.is_none() {
        return Err(StartImageError::ClipMissing.into());
    }
    if !report.config.has_clip() && args.clip.is_some() {
        eprintln!("note: {name} has no CLIP image input; --clip is not used");
    }
    Ok((report.config, Some(load_start_image(path)?)))
}

/// `--width` × `--height`; without both, for a start image the official size for its aspect ratio, else
/// 832 × 480.
fn clip_size(args: &GenerateArgs, cfg: &WanConfig, image: Option<&RgbImage>) -> (usize, usize) {
    match (args.width, args.height, image) {
        (None, None, Some(img)) => official_size(cfg, img.dimensions(), default_max_area(cfg)),
        (w, h, _) => (w.unwrap_or(832), h.unwrap_or(480)),
    }
}

/// The DiT conditioning of the start image: CLIP features (Wan2.1 I2V; the encoder is dropped afterwards) and
/// the VAE latents, as [`image_conditioning`] makes them.
fn encode_start_image(
    args: &GenerateArgs,
    cfg: &WanConfig,
    image: &RgbImage,
    decoder: &VaeDecoder,
    settings: &ClipSettings,
    (dtype, device): (DType, &Device),
) -> anyhow::Result<ImageConditioning> {
    let clip = match (&args.clip, cfg.has_clip()) {
        (Some(path), true) => Some(
            load_clip_vision(path, &ClipVisionConfig::vit_h_14(), dtype, device)
                .with_context(|| format!("loading the CLIP image encoder {}", path.display()))?,
        ),
        _ => None,
    };
    image_conditioning(cfg, image, decoder, clip.as_ref(), settings)
        .context("encoding the start image")
}

/// The clip settings of the command line, with the seed chosen.
fn clip_settings(args: &GenerateArgs, (width, height): (usize, usize), seed: u64) -> ClipSettings {
    ClipSettings {
        width,
        height,
        frames: args.frames(),
        steps: args.steps(),
        shift: args.shift(),
        guidance: args.guidance(),
        seed,
        solver: args.solver(),
    }
}

/// Checks what can be checked before anything loads (loading a 14B DiT takes minutes): the expert boundary, the
/// clip's settings against the VAE this DiT is made for ([`latent_shape`]), and that the output folder can be made.
fn check_before_loading(
    args: &GenerateArgs,
    cfg: &WanConfig,
    (width, height): (usize, usize),
) -> anyhow::Result<()> {
    if let Some(b) = args
        .boundary
        .filter(|b| !(b.is_finite() && *b > 0.0 && *b <= 1.0))
    {
        anyhow::bail!(
            "--boundary {b} is not a fraction of the timesteps: use a number above 0 and at most 1 (0.875 \
             for text-to-video, 0.9 for image-to-video)"
        );
    }
    latent_shape(cfg, &vae_for(cfg), &clip_settings(args, (width, height), 0))?;
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| {
            format!(
                "cannot create the folder for --out {}; pick a folder you can write to",
                args.out.display()
            )
        })?;
    }
    Ok(())
}

/// Runs `generate`: an image when `--dit` is a FLUX.1 file, else a Wan clip.
pub fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    if flux::is_flux(&args.dit) {
        return flux::run(args);
    }
    let text_encoder = args.text_encoder()?;
    let flux_only = args.flux_options();
    if !flux_only.is_empty() {
        anyhow::bail!(
            "{} {} for FLUX.1 DiTs, and this is a Wan DiT: drop {} and give --text-encoder ({})",
            flux_only.join(", "),
            if flux_only.len() == 1 { "is" } else { "are" },
            if flux_only.len() == 1 { "it" } else { "them" },
            args.dit.display()
        );
    }
    let (cfg, image) = start_image(args)?;
    let size = clip_size(args, &cfg, image.as_ref());
    check_before_loading(args, &cfg, size)?;
    let placement = args.placement()?;
    let device = open_device(placement.main)?;
    // A Wan2.2 A14B pair over two GPUs: the low-noise expert's own card.
    let low_device = placement.low_noise.map(open_device).transpose()?;
    let dtype = pick_dtype(args.dtype, &device)?;
    let budget = args.vram_budget()?;
    // Before anything takes device memory: what the text encoder, the VAE and the DiTs take counts against it.
    // With two GPUs the budget is each card's.
    let held = budget.map(|b| hold_vram_budget(&device, b)).transpose()?;
    let held_low = match (budget, &low_device) {
        (Some(b), Some(low)) => hold_vram_budget(low, b)?,
        _ => None,
    };
    let text = TextEncoder::load(text_encoder, args.tokenizer.as_deref(), dtype, &device)
        .with_context(|| format!("loading the text encoder {}", text_encoder.display()))?;
    let conditioning = Conditioning::encode(
        &text,
        &args.prompt,
        args.negative.as_deref(),
        args.guidance(),
    )?;
    drop(text);
    let vae = load_vae_auto(&args.vae, dtype, &device)?;
    let decoder = VaeDecoder {
        stats: LatentStats::official(vae.config().variant, &device)?,
        vae,
        tiles: args.tiled.then(TileConfig::default),
        dtype,
    };
    let seed = args.seed.unwrap_or_else(rand::random);
    let settings = clip_settings(args, size, seed);
    // Before the DiT loads, so the CLIP encoder is gone by then.
    let image = image
        .map(|img| encode_start_image(args, &cfg, &img, &decoder, &settings, (dtype, &device)))
        .transpose()?;
    // Two experts are a Wan2.2 A14B pair: read as Wan 2.2 even where a file does not say so (a Wan2.1 14B file
    // has the same tensors).
    let pair = args.dit_low_noise.as_ref().map(|_| a14b_expert(&cfg));
    // The low-noise expert first. On the one GPU it is parked in RAM once loaded: the high-noise one denoises
    // first, and the GPU only ever holds one of them. On its own GPU it stays there.
    let mut low = match &args.dit_low_noise {
        Some(path) => {
            let low_dev = low_device.as_ref().unwrap_or(&device);
            let mut model = load_dit_with_loras(
                path,
                pair.as_ref(),
                &args.loras_low_noise,
                args,
                (dtype, low_dev),
            )?;
            if low_device.is_none() {
                model.park()?;
            }
            release_cached_memory(low_dev)?;
            Some(model)
        }
        None => None,
    };
    let mut high = load_dit_with_loras(
        &args.dit,
        pair.as_ref(),
        &args.loras,
        args,
        (dtype, &device),
    )?;
    let boundary = high.config().boundary_timestep(args.boundary);
    let mut experts = Experts {
        high_noise: &mut high,
        low_noise: low.as_mut().map(|l| (l, boundary)),
        residency: match low_device {
            Some(_) => Residency::OwnDevices,
            None => Residency::Shared,
        },
    };
    eprintln!(
        "seed {seed}, {}x{}, {} frames, {} steps{}{}",
        size.0,
        size.1,
        args.frames(),
        args.steps(),
        if image.is_some() {
            ", from the start image"
        } else {
            ""
        },
        match (placement.main, placement.low_noise) {
            (main, Some(low)) =>
                format!(", high-noise expert on {main}, low-noise expert on {low}"),
            _ => String::new(),
        }
    );
    let devices: Vec<&Device> = std::iter::once(&device)
        .chain(low_device.as_ref())
        .collect();
    let bar = progress_bar(
        args.steps() as u64,
        "{bar:30} {pos}/{len} steps  [{elapsed_precise} < {eta_precise}]",
    );
    // The loop polls this once before each step: a progress tick, and the time each step starts (after the
    // device has finished the last one).
    let starts = std::cell::RefCell::new(Vec::with_capacity(args.steps() + 1));
    let tick = || {
        for device in &devices {
            let _ = device.synchronize();
        }
        starts.borrow_mut().push(Instant::now());
        bar.inc(1);
        false
    };
    let latents = denoise_clip(
        &mut experts,
        &decoder,
        &conditioning,
        image.as_ref(),
        &settings,
        &tick,
    )?;
    for device in &devices {
        device.synchronize()?;
    }
    let denoised = Instant::now();
    bar.finish_and_clear();
    let frames = decoder.decode(&latents)?;
    let decode_secs = denoised.elapsed().as_secs_f64();
    let mut starts = starts.into_inner();
    starts.push(denoised);
    let held_back = |hold: Option<&VramHold>| hold.map_or(0, |h| h.bytes);
    let mut vram: Vec<VramUse> =
        VramUse::measure(&device, held_back(held.as_ref().and_then(Option::as_ref)))
            .into_iter()
            .collect();
    if let Some(low) = &low_device {
        vram.extend(VramUse::measure(low, held_back(held_low.as_ref())));
    }
    eprintln!("{}", timing_line(&starts, decode_secs, &vram));
    let frames_dir = write_clip(&args.out, &frames, CLIP_FPS)?;
    println!(
        "wrote {} ({} frames) and {}",
        args.out.display(),
        frames.len(),
        frames_dir.display()
    );
    Ok(())
}

/// What the denoising steps took (from the instants each started and the end of the last), the decoding, and the
/// most device memory the command took (on each card, where it ran on several).
pub(super) fn timing_line(starts: &[Instant], decode_secs: f64, vram: &[VramUse]) -> String {
    let steps: Vec<f64> = starts
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    let total: f64 = steps.iter().sum();
    let mean = total / steps.len().max(1) as f64;
    let each: Vec<String> = steps.iter().map(|s| format!("{s:.2}")).collect();
    let gib = |v: &VramUse| format!("{:.2}", v.peak as f64 / (1u64 << 30) as f64);
    let vram = match vram {
        [] => String::new(),
        [one] => format!("; peak VRAM {} GiB", gib(one)),
        several => format!(
            "; peak VRAM {} GiB (per GPU)",
            several.iter().map(gib).collect::<Vec<_>>().join(" + ")
        ),
    };
    format!(
        "denoised in {total:.1} s, {mean:.2} s per step (each: {}); decoded in {decode_secs:.1} s{vram}",
        each.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: GenerateArgs,
    }

    fn try_parse(extra: &[&str]) -> Result<GenerateArgs, clap::Error> {
        let base = [
            "x",
            "--dit",
            "d",
            "--text-encoder",
            "t",
            "--vae",
            "v",
            "--prompt",
            "p",
            "--out",
            "o",
        ];
        let all: Vec<&str> = base.iter().chain(extra).copied().collect();
        <Cli as clap::Parser>::try_parse_from(all).map(|c| c.args)
    }

    fn parse(extra: &[&str]) -> GenerateArgs {
        try_parse(extra).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_solver_is_the_engines_by_name() {
        assert_eq!(parse(&[]).solver(), Solver::Unipc);
        assert_eq!(parse(&["--solver", "dpmpp"]).solver(), Solver::Dpmpp);
        assert_eq!(parse(&["--solver", "euler"]).solver(), Solver::Euler);
        let err = try_parse(&["--solver", "ddim"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("ddim") && err.contains("dpmpp"), "{err}");
    }

    #[test]
    fn the_fp8_scale_is_nns_by_name() {
        assert_eq!(parse(&[]).fp8, None);
        assert_eq!(parse(&["--fp8", "tensor"]).fp8, Some(Fp8Scale::Tensor));
        assert_eq!(parse(&["--fp8", "channel"]).fp8, Some(Fp8Scale::Channel));
        assert_eq!(parse(&["--fp8", "block64"]).fp8, Some(Fp8Scale::Block64));
        let err = try_parse(&["--fp8", "block32"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("block32") && err.contains("channel"), "{err}");
    }

    #[test]
    fn clip_size_follows_the_start_image_unless_given() {
        let ti2v = WanConfig::wan22_ti2v_5b();
        let portrait = RgbImage::new(704, 1280);
        assert_eq!(clip_size(&parse(&[]), &ti2v, Some(&portrait)), (704, 1280));
        assert_eq!(clip_size(&parse(&[]), &ti2v, None), (832, 480));
        let given = parse(&["--width", "640", "--height", "352"]);
        assert_eq!(clip_size(&given, &ti2v, Some(&portrait)), (640, 352));
        assert_eq!(
            clip_size(&parse(&["--width", "640"]), &ti2v, Some(&portrait)),
            (640, 480)
        );
    }

    #[test]
    fn the_timing_line_gives_each_step_and_the_mean() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + std::time::Duration::from_millis(ms);
        let line = timing_line(&[at(0), at(1000), at(3000)], 4.0, &[]);
        assert_eq!(
            line,
            "denoised in 3.0 s, 1.50 s per step (each: 1.00 2.00); decoded in 4.0 s"
        );
    }

    fn placement_error(gpus: &[usize], pair: bool) -> String {
        gpu_placement(gpus, DeviceSpec::Auto, pair)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn two_gpus_put_one_a14b_expert_on_each() -> anyhow::Result<()> {
        let one = parse(&["--gpus", "1"]).placement()?;
        assert_eq!((one.main, one.low_noise), (DeviceSpec::Cuda(1), None));
        let split = parse(&["--gpus", "1,0", "--dit-low-noise", "l"]).placement()?;
        assert_eq!(
            (split.main, split.low_noise),
            (DeviceSpec::Cuda(1), Some(DeviceSpec::Cuda(0)))
        );
        // One GPU for a pair keeps both experts on it (one parked in RAM at a time).
        let shared = parse(&["--gpus", "0", "--dit-low-noise", "l"]).placement()?;
        assert_eq!((shared.main, shared.low_noise), (DeviceSpec::Cuda(0), None));
        let default = parse(&["--device", "cpu"]).placement()?;
        assert_eq!((default.main, default.low_noise), (DeviceSpec::Cpu, None));
        Ok(())
    }

    #[test]
    fn gpus_that_cannot_split_the_model_are_refused() {
        let err = placement_error(&[0, 1], false);
        assert!(
            err.contains("only Wan2.2 A14B") && err.contains("--gpus 0"),
            "{err}"
        );
        let err = placement_error(&[1, 1], true);
        assert!(err.contains("twice") && err.contains("--gpus 0,1"), "{err}");
        let err = placement_error(&[0, 1, 2], true);
        assert!(err.contains("at most two GPUs"), "{err}");
        let err = try_parse(&["--gpus", "0", "--device", "cpu"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--gpus") && err.contains("--device"), "{err}");
    }

    #[test]
    fn the_timing_line_gives_each_gpus_peak() {
        let t0 = Instant::now();
        let use_of = |gib: u64| VramUse {
            peak: gib << 30,
            outside_pool: 0,
            in_use: 0,
            reserved: 0,
            free: 0,
        };
        let line = timing_line(&[t0, t0], 0.0, &[use_of(30), use_of(29)]);
        assert!(
            line.ends_with("; peak VRAM 30.00 + 29.00 GiB (per GPU)"),
            "{line}"
        );
        let line = timing_line(&[t0, t0], 0.0, &[use_of(30)]);
        assert!(line.ends_with("; peak VRAM 30.00 GiB"), "{line}");
    }

    #[test]
    fn lora_specs_split_only_at_a_numeric_multiplier() {
        assert_eq!(
            parse_lora("a.safetensors"),
            (PathBuf::from("a.safetensors"), 1.0)
        );
        assert_eq!(
            parse_lora("a.safetensors:0.5"),
            (PathBuf::from("a.safetensors"), 0.5)
        );
        assert_eq!(
            parse_lora(r"C:\l\a.safetensors"),
            (PathBuf::from(r"C:\l\a.safetensors"), 1.0)
        );
        assert_eq!(
            parse_lora(r"C:\l\a.safetensors:-1"),
            (PathBuf::from(r"C:\l\a.safetensors"), -1.0)
        );
    }
}
