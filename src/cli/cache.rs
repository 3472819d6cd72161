//! `framesmith cache latents` and `framesmith cache text`: cache a musubi-tuner dataset for training, with a
//! progress bar, a line per file that could not be cached, and a summary at the end. The engine's one caching
//! call ([`cache`]) picks the model family from the files given.

use std::path::{Path, PathBuf};

use candle_core::Device;
use clap::{Args, Subcommand};
use framesmith_config::run::DeviceSpec;
use framesmith_data::Unreadable;
use framesmith_engine::family::{flag_help, CliCommand};
use framesmith_engine::prep::pass::{cache, CachePass, CacheRequest, LatentFiles, TextFiles};
use framesmith_engine::prep::{CacheProgress, CacheSummary, ItemOutcome};
use framesmith_nn::device::{hold_vram_budget, VramHold, VramUse};
use indicatif::ProgressBar;

use super::models::{open_device, pick_dtype, progress_bar, DtypeArg};

/// What to cache.
#[derive(Subcommand)]
pub enum CacheAction {
    /// Encode every image (and clip) of a dataset with the VAE of a model family
    #[command(after_help = flag_help(CliCommand::CacheLatents))]
    Latents(LatentArgs),
    /// Encode every caption of a dataset with the text encoders of a model family
    #[command(after_help = flag_help(CliCommand::CacheText))]
    Text(TextArgs),
}

/// `cache latents` options.
#[derive(Args)]
pub struct LatentArgs {
    /// Dataset config (musubi-tuner TOML)
    #[arg(long)]
    dataset: PathBuf,
    /// VAE (or autoencoder) weights of the family to cache for (see "Model families")
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
    /// Leave out, with a counted warning, dataset entries that cannot be read (a dangling link, a FIFO, a file
    /// that does not decode) instead of failing on them
    #[arg(long)]
    skip_unreadable: bool,
    #[command(flatten)]
    budget: BudgetArg,
    /// The DiT the caches are for (read from its header only): for an image-to-video model the first frame's
    /// conditioning is cached too; the VAE is checked to be the DiT's
    #[arg(long)]
    dit: Option<PathBuf>,
    /// Cache the image-to-video conditioning (first-frame mask and image latents) an image-to-video model needs;
    /// implied by --clip and by an I2V --dit
    #[arg(long)]
    i2v: bool,
    /// Image encoder (CLIP or SigLIP, see "Model families"), for an image-to-video model that takes one: the first
    /// frame's features are cached too
    #[arg(long, visible_alias = "image-encoder")]
    clip: Option<PathBuf>,
}

/// `cache text` options.
#[derive(Args)]
pub struct TextArgs {
    /// Dataset config (musubi-tuner TOML)
    #[arg(long)]
    dataset: PathBuf,
    /// Text encoder weights, for a family with one text encoder (see "Model families")
    #[arg(long, required_unless_present = "t5", conflicts_with_all = ["t5", "clip_l"])]
    text_encoder: Option<PathBuf>,
    /// The text encoder's (or --t5's) tokenizer, tokenizer.json or spiece.model (default: one beside its
    /// weights)
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// T5-XXL weights, for a family with T5-XXL and CLIP-L text encoders, with --clip-l
    #[arg(long, requires = "clip_l")]
    t5: Option<PathBuf>,
    /// CLIP-L text encoder weights (clip_l.safetensors), with --t5
    #[arg(long, requires = "t5")]
    clip_l: Option<PathBuf>,
    /// CLIP-L's tokenizer.json (default: one beside clip_l.safetensors)
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
    /// Leave out, with a counted warning, dataset entries that cannot be read (a dangling link, a FIFO, a file
    /// that does not decode) instead of failing on them
    #[arg(long)]
    skip_unreadable: bool,
    #[command(flatten)]
    budget: BudgetArg,
    /// The DiT the captions are for (its file name or model_index.json only): for an edit model whose captions are
    /// encoded with their control images, which release's encoding to reproduce
    #[arg(long)]
    dit: Option<PathBuf>,
}

/// `--vram-budget-gb` of a cache pass.
#[derive(Args, Clone, Copy)]
pub struct BudgetArg {
    /// Use at most this many GiB of the card (the rest is held back while the pass runs), so a pass that fits
    /// here fits a card of that size; the encoder is kept to fit what is left
    #[arg(long)]
    vram_budget_gb: Option<f64>,
}

