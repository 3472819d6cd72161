//! LTX-2's audio VAE and vocoder from their files: the official single files (`ltx-2-19b-*.safetensors`,
//! `ltx-2.3-22b-*.safetensors`: `audio_vae.encoder.*`, `audio_vae.decoder.*`, `audio_vae.per_channel_statistics.*`
//! and `vocoder.*` beside the transformer, the architecture in the `config` metadata entry's `audio_vae` and
//! `vocoder` sections), and a separate audio VAE file of a split pack keeping those keys and that metadata. Only the
//! tensors of the parts asked for are read, from the mapped file.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::config::{AudioVaeConfig, VocoderConfig};
use super::{AudioVae, AudioVaeParts, Vocoder};
use crate::checkpoint::entries;
use crate::wan::weights::{read_header, MappedTensors, ModelFormatError};
use framesmith_nn::vb::{TensorSource, Vb};

/// The probes: the encoder's and the decoder's first convolutions, the vocoder's first (LTX-2) or its inner
/// vocoder's (LTX-2.3).
const ENCODER_PROBE: &str = "audio_vae.encoder.conv_in.conv.weight";
const DECODER_PROBE: &str = "audio_vae.decoder.conv_in.conv.weight";
const VOCODER_PROBES: [&str; 2] = ["vocoder.conv_pre.weight", "vocoder.vocoder.conv_pre.weight"];

/// Why a file gives no LTX-2 audio VAE or vocoder.
#[derive(Debug, thiserror::Error)]
pub enum Ltx2AudioError {
    #[error(transparent)]
    File(#[from] ModelFormatError),

    /// The file lacks a part that was asked for.
    #[error("this file holds no LTX-2 {part} (no `{probe}`); give the official ltx-2-19b-* or ltx-2.3-22b-* \
             checkpoint, which holds it, or the audio VAE file of a split pack: {}", path.display())]
    Missing {
        part: &'static str,
        probe: &'static str,
        path: PathBuf,
    },

    /// The architecture is not known.
    #[error("this LTX-2 {part}'s architecture cannot be read: {problem}; give the official checkpoint, whose \
             `config` metadata describes it: {}", path.display())]
    Config {
        part: &'static str,
        problem: String,
        path: PathBuf,
    },

    /// The tensors do not make what the config describes.
    #[error("cannot build the LTX-2 {part} from this file: {problem}: {}", path.display())]
    Build {
        part: &'static str,
        problem: String,
        path: PathBuf,
    },
}

/// What an LTX-2 audio file holds: the audio VAE's halves and the vocoder, and their architectures.
#[derive(Debug, Clone)]
pub struct Ltx2AudioFile {
    pub path: PathBuf,
    pub encoder: bool,
    pub decoder: bool,
    pub config: AudioVaeConfig,
    /// The vocoder's architecture, when the file holds one.
    pub vocoder: Option<VocoderConfig>,
    /// Elements of what sound is decoded with: the audio VAE's decoder and statistics, and the vocoder.
    pub decode_parameters: u64,
}

impl std::fmt::Display for Ltx2AudioFile {
    /// What `framesmith inspect` says of a file holding the audio VAE without the transformer.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let halves = match (self.encoder, self.decoder) {
            (true, true) => "encoder and decoder",
            (true, false) => "encoder only",
            _ => "decoder only",
        };
        let vocoder = match &self.vocoder {
            Some(v) if v.bwe.is_some() => "with LTX-2.3's vocoder (bandwidth extension)",
            Some(_) => "with LTX-2's vocoder",
            None => "without a vocoder",
        };
        let c = &self.config;
        writeln!(f, "{}", self.path.display())?;
        writeln!(f, "  {:<11} LTX-2 audio VAE ({halves}) {vocoder}", "model")?;
        writeln!(
            f,
            "  {:<11} {} Hz, {} mel bins, {} latent channels × {} mel bins{}",
            "sizes",
            c.sample_rate,
            c.mel_bins,
            c.z_channels,
            c.latent_mel_bins(),
            self.vocoder
                .as_ref()
                .map(|v| format!(", sound out at {} Hz", v.output_sampling_rate()))
                .unwrap_or_default()
        )?;
        writeln!(
            f,
            "  {:<11} clips' sound for joint audio-video training (`framesmith cache latents --vae` with the file \
             that also holds the video VAE) and sound for samples",
            "use"
        )
    }
}

/// Which parts to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ltx2AudioParts {
    pub encoder: bool,
    pub decoder: bool,
    pub vocoder: bool,
}

fn section<'a>(config: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    config.get(key).filter(|v| v.is_object())
}

fn metadata_config(metadata: &BTreeMap<String, String>) -> Result<serde_json::Value, String> {
    let text = metadata
        .get("config")
        .ok_or("the file carries no `config` metadata")?;
    serde_json::from_str(text).map_err(|e| format!("its `config` metadata is not JSON ({e})"))
}

