//! Validation of `[model]`: the DiT and the files that go with it (VAE, text encoder, CLIP, a Wan2.2 A14B's
//! low-noise expert and its device), the variant, and FP8 storage and products.

use super::family::rules;
use super::plan::{
    FloatDtype, HostInfo, LowNoisePlan, ModelFamily, ModelPlan, ModelSource, PlanDevice,
};
use super::run::{BaseDtype, DeviceSpec, ExpertMode, Fp8ScaleMode, ModelSection, RunConfig};
use super::validate::{cuda_devices_here, non_empty, Checker};
use crate::catalog;

pub(crate) fn check_model(
    c: &mut Checker,
    cfg: &RunConfig,
    device: PlanDevice,
    family: ModelFamily,
) -> ModelPlan {
    let m = &cfg.model;
    let source = if m.demo {
        if non_empty(&m.dit).is_some() {
            c.note("model.dit is ignored: model.demo = true trains the built-in tiny model");
        }
        ModelSource::Demo
    } else if let Some(dit) = non_empty(&m.dit) {
        c.existing("model.dit", &dit, "DiT checkpoint");
        ModelSource::File(dit)
    } else {
        c.required(
            "model.dit",
            "no DiT checkpoint is set",
            "set model.dit to the Wan DiT file or folder, or model.demo = true for the built-in tiny model",
        );
        ModelSource::Demo
    };
    let variant = check_variant(c, &m.variant, m.demo);
    let vae = non_empty(&m.vae);
    if let Some(p) = &vae {
        c.existing("model.vae", p, "VAE checkpoint");
    }
    let text_encoder = non_empty(&m.text_encoder);
    if let Some(p) = &text_encoder {
        c.existing("model.text_encoder", p, "text encoder checkpoint");
    }
    let clip = non_empty(&m.clip);
    if let Some(p) = &clip {
        c.existing("model.clip", p, rules(family).clip_file());
    }
    let low_noise = check_low_noise(c, m);
    if m.base_dtype == BaseDtype::Fp8 && device == PlanDevice::Cpu {
        c.note("FP8 base weights are dequantised on every use on the CPU; f32 is faster there");
    }
    check_fp8_matmul(c, m, device);
    let compute_dtype = match m.base_dtype {
        BaseDtype::F32 => FloatDtype::F32,
        BaseDtype::F16 => FloatDtype::F16,
        BaseDtype::Bf16 | BaseDtype::Fp8 => FloatDtype::Bf16,
    };
    check_fp8_attention(c, m, device, compute_dtype);
    ModelPlan {
        source,
        variant,
        vae,
        text_encoder,
        clip,
        low_noise,
        base_dtype: m.base_dtype,
        fp8_scale: (m.base_dtype == BaseDtype::Fp8).then_some(m.effective_fp8_scale()),
        residual_dtype: m.residual_dtype,
        fp8_matmul: m.fp8_matmul,
        fp8_attention: m.fp8_attention,
        compute_dtype,
    }
}

/// `model.fp8_attention` needs a GPU and bf16 activations (cuDNN's FP8 attention reads bf16 and writes bf16). Whether
/// the card and cuDNN have it is checked when the run opens the GPU.
fn check_fp8_attention(c: &mut Checker, m: &ModelSection, device: PlanDevice, compute: FloatDtype) {
    if !m.fp8_attention {
        return;
    }
    if device == PlanDevice::Cpu {
        c.problem(
            "model.fp8_attention",
            "FP8 attention is cuDNN's fused FP8 attention, on NVIDIA GPUs (Hopper or newer), not on the CPU",
            "set fp8_attention = false to train on the CPU",
        );
    } else if compute != FloatDtype::Bf16 {
        c.problem(
            "model.fp8_attention",
            format!(
                "FP8 attention takes bf16 activations, but base_dtype = \"{}\" computes in {}",
                format!("{:?}", m.base_dtype).to_lowercase(),
                format!("{compute:?}").to_lowercase()
            ),
            "set base_dtype = \"bf16\" or \"fp8\", or fp8_attention = false",
        );
    }
}

