//! `framesmith-bench`: GPU benchmarks and device checks, a small binary without GUI dependencies that is carried
//! to the test machine. `check` compares every CUDA kernel with its CPU reference; `attention` and `linear` time
//! Wan shapes (after a correctness check on a small size with `--check`); `synth-project` writes a real-size
//! training project of random weights and caches.

use anyhow::{bail, Context, Result};
use candle_core::Device;
use clap::{Parser, Subcommand};

use framesmith_bench::step::StepMode;
use framesmith_bench::{self as bench, attention::AttentionBench, linear::LinearBench, Record};
use framesmith_engine::train::step::BlockBackward;
use framesmith_models::wan::config::WanConfig;
use framesmith_nn::fp8::Fp8Scale;

#[derive(Parser)]
#[command(about = "Framesmith GPU benchmarks and device checks")]
struct Cli {
    /// CUDA device ordinal (the CPU when built without the cuda feature).
    #[arg(long, default_value_t = 0)]
    device: usize,
    #[command(subcommand)]
    command: Command,
}

/// A clip's size (480×832×81 unless told).
#[derive(clap::Args)]
struct Clip {
    /// Video frames (4k + 1).
    #[arg(long, default_value_t = 81)]
    frames: usize,
    /// Height in pixels.
    #[arg(long, default_value_t = 480)]
    height: usize,
    /// Width in pixels.
    #[arg(long, default_value_t = 832)]
    width: usize,
}

/// The training workload the step and streaming benchmarks time.
#[derive(clap::Args)]
struct Workload {
    #[command(flatten)]
    clip: Clip,
    /// LoRA rank.
    #[arg(long, default_value_t = 32)]
    rank: usize,
    /// Block linears in FP8 (`block64`, `channel`, `tensor`); bf16 when absent.
    #[arg(long)]
    fp8: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Compare every CUDA kernel with its CPU reference on fresh random inputs.
    Check,
    /// Time fused attention (self and cross) at a Wan variant's head count.
    Attention(AttentionArgs),
    /// Time the element-wise kernels (norms, modulation, GELU, RoPE) at a Wan variant's activation shapes.
    Kernels(KernelsArgs),
    /// Time a Wan block's linear layers, bf16 and FP8 block-64, forward + input gradient.
    Linear(LinearArgs),
    /// Time the checkpointed LoRA training step of a whole Wan DiT (random weights drawn on the device).
    Step(StepArgs),
    /// Full-size equivalence with the PyTorch reference: one LoRA step, with its weights (random, drawn on the
    /// device), sample, LoRA factors, loss and LoRA gradients written to `--out` for
    /// `bench/reference/equivalence.py`.
    Equivalence(EquivalenceArgs),
    /// Block streaming: the step resident and streamed (each mode), copy bandwidths, an optional VRAM budget.
    Stream(StreamArgs),
    /// Write a training project of a real size with nothing to download: random DiT weights, one cached clip,
    /// its dataset TOML and a run config (`run.toml`) that trains from the caches.
    SynthProject(SynthArgs),
    /// Copy bandwidth of block streaming for each staging setting (no compute, no whole-model build): copies of
    /// one block streamed in order, `pinned` first for reference.
    StageSweep(StageSweepArgs),
}

/// `attention`'s arguments.
#[derive(clap::Args)]
struct AttentionArgs {
    /// Wan variant (t2v-1.3b, t2v-14b, i2v-14b, t2v-a14b, i2v-a14b, ti2v-5b).
    #[arg(long, default_value = "t2v-14b")]
    variant: String,
    /// Video tokens (32,760 for 480×832×81).
    #[arg(long, default_value_t = 32_760)]
    tokens: usize,
    /// Batch size.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Timed repetitions.
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// Run the device checks first and stop if any fails.
    #[arg(long)]
    check: bool,
    /// Time the portable tiled kernel instead (what a GPU build without cuDNN runs).
    #[arg(long)]
    portable: bool,
}

