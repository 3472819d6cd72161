//! Wan DiT variant detection from tensor shapes (with name hints and an optional `config.json`), the check
//! against the variant a caller asked for, and the analysis of FP8 scales.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::header::TensorInfo;
use super::keys::{is_scale, official_shapes};
use super::report::{dtype_label, Fp8Info, Fp8Scaling, HeadsSource, ScaleNaming};
use super::source::NameHints;
use crate::wan::config::Expert;
use crate::wan::{Generation, ModelType, WanConfig};

/// Tensor shapes by official name.
pub(crate) type Shapes = BTreeMap<String, Vec<usize>>;

/// Largest width accepted for any model dimension; far above every Wan (ffn 14336, text 4096) and small enough
/// that no size arithmetic on a damaged header can overflow.
const MAX_DIM: usize = 1 << 20;

/// What the shapes say the checkpoint is.
#[derive(Debug, Clone)]
pub(crate) struct Detected {
    pub config: WanConfig,
    /// One name, or two when the shapes cannot tell Wan2.1 T2V-14B from a Wan2.2 T2V-A14B expert.
    pub names: Vec<String>,
    pub expert: Option<Expert>,
    pub heads: HeadsSource,
    pub notes: Vec<String>,
}

/// Why the shapes are not a usable Wan DiT.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum DetectError {
    /// Not a Wan DiT at all.
    Unknown(String),
    /// A Wan DiT with missing or misshapen tensors.
    Incomplete { variant: String, problem: String },
}

/// The caller asked for another model than the file holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Mismatch {
    Task {
        found: String,
        expected: String,
        found_kind: &'static str,
    },
    Variant {
        found: String,
        expected: String,
    },
}

/// Attention heads for a checkpoint without a `config.json`. Nothing in the weights records the head count (the
/// q/k norms span the whole width), so: 128-wide heads as in every official Wan (1536 → 12, 3072 → 24,
/// 5120 → 40); for other widths the widest power-of-two head of at most 128 that leaves at least two heads
/// (the tiny test models: 64 → 2 heads of 32). Put a `config.json` beside the weights for anything else.
pub fn heads_for_dim(dim: usize) -> usize {
    [128, 64, 32, 16, 8, 4, 2, 1]
        .into_iter()
        .find(|&w| dim % w == 0 && dim / w >= 2)
        .map_or(1, |w| dim / w)
}

/// The display name of a configuration: `Wan2.1 T2V-14B`, `Wan2.2 T2V-A14B high-noise expert`, or
/// `custom Wan2.1 T2V DiT (dim 64, 2 layers)`.
pub fn variant_name(cfg: &WanConfig, expert: Option<Expert>) -> String {
    let expert_label = match expert {
        Some(Expert::HighNoise) => "high-noise expert",
        Some(Expert::LowNoise) => "low-noise expert",
        None => "expert",
    };
    let named = WanConfig::named_variants().into_iter().find(|(_, v)| {
        same_shapes(v, cfg) && v.generation == cfg.generation && v.model_type == cfg.model_type
    });
    match named.map(|(n, _)| n) {
        Some("t2v-1.3b") => "Wan2.1 T2V-1.3B".into(),
        Some("t2v-14b") => "Wan2.1 T2V-14B".into(),
        Some("i2v-14b") => "Wan2.1 I2V-14B".into(),
        Some("t2v-a14b") => format!("Wan2.2 T2V-A14B {expert_label}"),
        Some("i2v-a14b") => format!("Wan2.2 I2V-A14B {expert_label}"),
        Some("ti2v-5b") => "Wan2.2 TI2V-5B".into(),
        _ => {
            let generation = match cfg.generation {
                Generation::Wan21 => "Wan2.1",
                Generation::Wan22 => "Wan2.2",
            };
            format!(
                "custom {generation} {} DiT (dim {}, {} layers)",
                task_label(cfg.model_type),
                cfg.dim,
                cfg.num_layers
            )
        }
    }
}

fn task_label(t: ModelType) -> &'static str {
    match t {
        ModelType::T2v => "T2V",
        ModelType::I2v => "I2V",
        ModelType::Ti2v => "TI2V",
    }
}

/// Whether two configurations have the same tensors (names and shapes).
fn same_shapes(a: &WanConfig, b: &WanConfig) -> bool {
    a.dim == b.dim
        && a.ffn_dim == b.ffn_dim
        && a.num_layers == b.num_layers
        && a.in_dim == b.in_dim
        && a.out_dim == b.out_dim
        && a.text_dim == b.text_dim
        && a.freq_dim == b.freq_dim
        && a.patch_size == b.patch_size
        && a.qk_norm == b.qk_norm
        && a.cross_attn_norm == b.cross_attn_norm
        && a.has_clip() == b.has_clip()
        && (!a.has_clip() || a.clip_dim == b.clip_dim)
}

