//! Options shared by the commands that load models: the device, the dtype, and a progress bar that draws only
//! on a terminal.

use std::io::IsTerminal;

use candle_core::{DType, Device};
use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};

/// Floating-point dtype of model weights and activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    F32,
    Bf16,
    F16,
}

impl From<DtypeArg> for DType {
    fn from(arg: DtypeArg) -> Self {
        match arg {
            DtypeArg::F32 => DType::F32,
            DtypeArg::Bf16 => DType::BF16,
            DtypeArg::F16 => DType::F16,
        }
    }
}

/// The device named on the command line (`auto`: the first CUDA device if this build has one, else the CPU).
pub use framesmith_engine::generate::request::open_device;

/// The dtype asked for, else bf16 on a GPU and f32 on the CPU; bf16 on the CPU is refused (the engine's
/// [`framesmith_engine::generate::request::pick_dtype`]).
pub fn pick_dtype(arg: Option<DtypeArg>, device: &Device) -> anyhow::Result<DType> {
    framesmith_engine::generate::request::pick_dtype(arg.map(DType::from), device)
}

/// A progress bar with `template` on a terminal; hidden otherwise (lines are then printed by the caller).
pub fn progress_bar(len: u64, template: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// A `--vram-budget-gb` flag in bytes: a positive number of GiB, or an error naming the flag.
pub fn vram_budget_bytes(gb: Option<f64>) -> anyhow::Result<Option<u64>> {
    Ok(match gb {
        Some(gb) if gb.is_finite() && gb > 0.0 => Some((gb * (1u64 << 30) as f64) as u64),
        Some(gb) => anyhow::bail!("--vram-budget-gb {gb}: give a positive number of GiB"),
        None => None,
    })
}