/// `kernels`'s arguments.
#[derive(clap::Args)]
struct KernelsArgs {
    /// Wan variant.
    #[arg(long, default_value = "t2v-14b")]
    variant: String,
    /// Video tokens.
    #[arg(long, default_value_t = 32_760)]
    tokens: usize,
    /// Timed repetitions.
    #[arg(long, default_value_t = 20)]
    iters: usize,
}

/// `linear`'s arguments.
#[derive(clap::Args)]
struct LinearArgs {
    /// Wan variant.
    #[arg(long, default_value = "t2v-14b")]
    variant: String,
    /// Activation rows.
    #[arg(long, default_value_t = 32_760)]
    tokens: usize,
    /// Timed repetitions.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Run the device checks first and stop if any fails.
    #[arg(long)]
    check: bool,
}

/// `step`'s arguments.
#[derive(clap::Args)]
struct StepArgs {
    /// Wan variant (t2v-1.3b, t2v-14b).
    #[arg(long, default_value = "t2v-1.3b")]
    variant: String,
    #[command(flatten)]
    workload: Workload,
    /// Untimed steps first.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 3)]
    iters: usize,
    /// First compare the tiny config's LoRA gradients on this device (in this mode) with the CPU autograd
    /// step's; stop on a mismatch.
    #[arg(long)]
    check: bool,
    /// Block backward: `manual` (hand-written, the default) or `autograd` (candle's, the reference).
    #[arg(long, default_value = "manual")]
    backward: String,
    /// Keep each block's self-attention output from the forward (selective checkpointing; manual only).
    #[arg(long)]
    keep_attention: bool,
    /// Keep each block's self-attention projection output as well (implies --keep-attention).
    #[arg(long)]
    keep_projection: bool,
    /// Keep every block's whole tape from the forward (no recompute in the backward; manual only).
    #[arg(long)]
    no_checkpointing: bool,
}

/// `equivalence`'s arguments.
#[derive(clap::Args)]
struct EquivalenceArgs {
    /// Wan variant (t2v-1.3b, t2v-14b).
    #[arg(long, default_value = "t2v-1.3b")]
    variant: String,
    #[command(flatten)]
    workload: Workload,
    /// Text tokens of the context (padded to 512 either way).
    #[arg(long, default_value_t = 512)]
    text_tokens: usize,
    /// Folder for the files.
    #[arg(long)]
    out: std::path::PathBuf,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Block backward: `manual` or `autograd`.
    #[arg(long, default_value = "manual")]
    backward: String,
    /// Keep each block's self-attention output from the forward.
    #[arg(long)]
    keep_attention: bool,
}

/// `stream`'s arguments.
#[derive(clap::Args)]
struct StreamArgs {
    #[arg(long, default_value = "t2v-14b")]
    variant: String,
    #[command(flatten)]
    workload: Workload,
    /// Cases, comma-separated: `resident`, `pinned`, `staged`.
    #[arg(long, default_value = "resident,pinned,staged")]
    modes: String,
    /// Streamed blocks.
    #[arg(long, default_value_t = 30)]
    blocks: usize,
    /// `spread` or `last`.
    #[arg(long, default_value = "spread")]
    placement: String,
    /// Residual stream dtype (`f32` or `bf16`).
    #[arg(long, default_value = "f32")]
    residual: String,
    /// Keep saved block inputs in host RAM.
    #[arg(long)]
    host_activations: bool,
    /// Keep every block's whole tape from the forward (no recompute in the backward).
    #[arg(long)]
    no_checkpointing: bool,
    /// Keep each block's self-attention output and LSE (selective checkpointing, `checkpointing =
    /// "attention"`); with --host-activations they wait in RAM with the saved inputs.
    #[arg(long, conflicts_with = "no_checkpointing")]
    keep_attention: bool,
    /// GPU slots in the ring; a comma-separated list times each streamed case with each count.
    #[arg(long, default_value = "2")]
    slots: String,
    /// Page-locked staging chunk buffers of `staged` streaming.
    #[arg(long, default_value_t = framesmith_nn::offload::STAGING_SLOTS)]
    staging_slots: usize,
    /// MiB of one staging chunk (`staged`).
    #[arg(long, default_value_t = framesmith_nn::offload::STAGING_CHUNK_BYTES >> 20)]
    staging_chunk_mib: usize,
    /// Threads of the staging copy (`staged`).
    #[arg(long, default_value_t = framesmith_nn::offload::STAGING_COPY_THREADS)]
    copy_threads: usize,
    /// KiB of one unit of work the staging copy hands to a free copy thread (`staged`).
    #[arg(long, default_value_t = framesmith_nn::offload::COPY_UNIT_BYTES >> 10)]
    copy_unit_kib: usize,
    /// Let the run use only this many GiB of device memory (the rest is reserved first).
    #[arg(long)]
    vram_budget_gb: Option<f64>,
    /// Also measure the copy bandwidth of a plain pinned copy and of the streaming path (each streaming mode
    /// in `--modes`).
    #[arg(long)]
    bandwidth: bool,
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    #[arg(long, default_value_t = 2)]
    iters: usize,
    /// First compare streamed and resident LoRA gradients on a tiny config.
    #[arg(long)]
    check: bool,
}