/// Detects the variant from the shapes of the (normalised) tensors.
pub(crate) fn detect(
    shapes: &Shapes,
    hints: NameHints,
    config_json: Option<&str>,
) -> Result<Detected, DetectError> {
    let mut cfg = config_from_shapes(shapes)?;
    let ambiguous = cfg.model_type == ModelType::T2v
        && !hints.wan21
        && !hints.wan22
        && same_shapes(&cfg, &WanConfig::wan21_t2v_14b());
    if cfg.model_type == ModelType::T2v && hints.wan22 {
        cfg.generation = Generation::Wan22;
    }
    if let Some((_, named)) = WanConfig::named_variants().into_iter().find(|(_, v)| {
        same_shapes(v, &cfg) && v.generation == cfg.generation && v.model_type == cfg.model_type
    }) {
        cfg = named;
    }
    let mut notes = Vec::new();
    let heads = match config_json {
        Some(text) => apply_config_json(&mut cfg, text, &mut notes),
        None => HeadsSource::Rule,
    };
    let expert = if cfg.generation == Generation::Wan22 && cfg.model_type != ModelType::Ti2v {
        hints.expert
    } else {
        None
    };
    let names = if ambiguous {
        notes.push(
            "Wan2.1 T2V-14B and a Wan2.2 T2V-A14B expert have identical tensors and nothing in the path says \
             which this is (a name with `wan2.2`, `high_noise` or `low_noise` would); both run the same \
             text-to-video forward pass"
                .into(),
        );
        vec![
            variant_name(&cfg, None),
            variant_name(&WanConfig::wan22_t2v_a14b(), None),
        ]
    } else {
        vec![variant_name(&cfg, expert)]
    };
    let name = names.join(" or ");
    notes.extend(check_complete(shapes, &cfg, &name)?);
    Ok(Detected {
        config: cfg,
        names,
        expert,
        heads,
        notes,
    })
}

/// Reads every size the weights record; the rest (text_len, eps, heads) keeps the official defaults.
fn config_from_shapes(shapes: &Shapes) -> Result<WanConfig, DetectError> {
    let Some(pe) = shapes.get("patch_embedding.weight") else {
        return Err(DetectError::Unknown(unknown_reason(shapes)));
    };
    let incomplete = |problem: String| DetectError::Incomplete {
        variant: "Wan DiT".into(),
        problem,
    };
    let valid = |d: &usize| (1..=MAX_DIM).contains(d);
    let &[dim, in_dim, p0, p1, p2] = pe.as_slice() else {
        return Err(DetectError::Unknown(format!(
            "`patch_embedding.weight` has shape {pe:?}, while a Wan DiT's is [dim, channels, 1, 2, 2]"
        )));
    };
    if !pe.iter().all(valid) {
        return Err(incomplete(format!(
            "`patch_embedding.weight` has shape {pe:?}"
        )));
    }
    let num_layers = block_count(shapes)?;
    let size = |name: &str, rank: usize, axis: usize| -> Result<usize, DetectError> {
        match shapes.get(name) {
            None => Err(incomplete(format!("`{name}` is missing"))),
            Some(s) if s.len() != rank || !s.iter().all(valid) => {
                Err(incomplete(format!("`{name}` has shape {s:?}")))
            }
            Some(s) => s
                .get(axis)
                .copied()
                .ok_or_else(|| incomplete(format!("`{name}` has shape {s:?}"))),
        }
    };
    let ffn_dim = size("blocks.0.ffn.0.weight", 2, 0)?;
    let text_dim = size("text_embedding.0.weight", 2, 1)?;
    let freq_dim = size("time_embedding.0.weight", 2, 1)?;
    let head_out = size("head.head.weight", 2, 0)?;
    // Each factor is at most MAX_DIM, so the product fits in 64 bits; checked for 32-bit targets.
    let patch = p0
        .checked_mul(p1)
        .and_then(|x| x.checked_mul(p2))
        .ok_or_else(|| incomplete(format!("`patch_embedding.weight` has shape {pe:?}")))?;
    if head_out % patch != 0 {
        return Err(incomplete(format!(
            "`head.head.weight` has {head_out} outputs, not a multiple of the patch size {patch}"
        )));
    }
    let out_dim = head_out / patch;
    let has_img = shapes.keys().any(|k| k.starts_with("img_emb."));
    let (model_type, generation) = if has_img {
        (ModelType::I2v, Generation::Wan21)
    } else if in_dim == out_dim {
        if out_dim == 48 {
            (ModelType::Ti2v, Generation::Wan22)
        } else {
            (ModelType::T2v, Generation::Wan21)
        }
    } else {
        (ModelType::I2v, Generation::Wan22)
    };
    let mut cfg = WanConfig::wan21_t2v_14b();
    cfg.generation = generation;
    cfg.model_type = model_type;
    cfg.patch_size = [p0, p1, p2];
    cfg.in_dim = in_dim;
    cfg.dim = dim;
    cfg.ffn_dim = ffn_dim;
    cfg.freq_dim = freq_dim;
    cfg.text_dim = text_dim;
    cfg.out_dim = out_dim;
    cfg.num_layers = num_layers;
    cfg.num_heads = heads_for_dim(dim);
    cfg.qk_norm = shapes.contains_key("blocks.0.self_attn.norm_q.weight");
    cfg.cross_attn_norm = shapes.contains_key("blocks.0.norm3.weight");
    if has_img {
        cfg.clip_dim = size("img_emb.proj.0.weight", 1, 0)?;
    }
    Ok(cfg)
}

