//! `framesmith-bench`: GPU benchmarks and device checks, a small binary without GUI dependencies that is carried
//! to the test machine. `check` compares every CUDA kernel with its CPU reference; `attention` and `linear` time
//! Wan shapes (after a correctness check on a small size with `--check`); `synth-project` writes a real-size
//! training project of random weights and caches.

mod cli;

use anyhow::{bail, Context, Result};
use candle_core::Device;
use clap::{Parser, Subcommand};

use cli::audio::{run_audio, AudioArgs};
use cli::ops::{
    check, run_attention, run_attention_fp8, run_kernels, run_linear, AttentionArgs,
    AttentionFp8Args, KernelsArgs, LinearArgs,
};
use cli::step::{run_equivalence, run_step, EquivalenceArgs, StepArgs};
use cli::stream::{run_stage_sweep, run_stream, StageSweepArgs, StreamArgs};
use cli::synth::{synth_project, SynthArgs};
use framesmith_bench::{self as bench, Record};
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
    Check {
        /// Only these groups of checks (e.g. `--only mixed --only norm_mod`); every group when absent. An unknown
        /// name lists the groups.
        #[arg(long)]
        only: Vec<String>,
    },
    /// Time fused attention (self and cross) at a Wan variant's head count.
    Attention(AttentionArgs),
    /// FP8 attention (`model.fp8_attention`) against the bf16 kernel at a Wan variant's shapes: the error of O,
    /// dQ, dK and dV, then both timed, forward and forward+backward.
    AttentionFp8(AttentionFp8Args),
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
    /// LTX-2's audio VAE and vocoder at the file's size: encode, decode and vocode timed, checked against the CPU.
    Ltx2Audio(AudioArgs),
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

fn report(records: &[Record]) {
    for r in records {
        println!("{}", r.json_line());
    }
    print!("{}", bench::table(records));
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
        Command::Check { only } => check(&dev, &only),
        Command::Attention(args) => run_attention(&dev, &args),
        Command::AttentionFp8(args) => run_attention_fp8(&dev, &args),
        Command::Kernels(args) => run_kernels(&dev, &args),
        Command::Linear(args) => run_linear(&dev, &args),
        Command::Step(args) => run_step(&dev, &args),
        Command::Equivalence(args) => run_equivalence(&dev, &args),
        Command::Stream(args) => run_stream(&dev, &args),
        Command::SynthProject(args) => synth_project(&args),
        Command::StageSweep(args) => run_stage_sweep(&dev, &args),
        Command::Ltx2Audio(args) => run_audio(&dev, &args),
    }
}
