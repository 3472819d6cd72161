//! `framesmith cache latents` and `framesmith cache text`: cache a musubi-tuner dataset for training, with a
//! progress bar, a line per file that could not be cached, and a summary at the end. For image-to-video models
//! (`--dit`, or musubi-tuner's `--i2v` / `--clip`) the latent caches also hold the first frame's conditioning.
//! FLUX.1's files (`--vae ae.safetensors`; `--clip-l` and `--t5`) cache for FLUX.1 instead ([`flux`]).

mod flux;

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::DType;
use clap::{Args, Subcommand};
use framesmith_config::run::DeviceSpec;
use framesmith_data::media::{MediaTools, FFMPEG_INSTALL_HINT};
use framesmith_data::{load_valid, DatasetKind, ValidConfig};
use framesmith_engine::prep::{
    cache_latents, cache_text, CacheOptions, CacheProgress, CacheSummary, ImageParts, ItemOutcome,
    LatentEncoder,
};
use framesmith_models::wan::clip::{load_clip_vision, ClipVisionConfig};
use framesmith_models::wan::text_encoder::TextEncoder;
use framesmith_models::wan::vae::{load_vae_auto, LatentStats, TileConfig, VaeConfig};
use framesmith_models::wan::{weights, ModelType};
use indicatif::ProgressBar;

use super::models::{open_device, pick_dtype, progress_bar, DtypeArg};

/// What to cache.
#[derive(Subcommand)]
pub enum CacheAction {
    /// Encode every image and clip of a dataset with the Wan VAE (or every image with FLUX.1's autoencoder)
    Latents(LatentArgs),
    /// Encode every caption of a dataset with the umT5 text encoder (or FLUX.1's CLIP-L and T5-XXL)
    Text(TextArgs),
}

/// `cache latents` options.
#[derive(Args)]
pub struct LatentArgs {
    /// Dataset config (musubi-tuner TOML)
    #[arg(long)]
    dataset: PathBuf,
    /// Wan VAE weights (Wan2.1_VAE.pth, Wan2.2_VAE.pth or a ComfyUI .safetensors), or FLUX.1's ae.safetensors
    /// to cache for FLUX.1
    #[arg(long)]
    vae: PathBuf,
    /// auto, cpu, cuda or cuda:N
    #[arg(long, default_value = "auto")]
    device: DeviceSpec,
    /// VAE dtype, also the dtype latents are stored in (default: bf16 on a GPU, f32 on the CPU)
    #[arg(long, value_enum)]
    dtype: Option<DtypeArg>,
    /// Encode in overlapping spatial tiles (less memory for large frames; approximate)
    #[arg(long)]
    tiled: bool,
    /// Keep cache files of items that are no longer in the dataset
    #[arg(long)]
    keep_stale: bool,
    /// The DiT the caches are for (read from its header only): for an image-to-video model (Wan2.1 I2V,
    /// Wan2.2 I2V-A14B) the first frame's conditioning is cached too; the VAE is checked to be the DiT's
    #[arg(long)]
    dit: Option<PathBuf>,
    /// Cache the image-to-video conditioning (first-frame mask and image latents), as Wan2.2 I2V-A14B needs;
    /// implied by --clip and by an I2V --dit
    #[arg(long)]
    i2v: bool,
    /// CLIP image encoder for Wan2.1 I2V (models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth or ComfyUI's
    /// clip_vision_h.safetensors): the first frame's features are cached too
    #[arg(long)]
    clip: Option<PathBuf>,
}

/// `cache text` options.
#[derive(Args)]
pub struct TextArgs {
    /// Dataset config (musubi-tuner TOML)
    #[arg(long)]
    dataset: PathBuf,
    /// umT5 weights (models_t5_umt5-xxl-enc-bf16.pth or a ComfyUI umt5_xxl .safetensors)
    #[arg(long, required_unless_present = "t5", conflicts_with_all = ["t5", "clip_l"])]
    text_encoder: Option<PathBuf>,
    /// tokenizer.json or spiece.model of google/umt5-xxl (default: one beside the text encoder weights, else the
    /// tokenizer inside ComfyUI's umt5_xxl .safetensors); with --t5, the tokenizer.json of google/t5-v1_1-xxl
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// FLUX.1: the T5-XXL weights (t5xxl_fp16.safetensors or t5xxl_fp8_e4m3fn_scaled.safetensors), with --clip-l
    #[arg(long, requires = "clip_l")]
    t5: Option<PathBuf>,
    /// FLUX.1: the CLIP-L weights (clip_l.safetensors), with --t5
    #[arg(long, requires = "t5")]
    clip_l: Option<PathBuf>,
    /// FLUX.1: CLIP-L's tokenizer.json (default: one beside clip_l.safetensors)
    #[arg(long, requires = "clip_l")]
    clip_l_tokenizer: Option<PathBuf>,
    /// auto, cpu, cuda or cuda:N
    #[arg(long, default_value = "auto")]
    device: DeviceSpec,
    /// Text encoder dtype, also the dtype embeddings are stored in (default: bf16 on a GPU, f32 on the CPU)
    #[arg(long, value_enum)]
    dtype: Option<DtypeArg>,
    /// Keep cache files of items that are no longer in the dataset
    #[arg(long)]
    keep_stale: bool,
}

