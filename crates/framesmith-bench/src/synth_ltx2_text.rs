//! `framesmith-bench synth-project --model ltx2-text`: what `framesmith cache text` needs for LTX-2 at the
//! released sizes, with nothing to download — a random Gemma 3 12B in ComfyUI's scaled-FP8 layout
//! (`gemma_3_12B_it_fp8_scaled.safetensors`: `model.layers.*`, the linears float8_e4m3fn with a per-tensor
//! `scale_weight`, the rest bf16), an LTX-2 checkpoint holding the text side at its released size in bf16 (the
//! feature extractor's projection and the video connector under the official names, the `config` metadata; of the
//! transformer only the embedders that name the file LTX-2's, which the text pass never reads) and `captions`
//! captioned stand-in images with their dataset config. LTX-2 (19B)'s text side is ltx-core's defaults (V1
//! features to 3840, a 2-layer connector of 30 heads of 128); LTX-2.3 (22B)'s connector sizes are not in the
//! official code, so the one written here is an assumption stated in [`ltx23_text`] (V2 features to 4096, an
//! 8-layer gated connector of 32 heads of 128). Every prompt is padded to 1024 tokens, so the work per caption does
//! not depend on the tokenizer (the fixture's small one serves).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::synth::tensors::{
    mix, write_random_weights, write_random_weights_with_metadata, RandomWeight, FP8_MAX,
};
use crate::synth::{image_dataset_toml, write_stand_in_image};
use framesmith_models::gemma3::Gemma3TextConfig;
use framesmith_models::ltx2::config::Ltx2Config;
use framesmith_models::ltx2::text::Ltx2TextConfig;
use framesmith_models::ltx2::weights::video_stream_shapes;
use framesmith_models::ltx2::Ltx2Version;

/// The Gemma file's name.
pub const GEMMA_FILE: &str = "gemma_3_12B_it_fp8_scaled.safetensors";
/// The captions' dataset config.
pub const CAPTIONS_DATASET_FILE: &str = "captions.toml";
/// Side of the stand-in images.
const IMAGE_SIDE: u32 = 64;

/// What was written.
#[derive(Debug, Clone)]
pub struct Ltx2TextFiles {
    pub gemma: PathBuf,
    pub checkpoint: PathBuf,
    pub captions: PathBuf,
}

/// LTX-2.3's text side as written here: V2 features (all four caption-projection keys) to the transformer's
/// 4096, and a connector of 32 heads of 128 (the width the features must have), 8 layers, gated attention like
/// the transformer's, RoPE max position 4096 — an assumption, as the official code does not state them.
pub fn ltx23_text() -> anyhow::Result<Ltx2TextConfig> {
    Ltx2TextConfig::from_transformer_json(&serde_json::json!({
        "num_attention_heads": 32, "attention_head_dim": 128,
        "caption_proj_before_connector": true, "caption_projection_first_linear": false,
        "caption_proj_input_norm": false, "caption_projection_second_linear": false,
        "connector_num_attention_heads": 32, "connector_attention_head_dim": 128, "connector_num_layers": 8,
        "connector_apply_gated_attention": true, "connector_positional_embedding_max_pos": [4096],
        "rope_type": "split", "frequencies_precision": "float64",
    }))
    .map_err(|e| anyhow::anyhow!(e))
}

/// The release's transformer config and text side.
fn release(version: Ltx2Version) -> anyhow::Result<(Ltx2Config, Ltx2TextConfig)> {
    Ok(match version {
        Ltx2Version::Ltx2 => (
            Ltx2Config::ltx2_19b(),
            Ltx2TextConfig::from_transformer_json(
                &serde_json::json!({"frequencies_precision": "float64"}),
            )
            .map_err(|e| anyhow::anyhow!(e))?,
        ),
        Ltx2Version::Ltx23 => (Ltx2Config::ltx23_22b(), ltx23_text()?),
    })
}

/// Mean and standard deviation of a random text-side tensor: Gemma's norm weights 0 (its norms scale by
/// `1 + w`), the connector's q / k norms 1, biases 0 ± 0.05, the registers and Gemma's embedding unit normal,
/// other weights 0 ± 1/√fan_in.
fn init(name: &str, shape: &[usize]) -> (f32, f32) {
    let fan_in: usize = shape.iter().skip(1).product();
    if name.contains("layernorm")
        || name.starts_with("norm.")
        || name.contains("self_attn.q_norm")
        || name.contains("self_attn.k_norm")
    {
        (0.0, 0.0)
    } else if name.contains("_norm.") {
        (1.0, 0.0)
    } else if name.ends_with(".bias") {
        (0.0, 0.05)
    } else if name.contains("embed_tokens") || name.contains("learnable_registers") {
        (0.0, 1.0)
    } else {
        (0.0, 1.0 / (fan_in.max(1) as f32).sqrt())
    }
}

