//! Options shared by the commands that load models: the device, the dtype, and a progress bar that draws only
//! on a terminal.

use std::io::IsTerminal;

use candle_core::{DType, Device};
use clap::ValueEnum;
use framesmith_config::run::DeviceSpec;
use framesmith_nn::device::DeviceError;
use indicatif::{ProgressBar, ProgressStyle};

/// Floating-point dtype of model weights and activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    F32,
    Bf16,
    F16,
}

/// The device named on the command line (`auto`: the first CUDA device if this build has one, else the CPU).
pub fn open_device(spec: DeviceSpec) -> anyhow::Result<Device> {
    let ordinal = match spec {
        DeviceSpec::Cpu => return Ok(Device::Cpu),
        DeviceSpec::Auto if framesmith_nn::device::usable_count() == 0 => return Ok(Device::Cpu),
        DeviceSpec::Auto => 0,
        DeviceSpec::Cuda(i) => i,
    };
    framesmith_nn::device::open_cuda(ordinal).map_err(|e| match e {
        DeviceError::DriverMissing(why) => anyhow::anyhow!("cannot open CUDA device {ordinal}: {why}"),
        e => anyhow::Error::new(e).context(format!(
            "cannot open CUDA device {ordinal}; pass --device cpu, or check the NVIDIA driver and that this build has CUDA"
        )),
    })
}

/// The dtype asked for, else bf16 on a GPU (as the official code runs) and f32 on the CPU (where it is fast).
/// bf16 on the CPU is refused up front: candle's CPU matrix multiply has no bf16 kernel.
pub fn pick_dtype(arg: Option<DtypeArg>, device: &Device) -> anyhow::Result<DType> {
    Ok(match arg {
        Some(DtypeArg::Bf16) if device.is_cpu() => {
            anyhow::bail!(
                "bf16 does not run on the CPU (no bf16 matrix multiply there); use --dtype f32"
            )
        }
        Some(DtypeArg::F32) => DType::F32,
        Some(DtypeArg::Bf16) => DType::BF16,
        Some(DtypeArg::F16) => DType::F16,
        None if device.is_cpu() => DType::F32,
        None => DType::BF16,
    })
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