fn unknown_reason(shapes: &Shapes) -> String {
    if shapes.is_empty() {
        return "it holds no tensors".into();
    }
    let examples: Vec<String> = shapes.keys().take(3).map(|k| format!("`{k}`")).collect();
    format!(
        "it has no `patch_embedding.weight`; its tensors are named like {}",
        examples.join(", ")
    )
}

/// Number of transformer blocks; the indices must run 0..n without a gap.
fn block_count(shapes: &Shapes) -> Result<usize, DetectError> {
    let indices: BTreeSet<usize> = shapes
        .keys()
        .filter_map(|k| k.strip_prefix("blocks.")?.split('.').next()?.parse().ok())
        .collect();
    let Some(&last) = indices.last() else {
        return Err(DetectError::Unknown(
            "it has no `blocks.N.` transformer blocks".into(),
        ));
    };
    if let Some(missing) = (0..=last).find(|i| !indices.contains(i)) {
        return Err(DetectError::Incomplete {
            variant: "Wan DiT".into(),
            problem: format!("block {missing} is missing (blocks run up to {last})"),
        });
    }
    Ok(indices.len())
}

fn apply_config_json(cfg: &mut WanConfig, text: &str, notes: &mut Vec<String>) -> HeadsSource {
    match WanConfig::from_json(text, cfg.generation) {
        Ok(j)
            if j.dim == cfg.dim
                && j.num_layers == cfg.num_layers
                && j.ffn_dim == cfg.ffn_dim
                && j.in_dim == cfg.in_dim
                && j.out_dim == cfg.out_dim =>
        {
            cfg.num_heads = j.num_heads;
            cfg.text_len = j.text_len;
            cfg.eps = j.eps;
            HeadsSource::ConfigJson
        }
        Ok(j) => {
            notes.push(format!(
                "the config.json beside the weights describes another model (dim {}, {} layers); ignored",
                j.dim, j.num_layers
            ));
            HeadsSource::Rule
        }
        Err(e) => {
            notes.push(format!(
                "the config.json beside the weights is not a Wan DiT config ({e}); ignored"
            ));
            HeadsSource::Rule
        }
    }
}

/// Checks that every official tensor of `cfg` is present with its shape; returns notes on extra tensors.
fn check_complete(
    shapes: &Shapes,
    cfg: &WanConfig,
    variant: &str,
) -> Result<Vec<String>, DetectError> {
    let official = official_shapes(cfg);
    let incomplete = |problem: String| DetectError::Incomplete {
        variant: variant.to_string(),
        problem,
    };
    let mut missing = Vec::new();
    for (name, shape) in &official {
        match shapes.get(name) {
            None => missing.push(format!("`{name}`")),
            Some(got) if got != shape => {
                return Err(incomplete(format!(
                    "`{name}` has shape {got:?}, expected {shape:?}"
                )));
            }
            Some(_) => {}
        }
    }
    if !missing.is_empty() {
        let more = if missing.len() > 3 { ", …" } else { "" };
        let first: Vec<&str> = missing.iter().take(3).map(String::as_str).collect();
        return Err(incomplete(format!(
            "{} tensors are missing ({}{more})",
            missing.len(),
            first.join(", ")
        )));
    }
    let known: HashSet<&str> = official.iter().map(|(n, _)| n.as_str()).collect();
    let extra: Vec<&String> = shapes
        .keys()
        .filter(|k| !known.contains(k.as_str()) && !is_scale(k))
        .collect();
    Ok(match extra.first() {
        None => Vec::new(),
        Some(first) => vec![format!(
            "{} tensor{} that the Wan DiT forward pass does not use (e.g. `{first}`) will be ignored",
            extra.len(),
            if extra.len() == 1 { "" } else { "s" }
        )],
    })
}