/// Says whether and how `path` holds LTX-2's audio VAE and vocoder, from its header only; fails when it holds
/// neither half of the audio VAE.
pub fn identify_audio(path: &Path) -> Result<Ltx2AudioFile, Ltx2AudioError> {
    let header = read_header(path)?;
    let has = |name: &str| header.tensors.iter().any(|t| t.name == name);
    let (encoder, decoder) = (has(ENCODER_PROBE), has(DECODER_PROBE));
    if !encoder && !decoder {
        return Err(Ltx2AudioError::Missing {
            part: "audio VAE",
            probe: ENCODER_PROBE,
            path: path.to_path_buf(),
        });
    }
    let config_error = |part, problem| Ltx2AudioError::Config {
        part,
        problem,
        path: path.to_path_buf(),
    };
    let config = metadata_config(&header.metadata).map_err(|p| config_error("audio VAE", p))?;
    let audio = section(&config, "audio_vae").ok_or_else(|| {
        config_error(
            "audio VAE",
            "the `config` metadata has no `audio_vae` section".into(),
        )
    })?;
    let audio = AudioVaeConfig::from_json(audio).map_err(|p| config_error("audio VAE", p))?;
    let vocoder = if VOCODER_PROBES.iter().any(|p| has(p)) {
        let section = section(&config, "vocoder").ok_or_else(|| {
            config_error(
                "vocoder",
                "the `config` metadata has no `vocoder` section".into(),
            )
        })?;
        Some(VocoderConfig::from_json(section).map_err(|p| config_error("vocoder", p))?)
    } else {
        None
    };
    let decode_parameters = header
        .tensors
        .iter()
        .filter(|t| {
            [
                "audio_vae.decoder.",
                "audio_vae.per_channel_statistics.",
                "vocoder.",
            ]
            .iter()
            .any(|p| t.name.starts_with(p))
        })
        .map(|t| t.shape.iter().product::<usize>() as u64)
        .sum();
    Ok(Ltx2AudioFile {
        path: path.to_path_buf(),
        encoder,
        decoder,
        config: audio,
        vocoder,
        decode_parameters,
    })
}

/// A [`Vb`] over the tensors of `path` whose names start with `prefix` (stripped).
fn mapped(path: &Path, prefix: &str, dtype: DType, device: &Device) -> Result<Vb, Ltx2AudioError> {
    let header = read_header(path)?;
    let listed = entries(
        header
            .tensors
            .iter()
            .filter(|t| t.name.starts_with(prefix))
            .map(|t| (0, t)),
        Some(prefix),
    );
    let source: Arc<dyn TensorSource> =
        Arc::new(MappedTensors::open(&[path.to_path_buf()], &listed)?);
    Ok(Vb::from_source(source, dtype, device))
}

/// Loads the parts of LTX-2's audio VAE `parts` names (and the vocoder when asked) from `path` in `dtype` on
/// `device`, reading only their tensors.
pub fn load_ltx2_audio(
    path: &Path,
    parts: Ltx2AudioParts,
    dtype: DType,
    device: &Device,
) -> Result<(AudioVae, Option<Vocoder>), Ltx2AudioError> {
    let file = identify_audio(path)?;
    let missing = |part, probe| Ltx2AudioError::Missing {
        part,
        probe,
        path: path.to_path_buf(),
    };
    if parts.encoder && !file.encoder {
        return Err(missing("audio VAE encoder", ENCODER_PROBE));
    }
    if parts.decoder && !file.decoder {
        return Err(missing("audio VAE decoder", DECODER_PROBE));
    }
    let build = |part, e: candle_core::Error| Ltx2AudioError::Build {
        part,
        problem: e.to_string(),
        path: path.to_path_buf(),
    };
    let vb = mapped(path, "audio_vae.", dtype, device)?;
    let vae_parts = AudioVaeParts {
        encoder: parts.encoder,
        decoder: parts.decoder,
    };
    let vae = AudioVae::new(&file.config, &vb, vae_parts).map_err(|e| build("audio VAE", e))?;
    let vocoder = if parts.vocoder {
        let cfg = file
            .vocoder
            .as_ref()
            .ok_or_else(|| missing("vocoder", VOCODER_PROBES[0]))?;
        let vb = mapped(path, "vocoder.", dtype, device)?;
        Some(Vocoder::new(cfg, &vb).map_err(|e| build("vocoder", e))?)
    } else {
        None
    };
    Ok((vae, vocoder))
}

/// Builds the audio VAE and the vocoder of a state dict with the single file's keys (`audio_vae.*`, `vocoder.*`).
pub fn audio_from_tensors(
    tensors: &HashMap<String, Tensor>,
    config: (&AudioVaeConfig, &VocoderConfig),
    dtype: DType,
    device: &Device,
) -> candle_core::Result<(AudioVae, Vocoder)> {
    let part = |prefix: &str| {
        let map = tensors
            .iter()
            .filter_map(|(k, v)| k.strip_prefix(prefix).map(|k| (k.to_string(), v.clone())))
            .collect();
        Vb::from_tensors(map, dtype, device)
    };
    let parts = AudioVaeParts {
        encoder: true,
        decoder: true,
    };
    let vae = AudioVae::new(config.0, &part("audio_vae."), parts)?;
    let vocoder = Vocoder::new(config.1, &part("vocoder."))?;
    Ok((vae, vocoder))
}
