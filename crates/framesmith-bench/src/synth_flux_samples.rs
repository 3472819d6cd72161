//! `framesmith-bench synth-project --model flux-dev --sample-files`: what samples during FLUX.1 training need beside
//! the DiT, at the released sizes and in the released layouts with random weights — `ae.safetensors`,
//! `clip/clip_l.safetensors` and `t5/t5xxl_fp16.safetensors` (each beside a word-level `tokenizer.json`: the real
//! vocabularies cannot be made up, and the DiT does not care which tokens it reads) — and a one-line prompt file,
//! so `bench/run-flux.sh samples` times a run that samples on a GPU machine with nothing to download.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::synth::tensors::{encoder_init, mix, write_safetensors, RandomTensor, SynthTensor};
use framesmith_models::flux::autoencoder::{AutoEncoder, AutoEncoderConfig};
use framesmith_models::flux::clip_text::{ClipTextConfig, ClipTextModel};
use framesmith_models::t5::v1_1::t5_v1_1_xxl;
use framesmith_models::t5::{hf_t5_tensor_shapes, T5Config};

/// The words of the stand-in tokenizers (any other word reads as the first).
const WORDS: [&str; 6] = ["thing", "a", "synthetic", "image", "of", "snow"];

/// The sizes of the sample files: the released ones ([`FluxEncoderSizes::released`]) or small ones for tests.
#[derive(Debug, Clone)]
pub struct FluxEncoderSizes {
    pub autoencoder: AutoEncoderConfig,
    pub clip: ClipTextConfig,
    pub t5: T5Config,
}

impl FluxEncoderSizes {
    /// FLUX.1's autoencoder, CLIP-L (openai/clip-vit-large-patch14's text model) and T5-XXL v1.1.
    pub fn released() -> Self {
        Self {
            autoencoder: AutoEncoderConfig::flux1(),
            clip: ClipTextConfig::clip_l(),
            t5: t5_v1_1_xxl(),
        }
    }
}

/// What [`write_flux_sample_files`] wrote.
#[derive(Debug, Clone)]
pub struct FluxSampleFiles {
    pub autoencoder: PathBuf,
    pub clip_l: PathBuf,
    pub t5: PathBuf,
    pub prompts: PathBuf,
}

/// A random file of `shapes` in `dtype`, drawn with the encoders' statistics (norms one, biases zero).
fn write_random(
    path: &Path,
    shapes: Vec<(String, Vec<usize>)>,
    dtype: safetensors::Dtype,
    seed: u64,
) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let views = shapes
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let (mean, std) = encoder_init(&name, &shape);
            let tensor = RandomTensor {
                shape,
                dtype,
                mean,
                std,
                seed: mix(seed, i as u64),
                fp8_scale: None,
            };
            (name, SynthTensor::Random(tensor))
        })
        .collect();
    write_safetensors(path, views)
}

/// Writes the autoencoder (bf16), CLIP-L and T5-XXL (f16, Hugging Face names) of `sizes` with their tokenizers
/// into `dir`, and `prompts.txt`: one prompt of `width` × `height`, 20 steps, guidance 3.5.
pub fn write_flux_sample_files(
    dir: &Path,
    sizes: &FluxEncoderSizes,
    (width, height): (usize, usize),
    seed: u64,
) -> anyhow::Result<FluxSampleFiles> {
    let autoencoder = dir.join("ae.safetensors");
    let shapes = AutoEncoder::tensor_shapes(&sizes.autoencoder)?;
    write_random(&autoencoder, shapes, safetensors::Dtype::BF16, mix(seed, 1))?;
    let clip_l = dir.join("clip").join("clip_l.safetensors");
    let shapes = ClipTextModel::tensor_shapes(&sizes.clip);
    write_random(&clip_l, shapes, safetensors::Dtype::F16, mix(seed, 2))?;
    let t5 = dir.join("t5").join("t5xxl_fp16.safetensors");
    let shapes = hf_t5_tensor_shapes(&sizes.t5)
        .into_iter()
        .map(|(name, shape, _)| (name, shape))
        .collect();
    write_random(&t5, shapes, safetensors::Dtype::F16, mix(seed, 3))?;
    for (file, json) in [
        (
            &clip_l,
            framesmith_models::fixtures::clip_tokenizer_json(&WORDS),
        ),
        (&t5, framesmith_models::fixtures::t5_tokenizer_json(&WORDS)),
    ] {
        let path = file.with_file_name("tokenizer.json");
        std::fs::write(&path, json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let prompts = dir.join("prompts.txt");
    std::fs::write(
        &prompts,
        format!("a synthetic image of snow --w {width} --h {height} --s 20 --l 3.5 --d 1\n"),
    )
    .with_context(|| format!("cannot write {}", prompts.display()))?;
    Ok(FluxSampleFiles {
        autoencoder,
        clip_l,
        t5,
        prompts,
    })
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use framesmith_models::flux::text_encoder::{FluxTextEncoder, TextEncoderFiles};
    use framesmith_models::flux::weights::load_autoencoder;

    /// Small sizes of the released layouts (the loaders read every size from the files).
    fn small() -> FluxEncoderSizes {
        FluxEncoderSizes {
            autoencoder: AutoEncoderConfig {
                ch: 32,
                ch_mult: vec![1, 2],
                num_res_blocks: 1,
                ..AutoEncoderConfig::flux1()
            },
            clip: ClipTextConfig {
                vocab_size: 64,
                hidden_size: 128,
                intermediate_size: 256,
                num_hidden_layers: 2,
                num_attention_heads: 2,
                ..ClipTextConfig::clip_l()
            },
            t5: T5Config {
                vocab: 64,
                dim: 64,
                dim_attn: 64,
                dim_ffn: 128,
                num_heads: 2,
                num_layers: 2,
                ..t5_v1_1_xxl()
            },
        }
    }

    #[test]
    fn the_sample_files_load_as_flux_components_and_encode_a_prompt() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_flux_sample_files(dir.path(), &small(), (64, 32), 3).unwrap();
        let dev = &Device::Cpu;
        let ae = load_autoencoder(&files.autoencoder, DType::F32, dev).unwrap();
        assert_eq!(ae.config().downsample_factor(), 2);
        let encoder = FluxTextEncoder::load(
            TextEncoderFiles {
                clip: &files.clip_l,
                clip_tokenizer: None,
                t5: &files.t5,
                t5_tokenizer: None,
                t5_max_tokens: 8,
            },
            DType::F32,
            dev,
        )
        .unwrap();
        let prompt = std::fs::read_to_string(&files.prompts).unwrap();
        let text = prompt.split(" --").next().unwrap();
        let (txt, vec) = encoder.encode(&[text]).unwrap();
        assert_eq!((txt.dims(), vec.dims()), (&[1, 8, 64][..], &[1, 128][..]));
        let finite = txt.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(finite.iter().all(|v| v.is_finite()));
    }
}