/// `model.fp8_matmul` needs an FP8 base on a GPU; block-64 weights are then held per channel (a note says so).
fn check_fp8_matmul(c: &mut Checker, m: &ModelSection, device: PlanDevice) {
    if !m.fp8_matmul {
        return;
    }
    if m.base_dtype != BaseDtype::Fp8 {
        c.problem(
            "model.fp8_matmul",
            format!(
                "FP8 matrix products need FP8 base weights, but base_dtype is \"{}\"",
                format!("{:?}", m.base_dtype).to_lowercase()
            ),
            "set base_dtype = \"fp8\", or fp8_matmul = false",
        );
    } else if device == PlanDevice::Cpu {
        c.problem(
            "model.fp8_matmul",
            "FP8 matrix products run on NVIDIA GPUs with FP8 tensor cores, not on the CPU",
            "set fp8_matmul = false to train on the CPU",
        );
    } else if m.fp8_scale == Fp8ScaleMode::Block64 {
        c.note(
            "model.fp8_matmul: FP8 products take one scale per output channel, so the base is held with \
             fp8_scale = \"channel\" (block-64 FP8 files are quantised again per channel at load)",
        );
    }
}

/// `model.dit_low_noise` and what goes with it: the file exists, the boundary is a fraction, and nothing is set
/// that a one-expert run would ignore without a word.
fn check_low_noise(c: &mut Checker, m: &ModelSection) -> Option<LowNoisePlan> {
    let b = m.expert_boundary;
    let boundary = (b != 0.0).then_some(b);
    if !(b.is_finite() && (0.0..1.0).contains(&b)) {
        c.problem(
            "model.expert_boundary",
            format!("must be a fraction of the timesteps in (0, 1), or 0 for the model's, not {b}"),
            "use e.g. expert_boundary = 0.875 (the official text-to-video boundary), or 0",
        );
    }
    let Some(dit) = non_empty(&m.dit_low_noise) else {
        if boundary.is_some() || m.experts != ExpertMode::Joint {
            c.note(
                "model.experts and model.expert_boundary apply only with model.dit_low_noise (both Wan2.2 A14B \
                 experts in one run)",
            );
        }
        return None;
    };
    if m.demo {
        c.note("model.dit_low_noise is ignored: model.demo = true trains the built-in tiny model");
        return None;
    }
    c.existing("model.dit_low_noise", &dit, "low-noise expert checkpoint");
    if dit == m.dit {
        c.problem(
            "model.dit_low_noise",
            "is the same file as model.dit",
            "set model.dit to the high-noise expert and model.dit_low_noise to the low-noise expert",
        );
    }
    Some(LowNoisePlan {
        dit,
        mode: m.experts,
        boundary,
        device: None,
    })
}

/// `training.low_noise_device`: empty, or a device other than the run's (`high`) that this machine has. The CPU
/// is taken only beside a CPU run (both experts kept loaded, none parked).
pub(crate) fn check_low_noise_device(
    c: &mut Checker,
    text: &str,
    high: PlanDevice,
    host: &HostInfo,
) -> Option<PlanDevice> {
    const KEY: &str = "training.low_noise_device";
    const FIX: &str = "set training.low_noise_device = \"cuda:1\" (a GPU other than training.device's), or leave it \
                       empty to keep both experts on training.device, one at a time";
    if text.trim().is_empty() {
        return None;
    }
    let device = match text.parse::<DeviceSpec>() {
        Ok(DeviceSpec::Cuda(n)) if n < host.cuda_devices => PlanDevice::Cuda(n),
        Ok(DeviceSpec::Cuda(n)) => {
            c.problem(
                KEY,
                format!("cuda:{n} is not available: {}", cuda_devices_here(host)),
                FIX,
            );
            return None;
        }
        Ok(DeviceSpec::Cpu) if high == PlanDevice::Cpu => PlanDevice::Cpu,
        Ok(other) => {
            c.problem(
                KEY,
                format!("is \"{other}\": it names the GPU that holds the low-noise expert"),
                FIX,
            );
            return None;
        }
        Err(why) => {
            c.problem(KEY, why, FIX);
            return None;
        }
    };
    if device == high && device != PlanDevice::Cpu {
        c.problem(KEY, format!("is training.device's GPU ({text})"), FIX);
        return None;
    }
    Some(device)
}

fn check_variant(c: &mut Checker, variant: &str, demo: bool) -> Option<String> {
    if variant.eq_ignore_ascii_case("auto") {
        return None;
    }
    if demo {
        c.note(format!(
            "model.variant = \"{variant}\" is ignored: the demo model has its own shape"
        ));
        return None;
    }
    if catalog::variant(variant).is_some() {
        return Some(variant.to_ascii_lowercase());
    }
    c.problem(
        "model.variant",
        format!("unknown variant `{variant}`"),
        format!(
            "use \"auto\" (detect from the file) or one of {}",
            catalog::variant_names()
        ),
    );
    None
}
