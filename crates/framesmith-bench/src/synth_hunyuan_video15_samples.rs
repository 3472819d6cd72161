//! `framesmith-bench synth-project --model hunyuan-video15 --sample-files`: the files HunyuanVideo 1.5 generates
//! with besides its DiT, at their released sizes and with random weights, named as ComfyUI's downloads so that
//! `framesmith generate` finds them side by side: the 3-D VAE (`hunyuanvideo15_vae_fp16.safetensors`, official
//! names, bf16), Qwen2.5-VL-7B (`qwen_2.5_vl_7b_fp8_scaled.safetensors`, ComfyUI's scaled-FP8 layout) and the byT5
//! glyph encoder (`byt5_small_glyphxl_fp16.safetensors`, Hugging Face names, byT5-small with Glyph-SDXL-v2's
//! 1510-token vocabulary). For timing generation and samples on a GPU machine with nothing to download.

use std::path::{Path, PathBuf};

use crate::synth::tensors::{encoder_init, mix, write_random_weights, RandomWeight, FP8_MAX};
use framesmith_models::hunyuan_video15::vae::{Hv15Vae, Hv15VaeConfig};
use framesmith_models::qwen25vl::Qwen25VlTextConfig;
use framesmith_models::t5::{hf_t5_tensor_shapes, T5Config};

/// The VAE's file name (ComfyUI's).
pub const VAE_FILE: &str = "hunyuanvideo15_vae_fp16.safetensors";
/// The text encoder's file name (ComfyUI's).
pub const TEXT_ENCODER_FILE: &str = "qwen_2.5_vl_7b_fp8_scaled.safetensors";
/// The glyph encoder's file name (ComfyUI's).
pub const GLYPH_FILE: &str = "byt5_small_glyphxl_fp16.safetensors";

/// What [`write_hv15_sample_files`] wrote.
#[derive(Debug, Clone)]
pub struct Hv15SampleFiles {
    pub vae: PathBuf,
    pub text_encoder: PathBuf,
    pub glyph: PathBuf,
}

/// byT5-small's encoder with Glyph-SDXL-v2's tokens: 12 layers of width 1472, 6 heads of 64, feed-forward 3584.
pub fn glyph_encoder_config() -> T5Config {
    T5Config {
        vocab: 1510,
        dim: 1472,
        dim_attn: 384,
        dim_ffn: 3584,
        num_heads: 6,
        num_layers: 12,
        num_buckets: 32,
        shared_pos: true,
        max_dist: 128,
        eps: 1e-6,
    }
}

/// Writes the three files into `dir` (which exists).
pub fn write_hv15_sample_files(dir: &Path, seed: u64) -> anyhow::Result<Hv15SampleFiles> {
    let vae = dir.join(VAE_FILE);
    let vae_weights = Hv15Vae::tensor_shapes(&Hv15VaeConfig::released())?
        .into_iter()
        .map(|(name, shape)| dense(name, shape));
    write_random_weights(
        &vae,
        vae_weights,
        safetensors::Dtype::BF16,
        None,
        mix(seed, 21),
    )?;

    let text_encoder = dir.join(TEXT_ENCODER_FILE);
    let encoder = Qwen25VlTextConfig::qwen25_vl_7b();
    let encoder_weights = encoder
        .tensor_shapes()
        .into_iter()
        .map(|(name, shape, linear)| {
            let (mean, std) = encoder_init(&name, &shape);
            let fp8_scale = linear.then(|| (6.0 * std).max(f32::MIN_POSITIVE) / FP8_MAX);
            RandomWeight {
                name,
                shape,
                mean,
                std,
                fp8_scale,
            }
        });
    write_random_weights(
        &text_encoder,
        encoder_weights,
        safetensors::Dtype::BF16,
        Some("model."),
        mix(seed, 22),
    )?;

    let glyph = dir.join(GLYPH_FILE);
    let glyph_weights = hf_t5_tensor_shapes(&glyph_encoder_config())
        .into_iter()
        .map(|(name, shape, _)| dense(name, shape));
    write_random_weights(
        &glyph,
        glyph_weights,
        safetensors::Dtype::F16,
        None,
        mix(seed, 23),
    )?;
    Ok(Hv15SampleFiles {
        vae,
        text_encoder,
        glyph,
    })
}

/// A dense random weight with the encoders' statistics.
fn dense(name: String, shape: Vec<usize>) -> RandomWeight {
    let (mean, std) = encoder_init(&name, &shape);
    RandomWeight {
        name,
        shape,
        mean,
        std,
        fp8_scale: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use framesmith_models::hunyuan_video15::byt5::GlyphEncoder;

    #[test]
    fn the_glyph_encoder_is_read_as_the_released_one() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join(GLYPH_FILE);
        let weights = hf_t5_tensor_shapes(&glyph_encoder_config())
            .into_iter()
            .map(|(name, shape, _)| dense(name, shape));
        write_random_weights(&path, weights, safetensors::Dtype::F16, None, 1)?;
        let encoder = GlyphEncoder::load(&path, DType::F32, &Device::Cpu)?;
        assert_eq!(encoder.config(), &glyph_encoder_config());
        let states = encoder.encode_prompt("a sign reading \"OPEN\"")?;
        assert_eq!(states.map(|s| s.dims().to_vec()), Some(vec![14, 1472]));
        Ok(())
    }
}
