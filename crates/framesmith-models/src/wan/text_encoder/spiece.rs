//! SentencePiece models as `tokenizers` pipelines: the `spiece.model` of google/umt5-xxl, or the same bytes that
//! ComfyUI stores in its umT5 files as the U8 tensor `spiece_model`. Builds what Hugging Face's `T5Converter`
//! builds from such a model (Unigram over the pieces and scores, the model's precompiled normaliser, Metaspace,
//! control and user-defined pieces as added tokens), with SentencePiece's own whitespace rules, so the ids equal
//! `SentencePieceProcessor.encode`. Knows nothing of Wan's prompt cleaning or of `</s>`: `tokenizer` adds those.

use std::path::Path;

use prost::Message;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::unigram::Unigram;
use tokenizers::normalizers::replace::{Replace, ReplacePattern};
use tokenizers::normalizers::{NormalizerWrapper, Precompiled, Sequence};
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::{AddedToken, Tokenizer};

use crate::wan::weights::{self, ModelFormatError, NotSafetensors};

/// The tensor that holds the serialized SentencePiece model in ComfyUI's umT5 files.
pub const SPIECE_TENSOR: &str = "spiece_model";
/// Largest `spiece_model` tensor read into memory (umT5's model is about 5 MB).
const MAX_SPM_BYTES: u64 = 64 << 20;

/// `TrainerSpec.ModelType.UNIGRAM`, the proto's default model type.
const UNIGRAM: i32 = 1;
/// `SentencePiece.Type.CONTROL` (`<pad>`, `</s>`): special added tokens.
const CONTROL: i32 = 3;
/// `SentencePiece.Type.USER_DEFINED`: added tokens, always kept whole.
const USER_DEFINED: i32 = 4;

// The messages of SentencePiece's `sentencepiece_model.proto` (proto2), with only the fields read here; prost skips
// the others. Optional fields stay `Option` so the proto's defaults are applied where they are read.

/// `ModelProto`.
#[derive(Clone, PartialEq, Message)]
struct ModelProto {
    #[prost(message, repeated, tag = "1")]
    pieces: Vec<Piece>,
    #[prost(message, optional, tag = "2")]
    trainer_spec: Option<TrainerSpec>,
    #[prost(message, optional, tag = "3")]
    normalizer_spec: Option<NormalizerSpec>,
}

/// `ModelProto.SentencePiece`.
#[derive(Clone, PartialEq, Message)]
struct Piece {
    #[prost(string, optional, tag = "1")]
    piece: Option<String>,
    #[prost(float, optional, tag = "2")]
    score: Option<f32>,
    /// `Type`; NORMAL (1) when absent.
    #[prost(int32, optional, tag = "3")]
    kind: Option<i32>,
}

/// `TrainerSpec`.
#[derive(Clone, PartialEq, Message)]
struct TrainerSpec {
    /// `ModelType`; UNIGRAM when absent.
    #[prost(int32, optional, tag = "3")]
    model_type: Option<i32>,
    #[prost(bool, optional, tag = "35")]
    byte_fallback: Option<bool>,
    /// 0 when absent.
    #[prost(int32, optional, tag = "40")]
    unk_id: Option<i32>,
}

/// `NormalizerSpec`.
#[derive(Clone, PartialEq, Message)]
struct NormalizerSpec {
    #[prost(bytes = "vec", optional, tag = "2")]
    precompiled_charsmap: Option<Vec<u8>>,
    /// True when absent.
    #[prost(bool, optional, tag = "3")]
    add_dummy_prefix: Option<bool>,
    /// True when absent.
    #[prost(bool, optional, tag = "4")]
    remove_extra_whitespaces: Option<bool>,
}

/// Why SentencePiece bytes gave no tokenizer; the caller names the file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SpmProblem {
    /// Not a SentencePiece model, or a damaged one.
    Unreadable(String),
    /// A model of another algorithm (BPE, word, char): its name.
    NotUnigram(String),
}

/// What the `spiece_model` tensor of a weights file holds.
pub(crate) enum Embedded {
    /// The serialized model.
    Model(Vec<u8>),
    /// No such tensor, or a file that is not safetensors (the official `.pth`).
    Absent,
    /// A tensor of that name that cannot be a serialized model (its dtype or size).
    Unusable(String),
}

/// The `spiece_model` tensor of the safetensors file at `path`: reads the header, then only that tensor's bytes.
pub(crate) fn read_embedded(path: &Path) -> Result<Embedded, ModelFormatError> {
    let header = match weights::read_header(path) {
        Ok(header) => header,
        Err(ModelFormatError::NotSafetensors {
            kind: NotSafetensors::PyTorchZip | NotSafetensors::PyTorchPickle,
            ..
        }) => return Ok(Embedded::Absent),
        Err(e) => return Err(e),
    };
    let Some(info) = header.tensors.iter().find(|t| t.name == SPIECE_TENSOR) else {
        return Ok(Embedded::Absent);
    };
    if !matches!(info.dtype.as_str(), "U8" | "I8") {
        return Ok(Embedded::Unusable(format!(
            "it is stored as {}, not as bytes (U8)",
            info.dtype
        )));
    }
    if info.len_bytes > MAX_SPM_BYTES {
        return Ok(Embedded::Unusable(format!(
            "it has {} bytes, far more than a tokenizer",
            info.len_bytes
        )));
    }
    Ok(Embedded::Model(weights::read_tensor_data(path, info)?))
}

