//! Wan's part of the generation call: one clip from a prompt with a Wan DiT, its LoRAs (and, for Wan2.2 A14B, the
//! low-noise expert, on the same GPU or its own), the umT5 text encoder and the Wan VAE, from a start image for
//! image-to-video models. Models are loaded one after the other and the text encoder is dropped before the DiT
//! loads, so peak memory is the DiT's plus the VAE's. The built-in demo model generates through [`super::demo_generate`].

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device};
use framesmith_config::run::DeviceSpec;
use framesmith_config::RunConfig;
use framesmith_models::wan::clip::{load_clip_vision, ClipVisionConfig};
use framesmith_models::wan::text_encoder::TextEncoder;
use framesmith_models::wan::vae::{load_vae_auto, LatentStats, TileConfig};
use framesmith_models::wan::{weights, ModelOptions, ModelType, WanConfig, WanModel};
use framesmith_nn::device::hold_vram_budget;
use framesmith_nn::offload::{
    release_cached_memory, streamed_blocks, OffloadOptions, StreamPlacement,
};
use image::RgbImage;

use super::plan::vae_for;
use crate::dit::load_dit;
use crate::family::wan::denoise::{Experts, ImageConditioning, Residency};
use crate::family::wan::pipeline::{
    denoise_clip, latent_shape, ClipSettings, Conditioning, VaeDecoder, CLIP_FPS,
};
use crate::family::wan::start_image::{
    check_image_use, default_max_area, image_conditioning, load_start_image, official_size,
    StartImageError,
};
use crate::generate::request::{
    create_out_folder, open_device, pick_dtype, DitSource, GenerationOutput, GenerationRequest,
    LoraChoice, Placement,
};
use crate::generate::run::{
    given, loras_as_one, timing_line, vram_use, write_clip, Session, StepClock,
};
use crate::generate::sampler::Solver;

/// Wan's defaults for the settings a request leaves out.
pub const FRAMES: usize = 81;
pub const STEPS: usize = 50;
pub const SHIFT: f64 = 5.0;
pub const GUIDANCE: f64 = 5.0;
const WIDTH: usize = 832;
const HEIGHT: usize = 480;

/// The clip settings of `request`, with the seed chosen.
pub fn clip_settings(
    request: &GenerationRequest,
    (width, height): (usize, usize),
    seed: u64,
) -> ClipSettings {
    ClipSettings {
        width,
        height,
        frames: request.frames.unwrap_or(FRAMES),
        steps: request.steps.unwrap_or(STEPS),
        shift: request.shift.unwrap_or(SHIFT),
        guidance: request.guidance.unwrap_or(GUIDANCE),
        seed,
        solver: request.solver.unwrap_or(Solver::Unipc),
    }
}

/// Where generation runs: the device of the text encoder, the VAE and the DiT (of a Wan2.2 A14B pair, the
/// high-noise expert), and, for a pair over two GPUs, the low-noise expert's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuPlacement {
    pub main: DeviceSpec,
    pub low_noise: Option<DeviceSpec>,
}

