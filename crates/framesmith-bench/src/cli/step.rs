//! `step` and `equivalence`: the checkpointed LoRA training step of a whole Wan DiT, timed or written out for
//! the PyTorch reference.

use anyhow::{bail, Context, Result};
use candle_core::Device;

use crate::{fp8_mode, report, variant, Workload};
use framesmith_bench::step::StepMode;
use framesmith_bench::{self as bench};
use framesmith_engine::train::step::BlockBackward;

/// `step`'s arguments.
#[derive(clap::Args)]
pub(crate) struct StepArgs {
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
pub(crate) struct EquivalenceArgs {
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

/// `step`: the tiny config's gradients checked first when asked, then the timed steps.
pub(crate) fn run_step(dev: &Device, args: &StepArgs) -> Result<()> {
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
pub(crate) fn run_equivalence(dev: &Device, args: &EquivalenceArgs) -> Result<()> {
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