/// The tokenizer of a serialized SentencePiece `ModelProto`, as Hugging Face's converter builds it: the pieces and
/// scores as a Unigram model (unknown id and byte fallback from the trainer spec), the normaliser of the model,
/// Metaspace with the dummy prefix, control pieces as special tokens and user-defined ones as added tokens.
pub(crate) fn tokenizer_from_spm(bytes: &[u8]) -> Result<Tokenizer, SpmProblem> {
    let unreadable = |reason: String| SpmProblem::Unreadable(reason);
    let proto = ModelProto::decode(bytes)
        .map_err(|e| unreadable(format!("it is not a SentencePiece model: {e}")))?;
    if proto.pieces.is_empty() {
        return Err(unreadable(
            "it is not a SentencePiece model: it has no pieces".into(),
        ));
    }
    let trainer = proto.trainer_spec.clone().unwrap_or_default();
    let model_type = trainer.model_type.unwrap_or(UNIGRAM);
    if model_type != UNIGRAM {
        return Err(SpmProblem::NotUnigram(model_type_name(model_type)));
    }
    let unk_id = trainer.unk_id.unwrap_or(0);
    let unk_id = usize::try_from(unk_id)
        .ok()
        .filter(|&id| id < proto.pieces.len())
        .ok_or_else(|| {
            unreadable(format!(
                "its unknown-token id {unk_id} is not one of its {} pieces",
                proto.pieces.len()
            ))
        })?;
    let byte_fallback = trainer.byte_fallback.unwrap_or(false);
    let spec = proto.normalizer_spec.clone().unwrap_or_default();
    let normalizer = normalizer(&spec).map_err(unreadable)?;
    // A damaged table can make the tokenizers library panic rather than fail; the bytes are user input.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assemble(&proto, unk_id, byte_fallback, &spec, normalizer)
    }))
    .map_err(|_| unreadable("the tokenizers library crashed reading it".into()))?
    .map_err(unreadable)
}

fn assemble(
    proto: &ModelProto,
    unk_id: usize,
    byte_fallback: bool,
    spec: &NormalizerSpec,
    normalizer: Sequence,
) -> Result<Tokenizer, String> {
    let vocab = proto
        .pieces
        .iter()
        .map(|p| {
            let score = p.score.unwrap_or(0.0);
            (p.piece.clone().unwrap_or_default(), f64::from(score))
        })
        .collect();
    let model = Unigram::from(vocab, Some(unk_id), byte_fallback).map_err(|e| e.to_string())?;
    let mut tokenizer = Tokenizer::new(model);
    tokenizer
        .with_normalizer(Some(normalizer))
        .map_err(|e| e.to_string())?;
    let prepend = if spec.add_dummy_prefix.unwrap_or(true) {
        PrependScheme::Always
    } else {
        PrependScheme::Never
    };
    let metaspace = Metaspace::new('▁', prepend, true);
    tokenizer.with_pre_tokenizer(Some(metaspace.clone()));
    let decoder = if byte_fallback {
        DecoderWrapper::Sequence(DecoderSequence::new(vec![
            ByteFallback::new().into(),
            metaspace.into(),
        ]))
    } else {
        metaspace.into()
    };
    tokenizer.with_decoder(Some(decoder));
    let added = proto.pieces.iter().filter_map(|p| {
        let kind = p.kind.unwrap_or(1);
        let piece = p.piece.clone().filter(|s| !s.is_empty())?;
        matches!(kind, CONTROL | USER_DEFINED)
            .then(|| AddedToken::from(piece, kind == CONTROL).normalized(false))
    });
    tokenizer
        .add_tokens(added.collect::<Vec<_>>())
        .map_err(|e| e.to_string())?;
    Ok(tokenizer)
}

/// The model's normaliser table, then SentencePiece's `remove_extra_whitespaces`: spaces (only spaces: other
/// whitespace is the table's business) dropped at both ends and runs of them collapsed to one. The dummy prefix is
/// Metaspace's.
fn normalizer(spec: &NormalizerSpec) -> Result<Sequence, String> {
    let mut steps: Vec<NormalizerWrapper> = Vec::new();
    if let Some(table) = spec
        .precompiled_charsmap
        .as_deref()
        .filter(|t| !t.is_empty())
    {
        steps.push(precompiled(table)?.into());
    }
    if spec.remove_extra_whitespaces.unwrap_or(true) {
        for (pattern, with) in [("^ +| +$", ""), (" {2,}", " ")] {
            let replace = Replace::new(ReplacePattern::Regex(pattern.into()), with)
                .map_err(|e| e.to_string())?;
            steps.push(replace.into());
        }
    }
    Ok(Sequence::new(steps))
}

/// The precompiled normaliser, after checking the trie length that `Precompiled::from` would otherwise trust
/// for an allocation.
fn precompiled(table: &[u8]) -> Result<Precompiled, String> {
    let damaged = || "its normaliser table (precompiled_charsmap) is damaged".to_string();
    let trie_bytes = table
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
        .ok_or_else(damaged)?;
    if trie_bytes as usize > table.len() - 4 {
        return Err(damaged());
    }
    Precompiled::from(table).map_err(|_| damaged())
}

fn model_type_name(model_type: i32) -> String {
    match model_type {
        2 => "BPE".into(),
        3 => "word".into(),
        4 => "character".into(),
        other => format!("type {other}"),
    }
}

#[cfg(test)]
mod tests;
