//! `framesmith inspect` for a model file of any family: LTX-2 / LTX-2.3 transformers (official single files, FP8,
//! diffusers folders) by [`crate::ltx2::weights`], their audio VAE files by [`crate::ltx2::audio`], their Gemma 3 12B text encoder by [`crate::gemma3::weights`], HunyuanVideo transformers (1.5 in every layout, 1.0 named
//! with what to download instead) by [`crate::hunyuan_video15::weights`], its byT5 glyph encoder by
//! [`crate::hunyuan_video15::byt5`], Qwen-Image transformers (files and diffusers folders) are
//! named by [`crate::qwen_image::weights`], Qwen2.5-VL text encoders (Qwen-Image's and HunyuanVideo 1.5's) by
//! [`crate::qwen25vl::weights`], SigLIP image encoders (files and FLUX.1-Redux-dev's folder) by [`crate::siglip`],
//! FLUX.1 files (DiT, autoencoder, CLIP-L, T5-XXL) by
//! [`crate::flux::weights`], everything else (Wan files, LoRAs, folders, PyTorch archives) by
//! [`crate::wan::weights::identify`]. Headers only.

use std::fmt;
use std::path::Path;

use crate::flux::weights::{self as flux_weights, FluxFile, FluxFormatError};
use crate::gemma3::weights::{self as gemma3_weights, Gemma3File, Gemma3FormatError};
use crate::hunyuan_video15::byt5::{self as glyph, GlyphFile};
use crate::hunyuan_video15::weights::{
    self as hunyuan_weights, HunyuanVideoFile, HunyuanVideoFormatError,
};
use crate::ltx2::audio::{identify_audio, Ltx2AudioFile};
use crate::ltx2::weights::{self as ltx2_weights, Ltx2File, Ltx2FormatError};
use crate::qwen25vl::weights::{self as qwen25vl_weights, Qwen25VlFile, Qwen25VlFormatError};
use crate::qwen_image::weights::{self as qwen_weights, QwenImageFile, QwenImageFormatError};
use crate::siglip::{self, SiglipFile};
use crate::wan::weights::{self as wan_weights, ModelFormatError};

/// What a model file is.
#[derive(Debug, Clone)]
pub enum ModelFile {
    Ltx2(Box<Ltx2File>),
    /// LTX-2's audio VAE (and vocoder) without the transformer: a split pack's audio file.
    Ltx2Audio(Box<Ltx2AudioFile>),
    /// Gemma 3, LTX-2's text encoder.
    Gemma3(Box<Gemma3File>),
    /// A file holding Gemma 3 12B's token embedding but not its first layer: one shard of the folder.
    Gemma3Shard(std::path::PathBuf),
    HunyuanVideo(Box<HunyuanVideoFile>),
    /// A byT5 encoder: HunyuanVideo 1.5's glyph encoder, or the base it was trained from.
    Glyph(Box<GlyphFile>),
    /// A SigLIP vision tower (HunyuanVideo 1.5's image encoder).
    Siglip(Box<SiglipFile>),
    QwenImage(Box<QwenImageFile>),
    Qwen25Vl(Box<Qwen25VlFile>),
    Flux(Box<FluxFile>),
    Wan(wan_weights::ModelFile),
}

impl fmt::Display for ModelFile {
    /// The report, with any control character of the file's names and metadata shown escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let report = match self {
            Self::Ltx2(file) => file.to_string(),
            Self::Ltx2Audio(file) => file.to_string(),
            Self::Gemma3(file) => file.to_string(),
            Self::Gemma3Shard(path) => format!(
                "{}\n  {:<11} one shard of Gemma 3 12B, the text encoder of LTX-2 and LTX-2.3: give the folder that \
                 holds every shard (with config.json and tokenizer.json) to `framesmith cache text`\n",
                path.display(),
                "model"
            ),
            Self::HunyuanVideo(file) => file.to_string(),
            Self::Glyph(file) => file.to_string(),
            Self::Siglip(file) => file.to_string(),
            Self::QwenImage(file) => file.to_string(),
            Self::Qwen25Vl(file) => file.to_string(),
            Self::Flux(file) => file.to_string(),
            Self::Wan(file) => file.to_string(),
        };
        f.write_str(&printable(&report))
    }
}

