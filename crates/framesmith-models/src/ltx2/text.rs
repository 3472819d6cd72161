//! LTX-2's and LTX-2.3's text side, from prompt to what the transformer's cross-attention reads, as ltx-core makes
//! it: Gemma 3 12B ([`crate::gemma3`]) over the prompt tokenised and left-padded to 1024 tokens, every hidden state
//! through the release's feature extractor ([`features`]), then the video connector with its learnable registers
//! ([`connector`]). The feature extractor's and the connector's weights live in the LTX-2 checkpoint itself
//! (`text_embedding_projection.*` and `model.diffusion_model.video_embeddings_connector.*`, or
//! `embeddings_connector.*` in a video-only file), their sizes in its `config` metadata ([`config`]).
//!
//! The two halves load apart ([`TextParts::feature_extractor`], [`TextParts::connector`]) so that a card holds
//! Gemma with the projection first, then the connector alone.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use crate::gemma3::{Gemma3Text, GemmaTokenizer, PaddedPrompt};
use crate::wan::weights::{read_header, Entry, MappedTensors, ModelFormatError, TensorInfo};
use framesmith_nn::vb::Vb;

pub mod config;
pub mod connector;
pub mod features;

pub use config::{FeatureVersion, Ltx2TextConfig};
pub use connector::Connector;
pub use features::FeatureExtractor;

/// Where the feature extractor's weights are.
const PROJECTION: &str = "text_embedding_projection.";
/// Where the video connector's weights are, most common first (an audio-video file, a video-only file), under
/// the transformer's prefix.
const CONNECTORS: [&str; 2] = ["video_embeddings_connector.", "embeddings_connector."];
/// Where the audio connector's weights are, under the transformer's prefix (audio-video files only).
const AUDIO_CONNECTOR: &str = "audio_embeddings_connector.";
/// The transformer's prefixes in single files.
const PREFIXES: [&str; 3] = ["model.diffusion_model.", "diffusion_model.", ""];