/// The placement `--gpus` asks for (else `--device`'s): one GPU runs everything; two split a Wan2.2 A14B pair
/// (`pair`), the high-noise expert on the first and the low-noise one on the second. Two GPUs for one DiT, the
/// same GPU twice, or more than two are errors that say what to give instead.
pub fn gpu_placement(placement: &Placement, pair: bool) -> anyhow::Result<GpuPlacement> {
    let gpus = &placement.gpus;
    let list = gpus
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    match *gpus.as_slice() {
        [] => Ok(GpuPlacement {
            main: placement.device,
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

/// The options given that only other families take, by flag.
fn foreign_options(request: &GenerationRequest) -> Vec<&'static str> {
    let f = &request.files;
    [
        (f.t5.is_some(), "--t5"),
        (f.clip_l.is_some(), "--clip-l"),
        (f.clip_l_tokenizer.is_some(), "--clip-l-tokenizer"),
        (!request.controls.is_empty(), "--control"),
    ]
    .into_iter()
    .filter_map(|(given, name)| given.then_some(name))
    .collect()
}

/// The start image, checked against the DiT's task before any model is loaded: an image for a T2V model, none
/// for an I2V model, or no `--clip` for Wan2.1 I2V is an error that says what to change.
/// Returns the DiT's configuration (read from the headers) with the image.
fn start_image(
    dit: &Path,
    request: &GenerationRequest,
    session: &mut Session,
) -> anyhow::Result<(WanConfig, Option<RgbImage>)> {
    let report = weights::inspect(dit)?;
    let name = weights::variant_name(&report.config, report.expert);
    check_image_use(&report.config, &name, request.image.is_some())?;
    let Some(path) = &request.image else {
        return Ok((report.config, None));
    };
    let clip = request.files.clip.is_some();
    if report.config.has_clip() && !clip {
        return Err(StartImageError::ClipMissing.into());
    }
    if !report.config.has_clip() && clip {
        session.log(format!(
            "note: {name} has no CLIP image input; --clip is not used"
        ));
    }
    Ok((report.config, Some(load_start_image(path)?)))
}

/// `width` × `height`; without both, for a start image the official size for its aspect ratio, else 832 × 480.
pub fn clip_size(
    request: &GenerationRequest,
    cfg: &WanConfig,
    image: Option<&RgbImage>,
) -> (usize, usize) {
    match (request.width, request.height, image) {
        (None, None, Some(img)) => official_size(cfg, img.dimensions(), default_max_area(cfg)),
        (w, h, _) => (w.unwrap_or(WIDTH), h.unwrap_or(HEIGHT)),
    }
}

/// The DiT conditioning of the start image: CLIP features (Wan2.1 I2V; the encoder is dropped afterwards) and
/// the VAE latents, as [`image_conditioning`] makes them.
fn encode_start_image(
    request: &GenerationRequest,
    cfg: &WanConfig,
    image: &RgbImage,
    (decoder, settings): (&VaeDecoder, &ClipSettings),
    (dtype, device): (DType, &Device),
) -> anyhow::Result<ImageConditioning> {
    let clip = match (&request.files.clip, cfg.has_clip()) {
        (Some(path), true) => Some(
            load_clip_vision(path, &ClipVisionConfig::vit_h_14(), dtype, device)
                .with_context(|| format!("loading the CLIP image encoder {}", path.display()))?,
        ),
        _ => None,
    };
    image_conditioning(cfg, image, decoder, clip.as_ref(), settings)
        .context("encoding the start image")
}

/// Checks what can be checked before anything loads (loading a 14B DiT takes minutes): the expert boundary, the
/// clip's settings against the VAE this DiT is made for ([`latent_shape`]), and that the output folder can be made.
fn check_before_loading(
    request: &GenerationRequest,
    cfg: &WanConfig,
    size: (usize, usize),
) -> anyhow::Result<()> {
    if let Some(b) = request
        .boundary
        .filter(|b| !(b.is_finite() && *b > 0.0 && *b <= 1.0))
    {
        anyhow::bail!(
            "--boundary {b} is not a fraction of the timesteps: use a number above 0 and at most 1 (0.875 \
             for text-to-video, 0.9 for image-to-video)"
        );
    }
    latent_shape(cfg, &vae_for(cfg), &clip_settings(request, size, 0))?;
    create_out_folder(&request.out)
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

/// Loads a DiT and attaches its LoRAs (several are combined into one adapter per layer).
fn load_dit_with_loras(
    (path, expected): (&Path, Option<&WanConfig>),
    loras: &[LoraChoice],
    request: &GenerationRequest,
    (dtype, device): (DType, &Device),
    session: &mut Session,
) -> anyhow::Result<WanModel> {
    let options = ModelOptions {
        residual_dtype: DType::F32,
        blocks_fp8: request.fp8,
        fp8_products: false,
    };
    let blocks_to_swap = request.blocks_to_swap;
    let mut named = None;
    let loaded = load_dit(path, expected, (dtype, device), &options, |cfg, name| {
        named = Some(format!("DiT: {name} ({})", path.display()));
        if blocks_to_swap == 0 {
            return Ok(None);
        }
        if blocks_to_swap >= cfg.num_layers {
            anyhow::bail!(
                "--blocks-to-swap {blocks_to_swap}: this DiT has {} blocks; stream at most {}",
                cfg.num_layers,
                cfg.num_layers - 1
            );
        }
        let streamed = streamed_blocks(cfg.num_layers, blocks_to_swap, StreamPlacement::Spread);
        Ok(Some((streamed, OffloadOptions::default())))
    });
    if let Some(line) = named {
        session.log(line);
    }
    let mut model = loaded?.model;
    if let Some((lora, multiplier)) = loras_as_one(loras, device, session)? {
        lora.apply(model.linears_mut(), multiplier, dtype)
            .context("the LoRA does not fit this DiT")?;
    }
    Ok(model)
}

/// The request for the models of the Wan (or demo) run `config`: its DiT (both experts), VAE, umT5 and CLIP image
/// encoder, its device, a clip written to `out_stem`.mp4.
pub fn run_request(config: &RunConfig, out_stem: &Path) -> GenerationRequest {
    let m = &config.model;
    let dit = match m.demo {
        true => DitSource::Demo,
        false => DitSource::File(m.dit.clone()),
    };
    let mut request = GenerationRequest::new(dit, "", out_stem.with_extension("mp4"));
    if !m.demo {
        request.dit_low_noise = given(&m.dit_low_noise);
        request.files.vae = given(&m.vae);
        request.files.text_encoder = given(&m.text_encoder);
        request.files.clip = given(&m.clip);
    }
    request.placement.device = config.training.device;
    request.frames = Some(FRAMES);
    request
}

/// Generates the clip `request` asks for with a Wan DiT file, or the built-in demo model.
pub fn generate(
    request: &GenerationRequest,
    session: &mut Session,
) -> anyhow::Result<GenerationOutput> {
    match &request.dit {
        DitSource::Demo => super::demo_generate::generate(request, session),
        DitSource::File(dit) => generate_file(dit, request, session),
    }
}

/// The loaded parts of a clip's generation, before the DiT loads: the devices, the prompt, the decoder and the
/// start image's conditioning.
struct Prepared {
    device: Device,
    low_device: Option<Device>,
    dtype: DType,
    conditioning: Conditioning,
    decoder: VaeDecoder,
    settings: ClipSettings,
    image: Option<ImageConditioning>,
    placement: GpuPlacement,
}

/// The request's checks, then everything up to the DiT: the devices (and the VRAM budget held back), the text
/// encoder (dropped once the prompt is encoded), the VAE, the start image's conditioning.
fn prepare(
    dit: &Path,
    request: &GenerationRequest,
    session: &mut Session,
) -> anyhow::Result<(WanConfig, Prepared, Holds)> {
    let text_encoder = request.files.text_encoder.as_deref().ok_or_else(|| {
        anyhow::anyhow!(
            "a Wan DiT needs --text-encoder: the umT5 weights (models_t5_umt5-xxl-enc-bf16.pth or a ComfyUI \
             umt5_xxl .safetensors) ({})",
            dit.display()
        )
    })?;
    let foreign = foreign_options(request);
    if !foreign.is_empty() {
        anyhow::bail!(
            "{} {} for FLUX.1 DiTs, and this is a Wan DiT: drop {} and give --text-encoder ({})",
            foreign.join(", "),
            if foreign.len() == 1 { "is" } else { "are" },
            if foreign.len() == 1 { "it" } else { "them" },
            dit.display()
        );
    }
    let vae_path = vae_of(request, dit)?;
    let (cfg, image) = start_image(dit, request, session)?;
    let size = clip_size(request, &cfg, image.as_ref());
    check_before_loading(request, &cfg, size)?;
    let placement = gpu_placement(&request.placement, request.dit_low_noise.is_some())?;
    let device = open_device(placement.main)?;
    // A Wan2.2 A14B pair over two GPUs: the low-noise expert's own card.
    let low_device = placement.low_noise.map(open_device).transpose()?;
    let dtype = pick_dtype(request.dtype, &device)?;
    // Before anything takes device memory: what the text encoder, the VAE and the DiTs take counts against it.
    // With two GPUs the budget is each card's.
    let budget = request.vram_budget_bytes;
    let holds = Holds {
        main: budget
            .map(|b| hold_vram_budget(&device, b))
            .transpose()?
            .flatten(),
        low: match (budget, &low_device) {
            (Some(b), Some(low)) => hold_vram_budget(low, b)?,
            _ => None,
        },
    };
    let seed = request.seed.unwrap_or_else(rand::random);
    let settings = clip_settings(request, size, seed);
    let text = TextEncoder::load(
        text_encoder,
        request.files.tokenizer.as_deref(),
        dtype,
        &device,
    )
    .with_context(|| format!("loading the text encoder {}", text_encoder.display()))?;
    let conditioning = Conditioning::encode(
        &text,
        &request.prompt,
        request.negative.as_deref(),
        settings.guidance,
    )?;
    drop(text);
    let vae = load_vae_auto(vae_path, dtype, &device)?;
    let decoder = VaeDecoder {
        stats: LatentStats::official(vae.config().variant, &device)?,
        vae,
        tiles: request.tiled.then(TileConfig::default),
        dtype,
    };
    // Before the DiT loads, so the CLIP encoder is gone by then.
    let image = image
        .map(|img| encode_start_image(request, &cfg, &img, (&decoder, &settings), (dtype, &device)))
        .transpose()?;
    let prepared = Prepared {
        device,
        low_device,
        dtype,
        conditioning,
        decoder,
        settings,
        image,
        placement,
    };
    Ok((cfg, prepared, holds))
}

/// The VRAM held back for the budget on each card (released when generation ends).
struct Holds {
    main: Option<framesmith_nn::device::VramHold>,
    low: Option<framesmith_nn::device::VramHold>,
}

/// The VAE a Wan DiT decodes with.
fn vae_of<'a>(request: &'a GenerationRequest, dit: &Path) -> anyhow::Result<&'a Path> {
    request.files.vae.as_deref().ok_or_else(|| {
        anyhow::anyhow!(
            "a Wan DiT needs --vae: the Wan VAE weights (Wan2.1_VAE.pth, or Wan2.2_VAE.pth for TI2V-5B) ({})",
            dit.display()
        )
    })
}

/// The DiT (the high-noise expert) and, for a Wan2.2 A14B pair, the low-noise expert, each with its LoRAs. The
/// low-noise expert loads first: on the one GPU it is parked in RAM once loaded (the high-noise one denoises
/// first, and the GPU only ever holds one of them); on its own GPU it stays there.
fn load_experts(
    dit: &Path,
    cfg: &WanConfig,
    request: &GenerationRequest,
    p: &Prepared,
    session: &mut Session,
) -> anyhow::Result<(WanModel, Option<WanModel>)> {
    // Two experts are a Wan2.2 A14B pair: read as Wan 2.2 even where a file does not say so (a Wan2.1 14B file
    // has the same tensors).
    let pair = request.dit_low_noise.as_ref().map(|_| a14b_expert(cfg));
    let low = match &request.dit_low_noise {
        Some(path) => {
            let low_dev = p.low_device.as_ref().unwrap_or(&p.device);
            let mut model = load_dit_with_loras(
                (path, pair.as_ref()),
                &request.loras_low_noise,
                request,
                (p.dtype, low_dev),
                session,
            )?;
            if p.low_device.is_none() {
                model.park()?;
            }
            release_cached_memory(low_dev)?;
            Some(model)
        }
        None => None,
    };
    let high = load_dit_with_loras(
        (dit, pair.as_ref()),
        &request.loras,
        request,
        (p.dtype, &p.device),
        session,
    )?;
    Ok((high, low))
}

/// `generate` with the Wan DiT file `dit`.
fn generate_file(
    dit: &Path,
    request: &GenerationRequest,
    session: &mut Session,
) -> anyhow::Result<GenerationOutput> {
    let (cfg, p, holds) = prepare(dit, request, session)?;
    let (mut high, mut low) = load_experts(dit, &cfg, request, &p, session)?;
    let boundary = high.config().boundary_timestep(request.boundary);
    let mut experts = Experts {
        high_noise: &mut high,
        low_noise: low.as_mut().map(|l| (l, boundary)),
        residency: match p.low_device {
            Some(_) => Residency::OwnDevices,
            None => Residency::Shared,
        },
    };
    let s = &p.settings;
    session.log(format!(
        "seed {}, {}x{}, {} frames, {} steps{}{}",
        s.seed,
        s.width,
        s.height,
        s.frames,
        s.steps,
        if p.image.is_some() {
            ", from the start image"
        } else {
            ""
        },
        match (p.placement.main, p.placement.low_noise) {
            (main, Some(low)) =>
                format!(", high-noise expert on {main}, low-noise expert on {low}"),
            _ => String::new(),
        }
    ));
    let devices: Vec<Device> = std::iter::once(p.device.clone())
        .chain(p.low_device.clone())
        .collect();
    let clock = StepClock::new(session, devices, s.steps);
    let latents = clock.checked(denoise_clip(
        &mut experts,
        &p.decoder,
        &p.conditioning,
        p.image.as_ref(),
        s,
        &|| clock.poll(),
    ))?;
    let starts = clock.finish()?;
    let denoised = starts.last().copied().unwrap_or_else(Instant::now);
    let frames = p.decoder.decode(&latents)?;
    let decode_secs = denoised.elapsed().as_secs_f64();
    let mut vram: Vec<_> = vram_use(&p.device, holds.main.as_ref())
        .into_iter()
        .collect();
    if let Some(low) = &p.low_device {
        vram.extend(vram_use(low, holds.low.as_ref()));
    }
    session.log(timing_line(&starts, decode_secs, &vram));
    let frames_dir = write_clip(&request.out, &frames, CLIP_FPS)?;
    Ok(GenerationOutput {
        file: request.out.clone(),
        frames_dir: Some(frames_dir),
        frames: frames.len(),
        width: s.width,
        height: s.height,
        seed: s.seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::request::DitSource;

    fn request() -> GenerationRequest {
        GenerationRequest::new(DitSource::File("d".into()), "p", "o.mp4")
    }

    #[test]
    fn clip_size_follows_the_start_image_unless_given() {
        let ti2v = WanConfig::wan22_ti2v_5b();
        let portrait = RgbImage::new(704, 1280);
        assert_eq!(clip_size(&request(), &ti2v, Some(&portrait)), (704, 1280));
        assert_eq!(clip_size(&request(), &ti2v, None), (832, 480));
        let given = GenerationRequest {
            width: Some(640),
            height: Some(352),
            ..request()
        };
        assert_eq!(clip_size(&given, &ti2v, Some(&portrait)), (640, 352));
        let width = GenerationRequest {
            width: Some(640),
            ..request()
        };
        assert_eq!(clip_size(&width, &ti2v, Some(&portrait)), (640, 480));
    }

    fn placement(gpus: &[usize], device: DeviceSpec) -> Placement {
        Placement {
            device,
            gpus: gpus.to_vec(),
        }
    }

    fn placement_error(gpus: &[usize], pair: bool) -> String {
        gpu_placement(&placement(gpus, DeviceSpec::Auto), pair)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn two_gpus_put_one_a14b_expert_on_each() -> anyhow::Result<()> {
        let one = gpu_placement(&placement(&[1], DeviceSpec::Auto), false)?;
        assert_eq!((one.main, one.low_noise), (DeviceSpec::Cuda(1), None));
        let split = gpu_placement(&placement(&[1, 0], DeviceSpec::Auto), true)?;
        assert_eq!(
            (split.main, split.low_noise),
            (DeviceSpec::Cuda(1), Some(DeviceSpec::Cuda(0)))
        );
        // One GPU for a pair keeps both experts on it (one parked in RAM at a time).
        let shared = gpu_placement(&placement(&[0], DeviceSpec::Auto), true)?;
        assert_eq!((shared.main, shared.low_noise), (DeviceSpec::Cuda(0), None));
        let default = gpu_placement(&placement(&[], DeviceSpec::Cpu), false)?;
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
    }
}
