//! Exact byte counts of a Wan model's buffers, read from the official tensor list (`weights::official_shapes`) and
//! the dtypes the engine loads each tensor in (`models::wan::block`, `embeddings`, `nn::linear`, `nn::fp8`), and
//! the tokens of a clip through its VAE and patches.

use framesmith_config::plan::FloatDtype;
use framesmith_models::wan::vae::VaeConfig;
use framesmith_models::wan::weights::official_shapes;
use framesmith_models::wan::WanConfig;
use framesmith_nn::lora::{LoraError, LoraTargets};
use framesmith_nn::offload::ALIGN;

use crate::plan::{
    dtype_bytes, elements, fp8_weight_buffers, lora_parameters_of, AdapterCount, BaseFormat,
    LoraShape,
};

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

/// The adapter's size over the whole model on the linears the patterns select (musubi-tuner's rules,
/// `nn::lora::LoraTargets`): `rank × (in + out)` per adapted linear for LoRA, each kind's own count otherwise.
pub fn lora_parameters(cfg: &WanConfig, lora: &LoraShape) -> Result<AdapterCount, LoraError> {
    let targets = LoraTargets::new(&lora.include_patterns, &lora.exclude_patterns)?;
    lora_parameters_of(&official_shapes(cfg), &targets, lora)
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
    if *cfg == crate::family::wan::demo_setup::demo_model_config() {
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