/// Why an LTX-2 file's text side cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Ltx2TextError {
    #[error(transparent)]
    File(#[from] ModelFormatError),

    /// The file lacks the connector or the projection (a transformer-only export, diffusers' transformer folder).
    #[error("this LTX-2 file holds no {part} (a transformer-only file?): give the official single file \
             (ltx-2-19b-*.safetensors or ltx-2.3-22b-*.safetensors), which holds the text connector: {}", path.display())]
    Missing { part: &'static str, path: PathBuf },

    /// The file's config or tensors do not make the text side.
    #[error("cannot build LTX-2's text connector from this file: {problem}: {}", path.display())]
    Build { problem: String, path: PathBuf },
}

/// The text parts of an LTX-2 checkpoint: where they are and their config.
pub struct TextParts {
    pub path: PathBuf,
    pub config: Ltx2TextConfig,
    connector_prefix: String,
    /// The audio connector's prefix, when the file holds one.
    audio_connector_prefix: Option<String>,
    tensors: Vec<TensorInfo>,
}

impl TextParts {
    /// Finds the text parts in the LTX-2 single file at `path` (header only).
    pub fn open(path: &Path) -> Result<Self, Ltx2TextError> {
        let header = read_header(path)?;
        let build = |problem: String| Ltx2TextError::Build {
            problem,
            path: path.to_path_buf(),
        };
        let has_prefix = |p: &str| header.tensors.iter().any(|t| t.name.starts_with(p));
        let connector_prefix = PREFIXES
            .iter()
            .flat_map(|p| CONNECTORS.iter().map(move |c| format!("{p}{c}")))
            .find(|p| has_prefix(p))
            .ok_or_else(|| Ltx2TextError::Missing {
                part: "text connector (`video_embeddings_connector.*`)",
                path: path.to_path_buf(),
            })?;
        if !has_prefix(PROJECTION) {
            return Err(Ltx2TextError::Missing {
                part: "text projection (`text_embedding_projection.*`)",
                path: path.to_path_buf(),
            });
        }
        let audio_connector_prefix = PREFIXES
            .iter()
            .map(|p| format!("{p}{AUDIO_CONNECTOR}"))
            .find(|p| has_prefix(p));
        let config = header
            .metadata
            .get("config")
            .ok_or_else(|| build("it carries no `config` metadata entry".into()))
            .and_then(|c| Ltx2TextConfig::from_metadata_config(c).map_err(build))?;
        Ok(Self {
            path: path.to_path_buf(),
            config,
            connector_prefix,
            audio_connector_prefix,
            tensors: header.tensors,
        })
    }

    /// The tensors under `prefix`, mapped under their names without it.
    fn vb(&self, prefix: &str, dtype: DType, device: &Device) -> Result<Vb, Ltx2TextError> {
        let entries: Vec<Entry> = self
            .tensors
            .iter()
            .filter_map(|t| {
                Some(Entry {
                    file: 0,
                    stored: t.name.clone(),
                    name: t.name.strip_prefix(prefix)?.to_string(),
                    dtype: t.dtype.clone(),
                })
            })
            .collect();
        let mapped = MappedTensors::open(std::slice::from_ref(&self.path), &entries)?;
        Ok(Vb::from_source(Arc::new(mapped), dtype, device))
    }

    fn build_error(&self, e: candle_core::Error) -> Ltx2TextError {
        Ltx2TextError::Build {
            problem: e.to_string(),
            path: self.path.clone(),
        }
    }

    /// The feature extractor for Gemma states of `gemma_width` × `states`, in `dtype` on `device`.
    pub fn feature_extractor(
        &self,
        (gemma_width, states): (usize, usize),
        dtype: DType,
        device: &Device,
    ) -> Result<FeatureExtractor, Ltx2TextError> {
        let vb = self.vb(PROJECTION, dtype, device)?;
        FeatureExtractor::load(&vb, self.config.features, gemma_width, states)
            .map_err(|e| self.build_error(e))
    }

    /// [`Self::feature_extractor`] with the audio stream's projection too (LTX-2.3's `audio_aggregate_embed`).
    pub fn feature_extractor_av(
        &self,
        (gemma_width, states): (usize, usize),
        dtype: DType,
        device: &Device,
    ) -> Result<FeatureExtractor, Ltx2TextError> {
        let vb = self.vb(PROJECTION, dtype, device)?;
        FeatureExtractor::load_av(&vb, self.config.features, gemma_width, states)
            .map_err(|e| self.build_error(e))
    }

    /// Whether the file holds the audio connector (an audio-video checkpoint).
    pub fn has_audio(&self) -> bool {
        self.audio_connector_prefix.is_some()
    }

    /// The audio connector in `dtype` on `device`; a file without one is refused by name.
    pub fn audio_connector(
        &self,
        dtype: DType,
        device: &Device,
    ) -> Result<Connector, Ltx2TextError> {
        let prefix =
            self.audio_connector_prefix
                .as_deref()
                .ok_or_else(|| Ltx2TextError::Missing {
                    part: "audio text connector (`audio_embeddings_connector.*`)",
                    path: self.path.clone(),
                })?;
        let vb = self.vb(prefix, dtype, device)?;
        Connector::load(&vb, &self.config.audio_connector).map_err(|e| self.build_error(e))
    }

    /// The video connector in `dtype` on `device`.
    pub fn connector(&self, dtype: DType, device: &Device) -> Result<Connector, Ltx2TextError> {
        let vb = self.vb(&self.connector_prefix, dtype, device)?;
        Connector::load(&vb, &self.config.connector).map_err(|e| self.build_error(e))
    }

    /// Bytes of the weights the text side loads: the video projection and the video connector (the audio
    /// projection is not read), for placement decisions.
    pub fn bytes(&self) -> (u64, u64) {
        let sum = |keep: &dyn Fn(&str) -> bool| {
            self.tensors
                .iter()
                .filter(|t| keep(&t.name))
                .map(|t| t.len_bytes)
                .sum::<u64>()
        };
        (
            sum(&|n| n.starts_with(PROJECTION) && !n.contains("audio_")),
            sum(&|n| n.starts_with(&self.connector_prefix)),
        )
    }
}

/// A prompt's features before the connector, with its tokens.
pub struct PromptFeatures {
    /// [max_length, D] in the compute dtype, zero at padding.
    pub features: Tensor,
    /// The audio stream's features [max_length, D_audio], when the extractor has the audio side.
    pub audio_features: Option<Tensor>,
    pub prompt: PaddedPrompt,
}

/// `prompt`'s features: tokenised by `tokenizer`, Gemma's hidden states, the feature extractor.
pub fn prompt_features(
    (gemma, tokenizer): (&Gemma3Text, &GemmaTokenizer),
    extractor: &FeatureExtractor,
    prompt: &str,
) -> candle_core::Result<PromptFeatures> {
    let padded = tokenizer
        .encode_padded(prompt)
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    let l = padded.ids.len();
    let device = gemma.device();
    let ids = Tensor::from_vec(padded.ids.clone(), (1, l), device)?;
    let mask = Tensor::from_vec(padded.mask.clone(), (1, l), device)?;
    let states = gemma.hidden_states(&ids, &mask)?;
    let (features, audio) = extractor.forward_av(&states, &mask)?;
    Ok(PromptFeatures {
        features: features.squeeze(0)?,
        audio_features: audio.map(|a| a.squeeze(0)).transpose()?,
        prompt: padded,
    })
}

/// What the cache holds of one prompt: the connector's output [max_length, D] for its `features` (the prompt's
/// tokens first, then the registers), and the mask ltx-core's `EmbeddingsProcessor` gives with it: the registers
/// took the padding's place and are attended to, so every row is 1.
pub fn connect(
    connector: &Connector,
    features: &PromptFeatures,
) -> candle_core::Result<(Tensor, Vec<u32>)> {
    let l = features.prompt.mask.len();
    let device = features.features.device();
    let mask = Tensor::from_vec(features.prompt.mask.clone(), (1, l), device)?;
    let out = connector
        .forward(&features.features.unsqueeze(0)?, &mask)?
        .squeeze(0)?;
    Ok((out, vec![1; l]))
}

/// The audio connector's output [max_length, D_audio] for the audio features of `features` (ltx-core's
/// `EmbeddingsProcessor`: the audio connector over the audio features with the same mask, its output not masked).
pub fn connect_audio(
    connector: &Connector,
    features: &PromptFeatures,
) -> candle_core::Result<Tensor> {
    let Some(audio) = &features.audio_features else {
        candle_core::bail!("LTX-2: the audio connector needs the audio features of the prompt");
    };
    let l = features.prompt.mask.len();
    let mask = Tensor::from_vec(features.prompt.mask.clone(), (1, l), audio.device())?;
    connector.forward(&audio.unsqueeze(0)?, &mask)?.squeeze(0)
}