/// Why a path is not a model file Framesmith can name. Shown with control characters escaped, as the message
/// may quote the file's tensor names.
#[derive(Debug, thiserror::Error)]
pub enum IdentifyError {
    #[error("{}", printable(&.0.to_string()))]
    Ltx2(Ltx2FormatError),
    #[error("{}", printable(&.0.to_string()))]
    Gemma3(Gemma3FormatError),
    #[error("{}", printable(&.0.to_string()))]
    HunyuanVideo(HunyuanVideoFormatError),
    #[error("{}", printable(&.0.to_string()))]
    QwenImage(QwenImageFormatError),
    #[error("{}", printable(&.0.to_string()))]
    Qwen25Vl(Qwen25VlFormatError),
    #[error("{}", printable(&.0.to_string()))]
    Flux(FluxFormatError),
    #[error("{}", printable(&.0.to_string()))]
    Wan(ModelFormatError),
}

// Not `#[from]`, which would make the unescaped error the source that `{:#}` prints after this one.
impl From<ModelFormatError> for IdentifyError {
    fn from(err: ModelFormatError) -> Self {
        Self::Wan(err)
    }
}

/// `text` safe for a terminal: control characters (escape sequences, carriage returns, C1 controls) and the
/// bidirectional overrides a file's names or metadata may hold are shown as escapes (`\u{1b}`); line breaks and
/// tabs stay.
pub fn printable(text: &str) -> String {
    let unsafe_char = |c: char| {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return text.to_string();
    }
    text.chars()
        .map(|c| {
            if unsafe_char(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Says what the model file at `path` is.
pub fn identify(path: &Path) -> Result<ModelFile, IdentifyError> {
    match ltx2_weights::identify(path) {
        Ok(file) => return Ok(ModelFile::Ltx2(Box::new(file))),
        // LTX-2 tensors that do not make a transformer Framesmith can build say so.
        Err(err) if !ltx2_weights::is_unrecognised(&err) => return Err(IdentifyError::Ltx2(err)),
        Err(_) => {}
    }
    if !path.is_dir() {
        if let Ok(file) = identify_audio(path) {
            return Ok(ModelFile::Ltx2Audio(Box::new(file)));
        }
    }
    match gemma3_weights::identify(path) {
        Ok(file) => return Ok(ModelFile::Gemma3(Box::new(file))),
        Err(err) if !gemma3_weights::is_unrecognised(&err) => {
            return Err(IdentifyError::Gemma3(err))
        }
        Err(_) => {}
    }
    if !path.is_dir() && ltx2_weights::is_gemma3_12b(path) {
        return Ok(ModelFile::Gemma3Shard(path.to_path_buf()));
    }
    match qwen_weights::identify(path) {
        Ok(file) => return Ok(ModelFile::QwenImage(Box::new(file))),
        // Qwen-Image tensors that do not make a whole transformer (a lone shard) say so.
        Err(err) if !qwen_weights::is_unrecognised(&err) => {
            return Err(IdentifyError::QwenImage(err))
        }
        Err(_) => {}
    }
    match hunyuan_weights::identify(path) {
        Ok(file) => return Ok(ModelFile::HunyuanVideo(Box::new(file))),
        // HunyuanVideo tensors that do not make a whole transformer (a lone shard) say so.
        Err(err) if !hunyuan_weights::is_unrecognised(&err) => {
            return Err(IdentifyError::HunyuanVideo(err))
        }
        Err(_) => {}
    }
    match qwen25vl_weights::identify(path) {
        Ok(file) => return Ok(ModelFile::Qwen25Vl(Box::new(file))),
        // Its tensors, but not all of them (a lone shard), or sizes that make no model, say so.
        Err(err) if !qwen25vl_weights::is_unrecognised(&err) => {
            return Err(IdentifyError::Qwen25Vl(err))
        }
        Err(_) => {}
    }
    if let Some(file) = glyph::identify(path) {
        return Ok(ModelFile::Glyph(Box::new(file)));
    }
    if let Some(file) = siglip::identify(path) {
        return Ok(ModelFile::Siglip(Box::new(file)));
    }
    if !path.is_dir() {
        match flux_weights::identify(path) {
            Ok(file) => return Ok(ModelFile::Flux(Box::new(file))),
            // A FLUX.1 transformer the FLUX.1 reader recognised but cannot use says what is wrong with it.
            Err(
                err @ (FluxFormatError::DiffusersTransformer { .. }
                | FluxFormatError::Incomplete { .. }),
            ) => return Err(IdentifyError::Flux(err)),
            // Unreadable files, other families and unknown keys: the Wan reader says what they are.
            Err(_) => {}
        }
    }
    Ok(ModelFile::Wan(wan_weights::identify(path)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Tensor};
    use std::collections::HashMap;
    use std::path::PathBuf;

    #[test]
    fn flux_files_are_named_as_flux_and_wan_files_as_wan() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let flux = |case: &str| crate::fixtures::case_dir("flux", case).join("weights.safetensors");
        let weights = candle_core::safetensors::load(flux("flux_dit"), &Device::Cpu)?;
        let comfy: HashMap<String, Tensor> = weights
            .into_iter()
            .map(|(k, v)| (format!("model.diffusion_model.{k}"), v))
            .collect();
        let dit = dir.path().join("flux1-dev.safetensors");
        candle_core::safetensors::save(&comfy, &dit)?;
        let cases: [(PathBuf, &[&str]); 4] = [
            (
                dit,
                &[
                    "FLUX.1 [dev]",
                    "2 double-stream + 2 single-stream",
                    "ComfyUI single file",
                ],
            ),
            (
                flux("flux_ae"),
                &[
                    "FLUX.1 autoencoder",
                    "the VAE (autoencoder) of a FLUX.1 run",
                ],
            ),
            (
                flux("clip_l"),
                &[
                    "CLIP text encoder",
                    "the CLIP-L text encoder of a FLUX.1 run",
                ],
            ),
            (
                flux("t5_encoder"),
                &[
                    "T5 v1.1 text encoder",
                    "the T5-XXL text encoder of a FLUX.1 run",
                ],
            ),
        ];
        for (path, expected) in cases {
            let shown = identify(&path)?.to_string();
            for part in expected {
                assert!(
                    shown.contains(part),
                    "{part} missing for {}:\n{shown}",
                    path.display()
                );
            }
            assert!(shown.ends_with(&path.display().to_string()), "{shown}");
        }

        let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &Device::Cpu);
        let lora: HashMap<String, Tensor> = [
            (
                "lora_unet_blocks_0_ffn_0.lora_down.weight".to_string(),
                z(&[4, 8])?,
            ),
            (
                "lora_unet_blocks_0_ffn_0.lora_up.weight".to_string(),
                z(&[8, 4])?,
            ),
        ]
        .into();
        let path = dir.path().join("lora.safetensors");
        candle_core::safetensors::save(&lora, &path)?;
        let shown = identify(&path)?.to_string();
        assert!(shown.contains("LoRA adapter"), "{shown}");
        Ok(())
    }

    #[test]
    fn qwen_image_files_are_named_as_qwen_image() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/qwen_image/t2i/weights.safetensors");
        let weights = candle_core::safetensors::load(fixture, &Device::Cpu)?;
        let path = dir.path().join("qwen_image_bf16.safetensors");
        candle_core::safetensors::save(&weights, &path)?;
        let shown = identify(&path)?.to_string();
        assert!(
            shown.starts_with("Qwen-Image-style transformer")
                && shown.contains("diffusers key names"),
            "{shown}"
        );
        let blocks: HashMap<String, Tensor> = weights
            .into_iter()
            .filter(|(k, _)| k.starts_with("transformer_blocks."))
            .collect();
        let shard = dir
            .path()
            .join("diffusion_pytorch_model-00001-of-00009.safetensors");
        candle_core::safetensors::save(&blocks, &shard)?;
        let err = identify(&shard)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("incomplete") && err.contains("one shard"),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn siglip_files_and_the_redux_folder_are_named_as_siglip_not_clip() -> anyhow::Result<()> {
        let folder = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/siglip");
        for path in [
            folder.clone(),
            folder.join("image_encoder/model.safetensors"),
        ] {
            let file = identify(&path)?;
            assert!(matches!(file, ModelFile::Siglip(_)), "{file}");
            assert!(
                file.to_string().starts_with("SigLIP image encoder"),
                "{file}"
            );
        }
        Ok(())
    }

    #[test]
    fn ltx2_files_are_named_as_ltx2_before_any_other_family() -> anyhow::Result<()> {
        let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/ltx2/ltx23_t2v/weights.safetensors");
        let file = identify(&fixture)?;
        assert!(matches!(file, ModelFile::Ltx2(_)));
        assert!(file.to_string().contains("LTX-2.3"), "{file}");
        Ok(())
    }

    #[test]
    fn an_audio_vae_file_is_named_with_its_vocoder() -> anyhow::Result<()> {
        let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ltx2");
        let file = identify(&fixtures.join("audio_ltx23/weights.safetensors"))?;
        assert!(matches!(file, ModelFile::Ltx2Audio(_)), "{file}");
        let text = file.to_string();
        assert!(
            text.contains("LTX-2 audio VAE (encoder and decoder) with LTX-2.3's vocoder")
                && text.contains(
                    "16000 Hz, 64 mel bins, 1 latent channels × 16 mel bins, sound out at 1200 Hz"
                ),
            "{text}"
        );
        Ok(())
    }
}