/// Writes a random Gemma 3 text model of `cfg` (ComfyUI's single-file names, linears with FP8 scales) into `dir`.
fn write_gemma(
    dir: &Path,
    cfg: &Gemma3TextConfig,
    seed: u64,
) -> anyhow::Result<std::path::PathBuf> {
    let gemma = dir.join(GEMMA_FILE);
    let weights = cfg
        .tensor_shapes()
        .into_iter()
        .map(|(name, shape, linear)| {
            let (mean, std) = init(&name, &shape);
            RandomWeight {
                fp8_scale: linear.then(|| (6.0 * std).max(f32::MIN_POSITIVE) / FP8_MAX),
                name,
                shape,
                mean,
                std,
            }
        });
    write_random_weights(
        &gemma,
        weights,
        safetensors::Dtype::BF16,
        Some("model."),
        mix(seed, 3),
    )?;
    Ok(gemma)
}

/// Writes the files for `version` into `dir`: Gemma, the checkpoint (`ltx-2-19b-text-synth.safetensors` or
/// `ltx-2.3-22b-text-synth.safetensors`) and `captions` captioned images.
pub fn write_ltx2_text_files(
    dir: &Path,
    version: Ltx2Version,
    captions: usize,
    seed: u64,
) -> anyhow::Result<Ltx2TextFiles> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let gemma_cfg = Gemma3TextConfig::gemma3_12b();
    let gemma = write_gemma(dir, &gemma_cfg, seed)?;

    let (cfg, text) = release(version)?;
    let stem = match version {
        Ltx2Version::Ltx2 => "ltx-2-19b-text-synth",
        Ltx2Version::Ltx23 => "ltx-2.3-22b-text-synth",
    };
    let checkpoint = dir.join(format!("{stem}.safetensors"));
    // The transformer's embedders only: what names the file an LTX-2 checkpoint.
    let markers = video_stream_shapes(&cfg)
        .into_iter()
        .filter(|(n, _)| {
            !n.starts_with("transformer_blocks.") || n == "transformer_blocks.0.attn1.q_norm.weight"
        })
        .map(|(n, s)| (format!("model.diffusion_model.{n}"), s));
    let text_shapes = text
        .tensor_shapes(gemma_cfg.hidden_size, gemma_cfg.num_hidden_layers + 1)
        .into_iter()
        .map(|(n, s, _)| (n, s));
    let weights = markers.chain(text_shapes).map(|(name, shape)| {
        let (mean, std) = init(&name, &shape);
        RandomWeight {
            name,
            shape,
            mean,
            std,
            fp8_scale: None,
        }
    });
    let mut section = serde_json::to_value(&cfg)?;
    if let Some(map) = section.as_object_mut() {
        // LTX-2's config names none of LTX-2.3's caption-projection keys (ltx-core refuses a partial set).
        map.remove("caption_proj_before_connector");
        map.extend(text.transformer_keys());
    }
    let metadata = std::collections::HashMap::from([(
        "config".to_string(),
        serde_json::json!({ "transformer": section }).to_string(),
    )]);
    write_random_weights_with_metadata(
        &checkpoint,
        weights,
        safetensors::Dtype::BF16,
        mix(seed, 5),
        metadata,
    )?;

    let words = [
        "a", "red", "fox", "runs", "through", "deep", "snow", "at", "dawn", "while", "mist",
        "rises", "over", "the", "frozen", "lake", "and", "camera", "pans", "slowly",
    ];
    let images = dir.join("captions");
    for i in 0..captions {
        let n = 1 + (i * 7) % 60;
        let caption: Vec<&str> = (0..n).map(|j| words[(i + j * 3) % words.len()]).collect();
        write_stand_in_image(
            &images,
            &format!("caption_{i:04}"),
            (IMAGE_SIDE, IMAGE_SIDE),
            &caption.join(" "),
        )?;
    }
    let dataset = dir.join(CAPTIONS_DATASET_FILE);
    let header =
        "framesmith-bench synth-project --model ltx2-text: captioned grey images, for timing\n\
                  `framesmith cache text` with Gemma 3 12B and an LTX-2 checkpoint's text side.";
    let side = IMAGE_SIDE as usize;
    fs::write(
        &dataset,
        image_dataset_toml(header, ("captions", "captions_cache"), (side, side)),
    )
    .with_context(|| format!("cannot write {}", dataset.display()))?;
    Ok(Ltx2TextFiles {
        gemma,
        checkpoint,
        captions: dataset,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_release_text_sides_fit_gemma_3_12b() -> anyhow::Result<()> {
        let (cfg, text) = release(Ltx2Version::Ltx2)?;
        assert_eq!(
            (text.output_width(), cfg.caption_channels),
            (3840, Some(3840))
        );
        let (cfg, text) = release(Ltx2Version::Ltx23)?;
        assert_eq!(text.output_width(), cfg.inner_dim());
        let shapes = text.tensor_shapes(3840, 49);
        assert_eq!(shapes[0].1, vec![4096, 3840 * 49]);
        Ok(())
    }
}
