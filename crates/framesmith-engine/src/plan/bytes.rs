//! Exact byte counts that hold for any model: how a base weight is stored (dense or FP8 codes and scales, as
//! `nn::linear` and `nn::fp8` hold them), dtypes' sizes, and the LoRA parameters over a model's official tensor
//! list. Each family counts its own blocks with these in its `family/<name>/plan.rs`.

use framesmith_config::plan::FloatDtype;
use framesmith_config::run::{BaseDtype, Fp8ScaleMode, LoraKind, LoraSection};
use framesmith_nn::adapter::AdapterKind;
use framesmith_nn::fp8::{self, Fp8Scale};
use framesmith_nn::lora::{check_rank, LoraError, LoraTargets};

use super::working_set::StepShape;
use super::LoraShape;

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

/// Elements of a tensor of `shape`.
pub fn elements(shape: &[usize]) -> u64 {
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

/// The adapter `[lora]` asks for (`kind` with LoKr's options), as `nn` makes it.
pub fn adapter_kind(lora: &LoraSection) -> AdapterKind {
    match lora.kind {
        LoraKind::Lora => AdapterKind::Lora,
        LoraKind::Lokr => AdapterKind::Lokr {
            factor: lora.factor,
            decompose_both: lora.decompose_both,
            full_matrix: lora.full_matrix,
        },
        LoraKind::Loha => AdapterKind::Loha,
        LoraKind::Dora => AdapterKind::Dora,
    }
}

/// An adapter's size over a model: its parameters and adapted linears, and the widths its working memory
/// scales with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdapterCount {
    pub params: u64,
    pub modules: usize,
    /// `[in, out]` of the adapted linear with the most elements `out · in` (of those, the widest output).
    pub largest: [usize; 2],
    /// The rank the adapters were counted at.
    pub rank: usize,
}

impl AdapterCount {
    /// Bytes one layer's adapter arithmetic holds beyond plain LoRA's for `kind` (LoKr's and LoHa's factored
    /// terms or merged weight, whichever way the layer runs; DoRA's output-sized product:
    /// `nn::adapter::AdapterKind::work_bytes` of the widest linear at the step's tokens). DoRA's tape keeps each
    /// layer's output for its magnitude gradient, but that output is the tensor the block's own tape keeps
    /// (shared, not copied), so it adds nothing here.
    pub fn work_bytes(&self, kind: AdapterKind, shape: &StepShape) -> u64 {
        let rows = usize::try_from(shape.tokens).unwrap_or(usize::MAX);
        kind.work_bytes(self.largest, self.rank, rows, shape.compute_bytes)
    }
}

/// Adapter parameters for any model, from its official `(name, shape)` list and its `targets` (musubi-tuner's
/// rules, `nn::lora::LoraTargets`): each adapted linear's count for the kind (`rank × (in + out)` for LoRA;
/// `nn::adapter::AdapterKind::parameter_count`); a rank above the narrowest adapted linear is refused
/// (`nn::lora::check_rank`) except for LoKr, where a large rank makes its factors full.
pub fn lora_parameters_of(
    shapes: &[(String, Vec<usize>)],
    targets: &LoraTargets,
    lora: &LoraShape,
) -> Result<AdapterCount, LoraError> {
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
    let (rank, kind) = (lora.rank, lora.kind);
    if !matches!(kind, AdapterKind::Lokr { .. }) {
        check_rank(rank, adapted.iter().copied())?;
    }
    Ok(AdapterCount {
        params: adapted
            .iter()
            .map(|(_, dims)| kind.parameter_count(*dims, rank))
            .sum(),
        modules: adapted.len(),
        largest: adapted
            .iter()
            .map(|(_, dims)| *dims)
            .max_by_key(|[i, o]| (i * o, *o))
            .unwrap_or_default(),
        rank,
    })
}