impl BudgetArg {
    /// The budget in bytes.
    fn bytes(self) -> anyhow::Result<Option<u64>> {
        super::models::vram_budget_bytes(self.vram_budget_gb)
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// Runs a `cache` subcommand.
pub fn run(action: &CacheAction) -> anyhow::Result<()> {
    let (dataset, device, dtype, (keep_stale, skip_unreadable), pass) = match action {
        CacheAction::Latents(args) => (
            &args.dataset,
            args.device,
            args.dtype,
            (args.keep_stale, args.skip_unreadable),
            CachePass::Latents(LatentFiles {
                vae: args.vae.clone(),
                tiled: args.tiled,
                dit: args.dit.clone(),
                i2v: args.i2v,
                clip: args.clip.clone(),
            }),
        ),
        CacheAction::Text(args) => (
            &args.dataset,
            args.device,
            args.dtype,
            (args.keep_stale, args.skip_unreadable),
            CachePass::Text(TextFiles {
                text_encoder: args.text_encoder.clone().or_else(|| args.t5.clone()),
                tokenizer: args.tokenizer.clone(),
                clip_text: args.clip_l.clone(),
                clip_tokenizer: args.clip_l_tokenizer.clone(),
                dit: args.dit.clone(),
            }),
        ),
    };
    let budget = match action {
        CacheAction::Latents(args) => args.budget,
        CacheAction::Text(args) => args.budget,
    }
    .bytes()?;
    // The device the pass opened, with the budget's hold: kept until the pass ends, then asked for its peak.
    let opened = std::cell::OnceCell::new();
    let open = || {
        let device = open_device(device)?;
        let hold = match budget {
            Some(bytes) => hold_vram_budget(&device, bytes)?,
            None => None,
        };
        let dtype = pick_dtype(dtype, &device)?;
        let _ = opened.set((device.clone(), hold));
        Ok((device, dtype))
    };
    let request = CacheRequest {
        dataset: dataset.clone(),
        pass,
        keep_stale,
        unreadable: Unreadable::skip_if(skip_unreadable),
        open: &open,
    };
    let mut progress = reporter();
    let bar = progress.bar.clone();
    let mut log = |line: &str| bar.suspend(|| eprintln!("{line}"));
    let summary = cache(&request, &mut progress, &mut log)?;
    progress.bar.finish_and_clear();
    report(&summary);
    if let Some((device, hold)) = opened.get() {
        report_vram(device, hold.as_ref(), budget);
    }
    refuse_failed(&summary, skip_unreadable)
}

/// The pass's peak VRAM (the budget's hold left out), on a CUDA device.
fn report_vram(device: &Device, hold: Option<&VramHold>, budget: Option<u64>) {
    let held = hold.map_or(0, |h| h.bytes);
    if let Some(used) = VramUse::measure(device, held) {
        let within = budget.map_or(String::new(), |b| {
            format!(" (budget {:.1} GiB)", b as f64 / GIB)
        });
        println!("  VRAM: peak {:.2} GiB{within}", used.peak as f64 / GIB);
    }
}

/// Items that could not be cached fail the command (after every other item is cached, so nothing is lost), unless
/// they are to be left out.
fn refuse_failed(summary: &CacheSummary, skip_unreadable: bool) -> anyhow::Result<()> {
    let failed = summary.failed.len();
    if failed == 0 {
        return Ok(());
    }
    if skip_unreadable {
        println!("  {failed} item(s) that could not be read are left out (--skip-unreadable)");
        return Ok(());
    }
    anyhow::bail!(
        "{failed} item(s) could not be read and have no cache (each is listed above); fix or remove them and run \
         this again (what is cached stays), or pass --skip-unreadable to leave them out"
    )
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
        println!("  {warning}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_positive_gib() -> anyhow::Result<()> {
        let budget = |gb| BudgetArg { vram_budget_gb: gb };
        assert_eq!(budget(Some(16.0)).bytes()?, Some(16 << 30));
        assert_eq!(budget(None).bytes()?, None);
        for bad in [0.0, -2.0, f64::NAN] {
            let err = budget(Some(bad)).bytes().err().map(|e| e.to_string());
            assert!(err.is_some_and(|e| e.contains("positive")), "{bad}");
        }
        Ok(())
    }
}