/// Runs a `cache` subcommand.
pub fn run(action: &CacheAction) -> anyhow::Result<()> {
    match action {
        CacheAction::Latents(args) => latents(args),
        CacheAction::Text(args) => text(args),
    }
}

/// Progress bar plus a printed line per item that failed.
struct Reporter {
    bar: ProgressBar,
}

impl CacheProgress for Reporter {
    fn begin(&mut self, items: usize) {
        self.bar.set_length(items as u64);
    }

    fn item_done(&mut self, media: &Path, outcome: &ItemOutcome) {
        if let ItemOutcome::Failed(reason) = outcome {
            self.bar
                .suspend(|| eprintln!("skipped {}: {reason}", media.display()));
        }
        self.bar.set_message(
            media
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        self.bar.inc(1);
    }
}

fn reporter() -> Reporter {
    Reporter {
        bar: progress_bar(
            0,
            "{bar:30} {pos}/{len} items  {msg}  [{elapsed_precise} < {eta_precise}]",
        ),
    }
}

/// The dataset, with its warnings printed.
fn dataset(path: &Path) -> anyhow::Result<ValidConfig> {
    let valid = load_valid(path)?;
    for warning in &valid.warnings {
        eprintln!("warning: {warning}");
    }
    Ok(valid)
}

fn latents(args: &LatentArgs) -> anyhow::Result<()> {
    if flux::is_flux_autoencoder(&args.vae) {
        return flux::latents(args);
    }
    let valid = dataset(&args.dataset)?;
    let wanted = image_parts_wanted(args)?;
    let tools = MediaTools::locate().ok();
    if tools.is_none()
        && valid
            .datasets
            .iter()
            .any(|d| d.kind() == DatasetKind::Video)
    {
        eprintln!("warning: ffmpeg was not found, so video files cannot be decoded; {FFMPEG_INSTALL_HINT}");
    }
    let device = open_device(args.device)?;
    let dtype = pick_dtype(args.dtype, &device)?;
    let vae = load_vae_auto(&args.vae, dtype, &device)?;
    check_vae_fits_dit(args, vae.config().z_dim)?;
    let stats = LatentStats::official(vae.config().variant, &device)?;
    eprintln!(
        "VAE: {:?}, {} latent channels, on {device:?} in {dtype:?}",
        vae.config().variant,
        vae.config().z_dim
    );
    let clip = match &wanted {
        Wanted::LatentsAndClip(path) => {
            // musubi-tuner runs CLIP in float16; the CPU computes in f32.
            let clip_dtype = if device.is_cuda() {
                DType::F16
            } else {
                DType::F32
            };
            let clip = load_clip_vision(path, &ClipVisionConfig::vit_h_14(), clip_dtype, &device)
                .with_context(|| {
                format!("loading the CLIP image encoder {}", path.display())
            })?;
            eprintln!("image-to-video: caching the first frame's conditioning and CLIP features");
            Some(clip)
        }
        Wanted::Latents => {
            eprintln!("image-to-video: caching the first frame's conditioning");
            None
        }
        Wanted::None => None,
    };
    let image = match (&wanted, &clip) {
        (Wanted::LatentsAndClip(_), Some(clip)) => ImageParts::LatentsAndClip(clip),
        (Wanted::Latents, _) => ImageParts::Latents,
        _ => ImageParts::None,
    };
    let encoder = LatentEncoder {
        vae: &vae,
        stats: &stats,
        device: device.clone(),
        dtype,
        tiles: args.tiled.then(TileConfig::default),
        image,
    };
    let options = CacheOptions {
        keep_stale: args.keep_stale,
    };
    let mut progress = reporter();
    let summary = cache_latents(&valid, tools.as_ref(), &encoder, &options, &mut progress)?;
    progress.bar.finish_and_clear();
    report(&summary);
    Ok(())
}

/// What image-to-video conditioning `cache latents` writes.
enum Wanted {
    None,
    Latents,
    LatentsAndClip(PathBuf),
}

/// The image-to-video parts to cache, from `--dit` (its header says which model it is) or, without it, from
/// `--i2v` / `--clip` as musubi-tuner's `wan_cache_latents.py` takes them. A flag the DiT contradicts, or a
/// Wan2.1 I2V DiT without `--clip`, is an error that says what to change.
fn image_parts_wanted(args: &LatentArgs) -> anyhow::Result<Wanted> {
    let Some(dit) = &args.dit else {
        return Ok(match (&args.clip, args.i2v) {
            (Some(clip), _) => Wanted::LatentsAndClip(clip.clone()),
            (None, true) => Wanted::Latents,
            (None, false) => Wanted::None,
        });
    };
    let report = weights::inspect(dit)?;
    let name = weights::variant_name(&report.config, report.expert);
    let cfg = &report.config;
    if cfg.model_type == ModelType::Ti2v {
        if args.i2v || args.clip.is_some() {
            eprintln!(
                "note: {name} trains image-to-video (training.mode = \"image_to_video\") from the first latent frame \
                 of each clip's own latents, so its caches hold latents only; --i2v and --clip are not used"
            );
        }
        return Ok(Wanted::None);
    }
    if cfg.model_type != ModelType::I2v {
        if args.i2v || args.clip.is_some() {
            anyhow::bail!(
                "{name} is not an image-to-video model, so it takes no image conditioning: drop --i2v and --clip, \
                 or give the I2V DiT: {}",
                dit.display()
            );
        }
        return Ok(Wanted::None);
    }
    match (&args.clip, cfg.has_clip()) {
        (Some(clip), true) => Ok(Wanted::LatentsAndClip(clip.clone())),
        (None, true) => anyhow::bail!(
            "{name} takes CLIP image features of each clip's first frame: add --clip \
             models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth (or ComfyUI's clip_vision_h.safetensors)"
        ),
        (Some(_), false) => {
            eprintln!("note: {name} has no CLIP image input; --clip is not used");
            Ok(Wanted::Latents)
        }
        (None, false) => Ok(Wanted::Latents),
    }
}

/// With `--dit`, refuses a VAE of `z_dim` channels that the DiT does not denoise (the Wan2.1 VAE for TI2V-5B, or
/// the Wan2.2 VAE for the others) before anything is encoded.
fn check_vae_fits_dit(args: &LatentArgs, z_dim: usize) -> anyhow::Result<()> {
    let Some(dit) = &args.dit else {
        return Ok(());
    };
    let report = weights::inspect(dit)?;
    if report.config.out_dim == z_dim {
        return Ok(());
    }
    let wanted = if report.config.out_dim == VaeConfig::wan22().z_dim {
        "Wan2.2_VAE.pth"
    } else {
        "Wan2.1_VAE.pth"
    };
    anyhow::bail!(
        "the VAE makes {z_dim}-channel latents but {} denoises {}: cache with the VAE made for it ({wanted}): {}",
        weights::variant_name(&report.config, report.expert),
        report.config.out_dim,
        args.vae.display()
    )
}

fn text(args: &TextArgs) -> anyhow::Result<()> {
    let text_encoder = match (&args.text_encoder, &args.clip_l, &args.t5) {
        (Some(path), _, _) => path,
        (None, Some(clip), Some(t5)) => return flux::text(args, clip, t5),
        _ => anyhow::bail!("give --text-encoder (Wan's umT5), or --clip-l and --t5 (FLUX.1)"),
    };
    let valid = dataset(&args.dataset)?;
    let device = open_device(args.device)?;
    let dtype = pick_dtype(args.dtype, &device)?;
    let encoder = TextEncoder::load(text_encoder, args.tokenizer.as_deref(), dtype, &device)
        .with_context(|| format!("loading the text encoder {}", text_encoder.display()))?;
    eprintln!(
        "text encoder: {} layers, width {}, on {device:?} in {dtype:?}",
        encoder.encoder.config().num_layers,
        encoder.encoder.config().dim
    );
    let options = CacheOptions {
        keep_stale: args.keep_stale,
    };
    let mut progress = reporter();
    let summary = cache_text(&valid, None, &encoder, dtype, &options, &mut progress)?;
    progress.bar.finish_and_clear();
    report(&summary);
    Ok(())
}

/// Prints the summary: counts, then every failure and removal, then warnings.
fn report(summary: &CacheSummary) {
    println!("{summary}");
    for (media, reason) in &summary.failed {
        println!("  failed: {reason}: {}", media.display());
    }
    for path in &summary.removed {
        println!("  removed stale cache: {}", path.display());
    }
    for warning in &summary.warnings {
        println!("  warning: {warning}");
    }
}