/// Compares the detected model with the one the caller asked for; returns the configuration to build.
pub(crate) fn check_expected(det: &Detected, expected: &WanConfig) -> Result<WanConfig, Mismatch> {
    let found = det.names.join(" or ");
    let expected_name = variant_name(expected, None);
    if expected.model_type != det.config.model_type {
        let found_kind = match det.config.model_type {
            ModelType::T2v => "a text-to-video (T2V) model",
            ModelType::I2v => "an image-to-video (I2V) model",
            ModelType::Ti2v => "the TI2V-5B model",
        };
        return Err(Mismatch::Task {
            found,
            expected: expected_name,
            found_kind,
        });
    }
    let heads_differ =
        det.heads == HeadsSource::ConfigJson && det.config.num_heads != expected.num_heads;
    if !same_shapes(expected, &det.config) || heads_differ {
        return Err(Mismatch::Variant {
            found,
            expected: expected_name,
        });
    }
    // Same tensors: what the weights cannot record (generation of a T2V model, text_len, eps, boundary) is the
    // caller's to decide.
    Ok(expected.clone())
}

/// Describes the FP8 weights among `tensors` (official names), `None` when there are none.
pub(crate) fn fp8_info(
    tensors: &BTreeMap<String, &TensorInfo>,
    has_marker: bool,
    weight_scale_names: bool,
) -> Option<Fp8Info> {
    let is_fp8 = |t: &TensorInfo| t.dtype == "F8_E4M3" || t.dtype == "F8_E5M2";
    let weights: Vec<(&String, &&TensorInfo)> = tensors
        .iter()
        .filter(|(n, t)| n.ends_with(".weight") && is_fp8(t))
        .collect();
    if weights.is_empty() && !has_marker {
        return None;
    }
    let formats: BTreeSet<String> = weights.iter().map(|(_, t)| dtype_label(&t.dtype)).collect();
    let mut scaling = BTreeMap::new();
    let mut any_scale = false;
    for (name, w) in &weights {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        let scale = tensors.get(&format!("{module}.scale_weight"));
        any_scale |= scale.is_some();
        *scaling
            .entry(scaling_mode(&w.shape, scale.map(|s| s.shape.as_slice())))
            .or_insert(0) += 1;
    }
    let naming = if has_marker {
        ScaleNaming::ComfyScaledFp8
    } else if weight_scale_names {
        ScaleNaming::WeightScale
    } else if any_scale {
        ScaleNaming::ScaleWeight
    } else {
        ScaleNaming::None
    };
    Some(Fp8Info {
        format: formats.into_iter().collect::<Vec<_>>().join(", "),
        weights: weights.len(),
        scaling,
        naming,
    })
}

/// How a scale of shape `scale` applies to a weight of shape `weight` ([out, in, …]).
pub(crate) fn scaling_mode(weight: &[usize], scale: Option<&[usize]>) -> Fp8Scaling {
    let Some(scale) = scale else {
        return Fp8Scaling::Unscaled;
    };
    let numel = scale.iter().fold(1usize, |a, &d| a.saturating_mul(d));
    if numel == 1 {
        return Fp8Scaling::Tensor;
    }
    let Some((&out, rest)) = weight.split_first() else {
        return Fp8Scaling::Unrecognised;
    };
    let inputs = rest.iter().fold(1usize, |a, &d| a.saturating_mul(d));
    match *scale {
        [o] | [o, 1] if o == out => Fp8Scaling::Channel,
        [o, blocks, 1] | [o, blocks] if o == out && blocks > 1 && inputs % blocks == 0 => {
            Fp8Scaling::Block {
                size: inputs / blocks,
            }
        }
        [r, c] if r > 0 && c > 0 => {
            let (rows, cols) = (out.div_ceil(r), inputs.div_ceil(c));
            if rows > 0 && cols > 0 && out.div_ceil(rows) == r && inputs.div_ceil(cols) == c {
                Fp8Scaling::Tile { rows, cols }
            } else {
                Fp8Scaling::Unrecognised
            }
        }
        _ => Fp8Scaling::Unrecognised,
    }
}

#[cfg(test)]
mod tests;
