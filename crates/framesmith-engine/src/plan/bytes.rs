//! Exact byte counts of the model's buffers, read from the official tensor list (`weights::official_shapes`) and
//! the dtypes the engine loads each tensor in (`models::wan::block`, `embeddings`, `nn::linear`, `nn::fp8`).

use framesmith_config::plan::FloatDtype;
use framesmith_config::run::{BaseDtype, Fp8ScaleMode};
use framesmith_models::wan::vae::VaeConfig;
use framesmith_models::wan::weights::official_shapes;
use framesmith_models::wan::WanConfig;
use framesmith_nn::fp8::{self, Fp8Scale};
use framesmith_nn::lora::{check_rank, LoraError, LoraTargets};
use framesmith_nn::offload::ALIGN;

/// How the frozen block linears are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseFormat {
    /// Dense, in this dtype (which is also the compute dtype).
    Dense(FloatDtype),
    /// FP8 e4m3 codes (1 byte each) with f32 scales grouped as given.
    Fp8(Fp8ScaleMode),
}

impl BaseFormat {
    /// The format a config's `base_dtype` / `fp8_scale` name.
    pub fn from_config(base: BaseDtype, scale: Fp8ScaleMode) -> Self {
        match base {
            BaseDtype::F32 => Self::Dense(FloatDtype::F32),
            BaseDtype::Bf16 => Self::Dense(FloatDtype::Bf16),
            BaseDtype::F16 => Self::Dense(FloatDtype::F16),
            BaseDtype::Fp8 => Self::Fp8(scale),
        }
    }

    /// The dtype activations and dequantised weights are computed in (bf16 for FP8, as validation resolves it).
    pub fn compute_dtype(self) -> FloatDtype {
        match self {
            Self::Dense(d) => d,
            Self::Fp8(_) => FloatDtype::Bf16,
        }
    }

    /// Short name ("fp8 block64", "bf16").
    pub fn label(self) -> String {
        match self {
            Self::Dense(d) => dtype_name(d).to_string(),
            Self::Fp8(mode) => format!("fp8 {}", fp8_scale(mode)),
        }
    }
}

/// Bytes per element of a float dtype.
pub fn dtype_bytes(d: FloatDtype) -> u64 {
    match d {
        FloatDtype::F32 => 4,
        FloatDtype::Bf16 | FloatDtype::F16 => 2,
    }
}

/// The dtype's name as configs spell it.
pub fn dtype_name(d: FloatDtype) -> &'static str {
    match d {
        FloatDtype::F32 => "f32",
        FloatDtype::Bf16 => "bf16",
        FloatDtype::F16 => "f16",
    }
}

/// The engine's scale mode for a config's.
pub fn fp8_scale(mode: Fp8ScaleMode) -> Fp8Scale {
    match mode {
        Fp8ScaleMode::Tensor => Fp8Scale::Tensor,
        Fp8ScaleMode::Channel => Fp8Scale::Channel,
        Fp8ScaleMode::Block64 => Fp8Scale::Block64,
    }
}

fn elements(shape: &[usize]) -> u64 {
    shape.iter().map(|&n| n as u64).product()
}

/// Bytes of one FP8 weight `[out, in]` as (codes, scales): a code byte per value and 4 bytes per scale (as
/// `Fp8Weight::storage_bytes`; block-64 falls back to per-channel when `in` is not a multiple of 64, as
/// `fp8::effective_mode` decides).
pub fn fp8_weight_buffers(out_dim: usize, in_dim: usize, mode: Fp8ScaleMode) -> (u64, u64) {
    let mode = fp8::effective_mode(fp8_scale(mode), in_dim);
    let scales: usize = fp8::scale_dims(mode, out_dim, in_dim).iter().product();
    ((out_dim * in_dim) as u64, 4 * scales as u64)
}

/// Bytes of one FP8 weight `[out, in]`, codes and scales together.
pub fn fp8_weight_bytes(out_dim: usize, in_dim: usize, mode: Fp8ScaleMode) -> u64 {
    let (codes, scales) = fp8_weight_buffers(out_dim, in_dim, mode);
    codes + scales
}

/// What a block's tensor is, by its official name under `blocks.N.`.
enum BlockTensor {
    /// A linear weight `[out, in]`: stored in the base format.
    LinearWeight,
    /// `norm3.*` and `modulation`: kept in f32 (the block's modulation arithmetic runs in f32).
    F32,
    /// Biases and q/k RMSNorm weights: the compute dtype.
    Compute,
}

fn classify(rest: &str, shape: &[usize]) -> BlockTensor {
    if rest.starts_with("norm3.") || rest == "modulation" {
        BlockTensor::F32
    } else if shape.len() == 2 && rest.ends_with(".weight") {
        BlockTensor::LinearWeight
    } else {
        BlockTensor::Compute
    }
}

/// The size of every frozen buffer of one block as the engine holds it, in no particular order: linear weights in
/// `base` (an FP8 weight is two buffers, codes and scales), biases and q/k norms in the compute dtype, `norm3` and
/// `modulation` in f32. Every block of a Wan model has the same buffers.
pub fn block_buffers(cfg: &WanConfig, base: BaseFormat) -> Vec<u64> {
    let compute = dtype_bytes(base.compute_dtype());
    let mut out = Vec::new();
    for (name, shape) in official_shapes(cfg) {
        let Some(rest) = name.strip_prefix("blocks.0.") else {
            continue;
        };
        match (classify(rest, &shape), base) {
            (BlockTensor::LinearWeight, BaseFormat::Dense(d)) => {
                out.push(elements(&shape) * dtype_bytes(d))
            }
            (BlockTensor::LinearWeight, BaseFormat::Fp8(mode)) => {
                let (codes, scales) = fp8_weight_buffers(shape[0], shape[1], mode);
                out.extend([codes, scales]);
            }
            (BlockTensor::F32, _) => out.push(elements(&shape) * 4),
            (BlockTensor::Compute, _) => out.push(elements(&shape) * compute),
        }
    }
    out
}