/// `stage-sweep`'s arguments.
#[derive(clap::Args)]
struct StageSweepArgs {
    #[arg(long, default_value = "t2v-14b")]
    variant: String,
    /// Block linears in FP8 (`block64`, `channel`, `tensor`); bf16 when absent.
    #[arg(long)]
    fp8: Option<String>,
    /// Streamed copies of the block.
    #[arg(long, default_value_t = 16)]
    blocks: usize,
    /// Timed passes over the blocks, after one warm-up pass.
    #[arg(long, default_value_t = 3)]
    passes: usize,
    /// Staging copy threads, comma-separated.
    #[arg(long, default_value = "8")]
    copy_threads: String,
    /// MiB of one staging chunk, comma-separated.
    #[arg(long, default_value = "8")]
    staging_chunk_mib: String,
    /// Staging chunk buffers, comma-separated.
    #[arg(long, default_value = "4")]
    staging_slots: String,
    /// KiB of one unit of work the staging copy hands to a free copy thread, comma-separated.
    #[arg(long, default_value_t = (framesmith_nn::offload::COPY_UNIT_BYTES >> 10).to_string())]
    copy_unit_kib: String,
    /// Measure the whole list of staged settings this many times.
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Also measure each setting while another thread launches kernels (as a training step's does).
    #[arg(long)]
    launch_load: bool,
}

/// `synth-project`'s arguments.
#[derive(clap::Args)]
struct SynthArgs {
    /// Model family: `wan` (the Wan `--variant`) or `flux-dev` (FLUX.1 [dev] at its released size, one cached
    /// image of `--width` x `--height`; `--frames` and `--encoders` do not apply).
    #[arg(long, default_value = "wan")]
    model: String,
    /// Wan variant (t2v-1.3b, t2v-14b, i2v-14b, t2v-a14b, i2v-a14b, ti2v-5b).
    #[arg(long, default_value = "t2v-1.3b")]
    variant: String,
    #[command(flatten)]
    clip: Clip,
    /// Project folder.
    #[arg(long)]
    out: std::path::PathBuf,
    /// DiT weights: bf16, f16 or f32 in the official layout, or `fp8-scaled` (a ComfyUI scaled-FP8 single file);
    /// for FLUX.1 also `fp8` (plain float8_e4m3fn block weights under the official names).
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// LoRA rank (and alpha) of a FLUX.1 project's run config (Wan projects use 32).
    #[arg(long, default_value_t = 16)]
    rank: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Text-embedding tokens (umT5 writes up to 512; FLUX.1 [dev]'s T5 always 512).
    #[arg(long, default_value_t = 32)]
    text_tokens: usize,
    /// Optimizer steps of the run config.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Also write random umT5-XXL (ComfyUI scaled FP8) and Wan VAE weights (Wan2.2's for ti2v-5b, else Wan2.1's)
    /// at their real sizes, with this SentencePiece model embedded as the umT5 file's tokenizer, for `framesmith
    /// cache` runs.
    #[arg(long, value_name = "SPIECE_MODEL")]
    encoders: Option<std::path::PathBuf>,
    /// FLUX.1: also write random `ae.safetensors`, CLIP-L and T5-XXL at their released sizes (with stand-in
    /// tokenizers) and `prompts.txt`, for runs that sample during training.
    #[arg(long)]
    sample_files: bool,
}

/// bf16 weights and the portable CPU step differ by rounding only; a real bug gives errors of order 1.
const STEP_CHECK_TOL: f64 = 3e-2;

fn step_check(dev: &Device, mode: StepMode) -> Result<()> {
    let c = bench::step::check_tiny(dev, mode)?;
    let verdict = if c.max_rel_err <= STEP_CHECK_TOL {
        "ok  "
    } else {
        "FAIL"
    };
    println!(
        "{verdict} step tiny(2) LoRA grads device ({}) vs cpu (autograd): max rel {:.2e} (tol {STEP_CHECK_TOL:.0e}, worst var {} of {}), loss {:.6} vs {:.6}",
        mode.label(),
        c.max_rel_err,
        c.worst,
        c.tensors,
        c.loss_device,
        c.loss_cpu
    );
    if c.max_rel_err > STEP_CHECK_TOL {
        bail!("the device step's LoRA gradients differ from the CPU step's");
    }
    Ok(())
}

fn step_mode(
    backward: &str,
    keep_attention: bool,
    keep_projection: bool,
    keep_tapes: bool,
) -> Result<StepMode> {
    let backward = match backward {
        "manual" => BlockBackward::Manual,
        "autograd" => BlockBackward::Autograd,
        other => bail!("unknown block backward `{other}` (manual, autograd)"),
    };
    let keep_attention = keep_attention || keep_projection;
    if (keep_attention || keep_tapes) && backward != BlockBackward::Manual {
        bail!("--keep-attention, --keep-projection and --no-checkpointing need --backward manual");
    }
    Ok(StepMode {
        backward,
        keep_attention,
        keep_projection,
        keep_tapes,
    })
}

/// The step benchmark's settings for `workload` (clip size, rank, FP8) in `mode`; the rest default.
fn step_bench(workload: &Workload, mode: StepMode) -> Result<bench::step::StepBench> {
    Ok(bench::step::StepBench {
        mode,
        frames: workload.clip.frames,
        height: workload.clip.height,
        width: workload.clip.width,
        rank: workload.rank,
        fp8: fp8_mode(workload.fp8.as_deref())?,
        ..bench::step::StepBench::default()
    })
}

/// A comma-separated list of positive counts given to `flag`.
fn counts(flag: &str, list: &str) -> Result<Vec<usize>> {
    let values = list
        .split(',')
        .map(|s| s.trim().parse::<usize>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| {
            anyhow::anyhow!("{flag}: {e} (a count or a comma-separated list, e.g. 2,3)")
        })?;
    if values.is_empty() || values.contains(&0) {
        bail!("{flag}: every count must be at least 1");
    }
    Ok(values)
}

fn fp8_mode(name: Option<&str>) -> Result<Option<Fp8Scale>> {
    name.map(|n| n.parse::<Fp8Scale>().map_err(anyhow::Error::msg))
        .transpose()
}

fn device(ordinal: usize) -> Result<Device> {
    if cfg!(feature = "cuda") {
        Device::new_cuda(ordinal).context("opening the CUDA device")
    } else {
        Ok(Device::Cpu)
    }
}

fn variant(name: &str) -> Result<WanConfig> {
    WanConfig::by_name(name).with_context(|| format!("unknown Wan variant `{name}`"))
}

#[cfg(feature = "cuda")]
fn check(dev: &Device) -> Result<()> {
    let outcomes = framesmith_nn::cuda::check::run_all(dev)?;
    let mut failed = 0;
    for o in &outcomes {
        let verdict = if o.passed() { "ok  " } else { "FAIL" };
        failed += usize::from(!o.passed());
        println!(
            "{verdict} {:<70} rel {:.2e} (tol {:.0e}) max|d| {:.2e}",
            o.name, o.rel_err, o.tol, o.max_abs
        );
    }
    println!(
        "checks: {} passed, {failed} failed",
        outcomes.len() - failed
    );
    if failed > 0 {
        bail!("{failed} device checks failed");
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn check(_: &Device) -> Result<()> {
    bail!("device checks need a build with the cuda feature")
}

#[cfg(feature = "cuda")]
fn kernels(dev: &Device, cfg: &WanConfig, tokens: usize, iters: usize) -> Result<()> {
    use framesmith_bench::kernels::KernelBench;
    let opts = KernelBench {
        tokens,
        iters,
        ..KernelBench::default()
    };
    report(&bench::kernels::run(dev, cfg, &opts)?);
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn kernels(_: &Device, _: &WanConfig, _: usize, _: usize) -> Result<()> {
    bail!("the kernel benchmark needs a build with the cuda feature")
}

fn report(records: &[Record]) {
    for r in records {
        println!("{}", r.json_line());
    }
    print!("{}", bench::table(records));
}

/// Writes the synthetic FLUX.1 [dev] project and says what it wrote.
fn synth_flux_project(args: &SynthArgs) -> Result<()> {
    if args.encoders.is_some() {
        bail!("--encoders is for Wan projects: a FLUX.1 project trains from its caches alone");
    }
    let spec = bench::synth_flux::FluxSynthProject {
        cfg: framesmith_models::flux::FluxConfig::dev(),
        height: args.clip.height,
        width: args.clip.width,
        dit: bench::synth_flux::FluxDitFormat::parse(&args.dtype)?,
        seed: args.seed,
        text_tokens: args.text_tokens,
        steps: args.steps,
        rank: args.rank,
    };
    let files = bench::synth_flux::write_flux_project(&args.out, &spec)?;
    if args.sample_files {
        let sizes = bench::synth_flux_samples::FluxEncoderSizes::released();
        let dir = files.dit.parent().unwrap_or(&args.out);
        let samples = bench::synth_flux_samples::write_flux_sample_files(
            dir,
            &sizes,
            (spec.width, spec.height),
            spec.seed,
        )?;
        println!(
            "wrote {}, {}, {}, {}",
            samples.autoencoder.display(),
            samples.clip_l.display(),
            samples.t5.display(),
            samples.prompts.display()
        );
    }
    println!(
        "wrote {} ({:.2} GiB), {}, {}, {}, {}",
        files.dit.display(),
        files.dit_bytes as f64 / (1u64 << 30) as f64,
        files.latents.display(),
        files.text.display(),
        files.dataset.display(),
        files.run.display()
    );
    Ok(())
}

/// Writes the synthetic project and says what it wrote.
fn synth_project(args: &SynthArgs) -> Result<()> {
    match args.model.as_str() {
        "wan" => {}
        "flux-dev" => return synth_flux_project(args),
        other => bail!("unknown model `{other}` for synth-project (wan, flux-dev)"),
    }
    if args.sample_files {
        bail!("--sample-files is for FLUX.1 projects (--model flux-dev); Wan projects take --encoders");
    }
    let dit = bench::synth::DitFormat::parse(&args.dtype)?;
    let spec = bench::synth::SynthProject {
        cfg: variant(&args.variant)?,
        frames: args.clip.frames,
        height: args.clip.height,
        width: args.clip.width,
        dit,
        seed: args.seed,
        text_tokens: args.text_tokens,
        steps: args.steps,
        encoders: args.encoders.clone(),
    };
    let files = bench::synth::write_project(&args.out, &spec)?;
    let cache = if files.latents.as_os_str().is_empty() {
        "no cache (image-to-video: `framesmith cache latents --dit`)".to_string()
    } else {
        files.latents.display().to_string()
    };
    println!(
        "wrote {} ({:.2} GiB), {cache}, {}, {}",
        files.dit.display(),
        files.dit_bytes as f64 / (1u64 << 30) as f64,
        files.dataset.display(),
        files.run.display()
    );
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Command::SynthProject(args) = &cli.command {
        // Writes files only: no device to open.
        return synth_project(args);
    }
    let dev = device(cli.device)?;
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = &dev {
        // Keep freed memory in the pool between repetitions, as training does.
        framesmith_nn::cuda::device::set_pool_release_threshold(cuda, u64::MAX)?;
    }
    match cli.command {
        Command::Check => check(&dev),
        Command::Attention(args) => run_attention(&dev, &args),
        Command::Kernels(args) => kernels(&dev, &variant(&args.variant)?, args.tokens, args.iters),
        Command::Linear(args) => run_linear(&dev, &args),
        Command::Step(args) => run_step(&dev, &args),
        Command::Equivalence(args) => run_equivalence(&dev, &args),
        Command::Stream(args) => run_stream(&dev, &args),
        Command::SynthProject(args) => synth_project(&args),
        Command::StageSweep(args) => run_stage_sweep(&dev, &args),
    }
}

/// `attention`: the device checks first when asked, then the timings.
fn run_attention(dev: &Device, args: &AttentionArgs) -> Result<()> {
    if args.check {
        check(dev)?;
    }
    let opts = AttentionBench {
        tokens: args.tokens,
        batch: args.batch,
        iters: args.iters,
        portable: args.portable,
        ..AttentionBench::default()
    };
    let cfg = variant(&args.variant)?;
    report(&bench::attention::run(dev, &cfg, &opts)?);
    Ok(())
}

/// `linear`: the device checks first when asked, then the timings.
fn run_linear(dev: &Device, args: &LinearArgs) -> Result<()> {
    if args.check {
        check(dev)?;
    }
    let opts = LinearBench {
        tokens: args.tokens,
        iters: args.iters,
        ..LinearBench::default()
    };
    let cfg = variant(&args.variant)?;
    report(&bench::linear::run(dev, &cfg, &opts)?);
    Ok(())
}

/// `step`: the tiny config's gradients checked first when asked, then the timed steps.
fn run_step(dev: &Device, args: &StepArgs) -> Result<()> {
    let mode = step_mode(
        &args.backward,
        args.keep_attention,
        args.keep_projection,
        args.no_checkpointing,
    )?;
    if args.check {
        step_check(dev, mode)?;
    }
    let opts = bench::step::StepBench {
        warmup: args.warmup,
        iters: args.iters,
        ..step_bench(&args.workload, mode)?
    };
    let name = &args.variant;
    report(&[bench::step::run(dev, name, &variant(name)?, &opts)?]);
    Ok(())
}

/// `equivalence`: writes the step's files and says what it wrote.
fn run_equivalence(dev: &Device, args: &EquivalenceArgs) -> Result<()> {
    let (name, out) = (&args.variant, &args.out);
    let opts = bench::step::StepBench {
        text_tokens: args.text_tokens,
        seed: args.seed,
        ..step_bench(
            &args.workload,
            step_mode(&args.backward, args.keep_attention, false, false)?,
        )?
    };
    let run = bench::equivalence::write(dev, &variant(name)?, &opts, out)
        .with_context(|| format!("the equivalence step of {name} into {}", out.display()))?;
    println!(
        "equivalence: {name} {} tokens, {} ({}), loss {}, {} LoRA gradients written to {}",
        run.tokens,
        opts.mode.label(),
        args.workload.fp8.as_deref().unwrap_or("bf16"),
        run.loss,
        run.tensors,
        out.display()
    );
    Ok(())
}

/// The streaming benchmark's settings from `stream`'s arguments, with `slots` GPU slots.
fn stream_bench(args: &StreamArgs, slots: usize) -> Result<bench::stream::StreamBench> {
    let workload = &args.workload;
    Ok(bench::stream::StreamBench {
        frames: workload.clip.frames,
        height: workload.clip.height,
        width: workload.clip.width,
        rank: workload.rank,
        fp8: fp8_mode(workload.fp8.as_deref())?,
        residual: match args.residual.as_str() {
            "f32" => candle_core::DType::F32,
            "bf16" => candle_core::DType::BF16,
            other => bail!("unknown residual dtype `{other}` (f32, bf16)"),
        },
        activations_on_host: args.host_activations,
        keep_tapes: args.no_checkpointing,
        keep_attention: args.keep_attention,
        slots,
        staging_slots: args.staging_slots.max(1),
        staging_chunk_bytes: args.staging_chunk_mib.max(1) << 20,
        copy_threads: args.copy_threads,
        copy_unit_bytes: args.copy_unit_kib.max(1) << 10,
        warmup: args.warmup,
        iters: args.iters,
        seed: 0,
    })
}

/// `stream`: streamed and resident gradients compared first when asked, then each case timed.
fn run_stream(dev: &Device, args: &StreamArgs) -> Result<()> {
    let slots = counts("--slots", &args.slots)?;
    let opts = stream_bench(args, slots[0])?;
    let name = args.variant.as_str();
    if args.check {
        stream_check(dev)?;
    }
    let cfg = variant(name)?;
    let cases = stream_cases(&args.modes, args.blocks, &args.placement, &slots)?;
    let vram_budget_gb = args.vram_budget_gb;
    #[cfg(feature = "cuda")]
    let _reservation = match (dev, vram_budget_gb) {
        (Device::Cuda(cuda), Some(gb)) => {
            // GiB, as cards are sized: a "24 GB" card has 24 GiB.
            let r = framesmith_nn::cuda::device::VramReservation::leave_budget(
                cuda,
                (gb * (1u64 << 30) as f64) as u64,
            )?;
            if let Some(r) = &r {
                eprintln!(
                    "stream: reserved {:.2} GiB, leaving a {gb} GiB budget",
                    r.bytes() as f64 / (1u64 << 30) as f64
                );
            }
            r
        }
        _ => None,
    };
    #[cfg(not(feature = "cuda"))]
    let _ = vram_budget_gb;
    if args.bandwidth {
        print_bandwidths(dev, &cfg, &opts, &cases)?;
    }
    let results = bench::stream::run(dev, name, &cfg, &opts, &cases)?;
    for (r, bytes) in &results {
        println!("STREAMED_BYTES_PER_STEP {} {bytes}", r.case);
    }
    let records: Vec<Record> = results.into_iter().map(|(r, _)| r).collect();
    report(&records);
    Ok(())
}

/// Streamed and resident LoRA gradients of a tiny config compared in each mode; an error on a mismatch.
fn stream_check(dev: &Device) -> Result<()> {
    for (what, rel) in bench::stream::check_tiny(dev)? {
        let ok = rel <= 1e-2;
        println!(
            "{} stream tiny(4) LoRA grads streamed ({what}) vs resident: max rel {rel:.2e} (tol 1e-2)",
            if ok { "ok  " } else { "FAIL" }
        );
        if !ok {
            bail!("streamed and resident gradients differ");
        }
    }
    Ok(())
}

/// The cases `--modes` and `--placement` ask for: each streaming mode at each placement and slot count, and the
/// resident case once.
fn stream_cases(
    modes: &str,
    blocks: usize,
    placement: &str,
    slots: &[usize],
) -> Result<Vec<bench::stream::StreamCase>> {
    use framesmith_nn::offload::{StreamMode, StreamPlacement};
    let placements: Vec<StreamPlacement> = match placement {
        "spread" => vec![StreamPlacement::Spread],
        "last" => vec![StreamPlacement::Last],
        "both" => vec![StreamPlacement::Spread, StreamPlacement::Last],
        other => bail!("unknown placement `{other}` (spread, last, both)"),
    };
    let mut cases = Vec::new();
    for m in modes.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let mode = match m {
            "resident" => None,
            "pinned" => Some(StreamMode::Pinned),
            "staged" => Some(StreamMode::Staged),
            other => bail!("unknown mode `{other}` (resident, pinned, staged)"),
        };
        let places = if mode.is_some() {
            placements.clone()
        } else {
            vec![StreamPlacement::Spread]
        };
        let counts = if mode.is_some() { slots } else { &slots[..1] };
        for p in places {
            for &n in counts {
                cases.push(bench::stream::StreamCase {
                    mode,
                    blocks,
                    placement: p,
                    slots: n,
                });
            }
        }
    }
    Ok(cases)
}

/// The copy bandwidths of the streaming modes `cases` use (pinned alone when every case is resident): each costs
/// a model build.
fn print_bandwidths(
    dev: &Device,
    cfg: &WanConfig,
    opts: &bench::stream::StreamBench,
    cases: &[bench::stream::StreamCase],
) -> Result<()> {
    use framesmith_nn::offload::StreamMode;
    let mut measured: Vec<StreamMode> = Vec::new();
    for mode in cases.iter().filter_map(|c| c.mode) {
        if !measured.contains(&mode) {
            measured.push(mode);
        }
    }
    if measured.is_empty() {
        measured.push(StreamMode::Pinned);
    }
    for mode in measured {
        let bw = bench::stream::copy_bandwidth(dev, cfg, opts, mode)?;
        println!(
            "BANDWIDTH {{\"mode\":\"{}\",\"plain_pinned_gbs\":{:.2},\"streaming_gbs\":{:.2},\"ratio\":{:.3},\"block_bytes\":{}}}",
            mode.as_str(),
            bw.plain_gbs,
            bw.streaming_gbs,
            bw.streaming_gbs / bw.plain_gbs.max(1e-9),
            bw.bytes_per_block
        );
    }
    Ok(())
}

/// `stage-sweep`: the streaming path's copy bandwidth for each staging setting, a `SWEEP` JSON line each.
fn run_stage_sweep(dev: &Device, args: &StageSweepArgs) -> Result<()> {
    let sweep = bench::stream::StagingSweep {
        threads: counts("--copy-threads", &args.copy_threads)?,
        chunk_bytes: counts("--staging-chunk-mib", &args.staging_chunk_mib)?
            .into_iter()
            .map(|m| m << 20)
            .collect(),
        rings: counts("--staging-slots", &args.staging_slots)?,
        unit_bytes: counts("--copy-unit-kib", &args.copy_unit_kib)?
            .into_iter()
            .map(|k| k << 10)
            .collect(),
        launch_load: args.launch_load,
        repeats: args.repeats,
    };
    // Only the block's shapes, dtype and the ring's GPU slots matter here.
    let opts = bench::stream::StreamBench {
        frames: 1,
        height: 64,
        width: 64,
        rank: 1,
        fp8: fp8_mode(args.fp8.as_deref())?,
        residual: candle_core::DType::BF16,
        activations_on_host: false,
        keep_tapes: false,
        keep_attention: false,
        slots: 2,
        staging_slots: sweep.rings[0],
        staging_chunk_bytes: sweep.chunk_bytes[0],
        copy_threads: sweep.threads[0],
        copy_unit_bytes: sweep.unit_bytes[0],
        warmup: 0,
        iters: 0,
        seed: 0,
    };
    let cfg = variant(&args.variant)?;
    let (plain, rows) =
        bench::stream::staging_sweep(dev, &cfg, &opts, args.blocks, &sweep, args.passes)?;
    println!("plain pinned copy: {plain:.2} GB/s");
    for r in rows {
        println!("{}", sweep_line(&r, plain));
    }
    Ok(())
}

/// A `SWEEP` JSON line: the row's setting and bandwidth, and its ratio to a plain pinned copy's `plain` GB/s.
fn sweep_line(r: &bench::stream::SweepRow, plain: f64) -> String {
    let o = &r.options;
    // The staging settings mean nothing for pinned streaming.
    let staging = match o.mode {
        framesmith_nn::offload::StreamMode::Staged => format!(
            ",\"copy_threads\":{},\"chunk_mib\":{},\"staging_slots\":{},\"unit_kib\":{}",
            o.copy_threads,
            o.staging_chunk_bytes >> 20,
            o.staging_slots,
            o.copy_unit_bytes >> 10
        ),
        _ => String::new(),
    };
    format!(
        "SWEEP {{\"mode\":\"{}\"{staging},\"launch_load\":{},\"gbs\":{:.2},\"ratio\":{:.3}}}",
        o.mode.as_str(),
        r.launch_load,
        r.gbs,
        r.gbs / plain.max(1e-9)
    )
}
