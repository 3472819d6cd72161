//! `framesmith cache latents` and `framesmith cache text`: cache a musubi-tuner dataset for training, with a
//! progress bar, a line per file that could not be cached, and a summary at the end.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use framesmith_config::run::DeviceSpec;
use framesmith_data::media::{MediaTools, FFMPEG_INSTALL_HINT};
use framesmith_data::{load_valid, DatasetKind, ValidConfig};
use framesmith_engine::prep::{
    cache_latents, cache_text, CacheOptions, CacheProgress, CacheSummary, ItemOutcome,
    LatentEncoder,
};
use framesmith_models::wan::text_encoder::TextEncoder;
use framesmith_models::wan::vae::{load_vae_auto, LatentStats, TileConfig};
use indicatif::ProgressBar;

use super::models::{open_device, pick_dtype, progress_bar, DtypeArg};

/// What to cache.
#[derive(Subcommand)]
pub enum CacheAction {
    /// Encode every image and clip of a dataset with the Wan VAE
    Latents(LatentArgs),
    /// Encode every caption of a dataset with the umT5 text encoder
    Text(TextArgs),
}

/// `cache latents` options.
#[derive(Args)]
pub struct LatentArgs {
    /// Dataset config (musubi-tuner TOML)
    #[arg(long)]
    dataset: PathBuf,
    /// Wan VAE weights (Wan2.1_VAE.pth, Wan2.2_VAE.pth or a ComfyUI .safetensors)
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
}

/// `cache text` options.
#[derive(Args)]
pub struct TextArgs {
    /// Dataset config (musubi-tuner TOML)
    #[arg(long)]
    dataset: PathBuf,
    /// umT5 weights (models_t5_umt5-xxl-enc-bf16.pth or a ComfyUI umt5_xxl .safetensors)
    #[arg(long)]
    text_encoder: PathBuf,
    /// tokenizer.json or spiece.model of google/umt5-xxl (default: one beside the text encoder weights, else the
    /// tokenizer inside ComfyUI's umt5_xxl .safetensors)
    #[arg(long)]
    tokenizer: Option<PathBuf>,
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
    let valid = dataset(&args.dataset)?;
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
    let stats = LatentStats::official(vae.config().variant, &device)?;
    eprintln!(
        "VAE: {:?}, {} latent channels, on {device:?} in {dtype:?}",
        vae.config().variant,
        vae.config().z_dim
    );
    let encoder = LatentEncoder {
        vae: &vae,
        stats: &stats,
        device: device.clone(),
        dtype,
        tiles: args.tiled.then(TileConfig::default),
        image: Default::default(),
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

fn text(args: &TextArgs) -> anyhow::Result<()> {
    let valid = dataset(&args.dataset)?;
    let device = open_device(args.device)?;
    let dtype = pick_dtype(args.dtype, &device)?;
    let encoder = TextEncoder::load(
        &args.text_encoder,
        args.tokenizer.as_deref(),
        dtype,
        &device,
    )
    .with_context(|| format!("loading the text encoder {}", args.text_encoder.display()))?;
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