/// Bytes of one block's frozen tensors (what a copy moves).
pub fn block_data_bytes(cfg: &WanConfig, base: BaseFormat) -> u64 {
    block_buffers(cfg, base).iter().sum()
}

/// Bytes of one block packed for streaming: every buffer starts at a multiple of `nn::offload::ALIGN`, as
/// `BlockLayout` packs them. The size of a GPU slot, a pinned master and a staging buffer; a resident block holds
/// [`block_data_bytes`].
pub fn block_bytes(cfg: &WanConfig, base: BaseFormat) -> u64 {
    let align = ALIGN as u64;
    block_buffers(cfg, base)
        .iter()
        .map(|b| b.div_ceil(align) * align)
        .sum()
}

/// The weights that always stay on the GPU, by component, with their bytes: the time embedding, time projection
/// and head are built in f32 (`embeddings::TimeEmbedding`, `block::Head`), the rest in the compute dtype.
pub fn resident_weights(cfg: &WanConfig, compute: FloatDtype) -> Vec<(&'static str, u64)> {
    const GROUPS: [(&str, &str); 6] = [
        ("patch_embedding.", "patch embedding"),
        ("text_embedding.", "text embedding"),
        ("time_embedding.", "time embedding and projection"),
        ("time_projection.", "time embedding and projection"),
        ("head.", "head"),
        ("img_emb.", "CLIP image embedding"),
    ];
    let mut out: Vec<(&'static str, u64)> = Vec::new();
    for (name, shape) in official_shapes(cfg) {
        let Some(&(prefix, label)) = GROUPS.iter().find(|(p, _)| name.starts_with(p)) else {
            continue;
        };
        let f32_kept = matches!(prefix, "time_embedding." | "time_projection." | "head.");
        let bytes = elements(&shape) * if f32_kept { 4 } else { dtype_bytes(compute) };
        match out.iter_mut().find(|(l, _)| *l == label) {
            Some((_, total)) => *total += bytes,
            None => out.push((label, bytes)),
        }
    }
    out
}

/// LoRA parameters over the whole model for `rank` on the linears the patterns select (musubi-tuner's rules,
/// `nn::lora::LoraTargets`): `rank × (in + out)` per adapted linear. Returns (parameters, adapted linears).
pub fn lora_parameters(
    cfg: &WanConfig,
    rank: usize,
    include: &[String],
    exclude: &[String],
) -> Result<(u64, usize), LoraError> {
    let targets = LoraTargets::new(include, exclude)?;
    lora_parameters_of(&official_shapes(cfg), &targets, rank)
}

/// [`lora_parameters`] for any model, from its official `(name, shape)` list and its `targets`; a rank above the
/// narrowest adapted linear is refused (`nn::lora::check_rank`).
pub fn lora_parameters_of(
    shapes: &[(String, Vec<usize>)],
    targets: &LoraTargets,
    rank: usize,
) -> Result<(u64, usize), LoraError> {
    let adapted: Vec<(&str, [usize; 2])> = shapes
        .iter()
        .filter_map(
            |(name, shape)| match (name.strip_suffix(".weight"), shape.as_slice()) {
                (Some(module), &[out_dim, in_dim]) if targets.matches(module) => {
                    Some((module, [in_dim, out_dim]))
                }
                _ => None,
            },
        )
        .collect();
    check_rank(rank, adapted.iter().copied())?;
    let params = adapted
        .iter()
        .map(|(_, [in_dim, out_dim])| rank as u64 * (in_dim + out_dim) as u64)
        .sum();
    Ok((params, adapted.len()))
}

/// The VAE a DiT is trained with: Wan 2.2's 16× VAE for 48-channel latents (TI2V-5B), else Wan 2.1's 8× VAE.
pub fn vae_for(cfg: &WanConfig) -> VaeConfig {
    if cfg.latent_channels() == VaeConfig::wan22().z_dim {
        VaeConfig::wan22()
    } else {
        VaeConfig::wan21()
    }
}

/// Spatial and temporal compression of the latents `cfg` trains on: the demo codec's (4×, 4×) for the demo
/// model, else its VAE's.
pub fn latent_factors(cfg: &WanConfig) -> (usize, usize) {
    if *cfg == crate::train::demo_setup::demo_model_config() {
        return (crate::demo::codec::FACTOR, crate::demo::codec::TEMPORAL);
    }
    let vae = vae_for(cfg);
    (vae.spatial_factor(), vae.temporal_factor())
}

/// Transformer tokens of one sample: latent frames × latent height × latent width, each divided by the patch size.
/// `None` when the size does not divide into whole patches (or the count does not fit a `usize`).
pub fn tokens_per_sample(
    cfg: &WanConfig,
    width: usize,
    height: usize,
    frames: usize,
) -> Option<u64> {
    let (spatial, temporal) = latent_factors(cfg);
    let [pt, ph, pw] = cfg.patch_size;
    let latent_frames = 1 + frames.saturating_sub(1) / temporal;
    let whole = |n: usize, d: usize| (d > 0 && n > 0 && n % d == 0).then(|| n / d);
    let f = whole(latent_frames, pt)?;
    let h = whole(whole(height, spatial)?, ph)?;
    let w = whole(whole(width, spatial)?, pw)?;
    f.checked_mul(h)?.checked_mul(w).map(|n| n as u64)
}
