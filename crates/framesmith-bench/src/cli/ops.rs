//! `check`, `attention`, `kernels` and `linear`: the device checks and the timings of single operations.

use anyhow::{bail, Result};
use candle_core::Device;

use crate::{report, variant};
use framesmith_bench::{self as bench, attention::AttentionBench, linear::LinearBench};
use framesmith_models::wan::config::WanConfig;

/// `attention`'s arguments.
#[derive(clap::Args)]
pub(crate) struct AttentionArgs {
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

/// `attention-fp8`'s arguments (read only by a build with cuDNN; without it the command is refused).
#[derive(clap::Args)]
#[cfg_attr(not(feature = "cudnn"), allow(dead_code))]
pub(crate) struct AttentionFp8Args {
    /// Wan variant (t2v-1.3b: 12 heads, t2v-14b: 40 heads; head dim 128).
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
    /// Scale of q and k (1: unit-variance scores; larger: sharper attention).
    #[arg(long, default_value_t = 1.0)]
    qk_gain: f64,
}

/// `kernels`'s arguments.
#[derive(clap::Args)]
pub(crate) struct KernelsArgs {
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
pub(crate) struct LinearArgs {
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

#[cfg(feature = "cuda")]
pub(crate) fn check(dev: &Device, only: &[String]) -> Result<()> {
    let outcomes = framesmith_nn::cuda::check::run_groups(dev, only)?;
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
pub(crate) fn check(_: &Device, _: &[String]) -> Result<()> {
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

/// `attention`: the device checks first when asked, then the timings.
pub(crate) fn run_attention(dev: &Device, args: &AttentionArgs) -> Result<()> {
    if args.check {
        check(dev, &[])?;
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

/// `attention-fp8`: FP8 attention turned on for the device (refused with the reason where it cannot run), its
/// deviation from the bf16 kernel per case and tensor, then both timed.
#[cfg(feature = "cudnn")]
pub(crate) fn run_attention_fp8(dev: &Device, args: &AttentionFp8Args) -> Result<()> {
    framesmith_nn::device::set_fp8_attention(dev, true)?;
    let opts = AttentionBench {
        tokens: args.tokens,
        batch: args.batch,
        iters: args.iters,
        ..AttentionBench::default()
    };
    let cfg = variant(&args.variant)?;
    let (deviations, records) = bench::attention_fp8::run(dev, &cfg, &opts, args.qk_gain)?;
    for r in &deviations {
        println!(
            "FP8_DEVIATION {{\"variant\": \"{}\", \"qk_gain\": {}, \"case\": \"{}\", \"tensor\": \"{}\", \
             \"max_rel\": {:e}, \"mean_rel\": {:e}}}",
            args.variant, args.qk_gain, r.case, r.tensor, r.max_rel, r.mean_rel
        );
    }
    print!("{}", bench::attention_fp8::deviation_table(&deviations));
    report(&records);
    let (fp8_calls, bf16_calls) = framesmith_nn::attention::fp8_calls();
    let saturated = match dev {
        Device::Cuda(cuda) => framesmith_nn::cuda::attention_fp8::saturations(cuda)?,
        _ => 0,
    };
    println!(
        "FP8 attention: {fp8_calls} passes in FP8, {bf16_calls} refused to bf16, {saturated} gradient tensors \
         saturated"
    );
    Ok(())
}

#[cfg(not(feature = "cudnn"))]
pub(crate) fn run_attention_fp8(_: &Device, _: &AttentionFp8Args) -> Result<()> {
    bail!("FP8 attention needs a build with the cudnn feature")
}

/// `kernels`: the element-wise kernels timed at the variant's activation shapes.
pub(crate) fn run_kernels(dev: &Device, args: &KernelsArgs) -> Result<()> {
    kernels(dev, &variant(&args.variant)?, args.tokens, args.iters)
}

/// `linear`: the device checks first when asked, then the timings.
pub(crate) fn run_linear(dev: &Device, args: &LinearArgs) -> Result<()> {
    if args.check {
        check(dev, &[])?;
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
