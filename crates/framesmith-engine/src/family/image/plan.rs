//! What the image families' plan descriptions share: which model a run's config names (a variant the family
//! answers to, or its DiT file), and the byte arithmetic over a DiT's official tensor shapes (a block's frozen
//! buffers as the engine holds them, the weights outside the blocks by component), and the whole description of a
//! dual-stream (MMDiT) DiT.

use std::path::Path;

use framesmith_config::RunConfig;

use crate::plan::{
    dtype_bytes, elements, fp8_weight_buffers, lora_parameters_of, pool_fragmentation_bytes,
    step_tokens, AdapterCount, BaseFormat, BlockKind, BlockWidths, LoraShape, ModelMemory,
    PlanError, PlanInput, PlanModel, StepShape, WorkingSet,
};
use framesmith_nn::lora::{LoraError, LoraFamily, LoraTargets};
use framesmith_nn::offload::{streamed_blocks, StreamPlacement, ALIGN};

/// How an image family's DiT is named and read for the planner.
pub(crate) struct PlanNames<C> {
    /// The `model.variant` names that plan the family's model.
    pub variants: &'static [&'static str],
    /// The model those names plan.
    pub named: fn() -> C,
    /// Whether `model.dit` is the family's file (read from its header, not its weights).
    pub is_file: fn(&Path) -> bool,
    /// The sizes of the family's DiT file, or what is wrong with it.
    pub read: fn(&Path) -> anyhow::Result<C>,
}

/// The model the run `cfg` names, built by `model`, when it is the family's: a variant of `names`, or (with
/// `variant = "auto"`) a `model.dit` that is the family's file; `None` for the demo model and any other model.
pub(crate) fn plan_model_of<C>(
    cfg: &RunConfig,
    names: &PlanNames<C>,
    model: impl Fn(C) -> PlanModel,
) -> Option<Result<PlanModel, PlanError>> {
    let m = &cfg.model;
    if m.demo {
        return None;
    }
    if names
        .variants
        .iter()
        .any(|n| m.variant.eq_ignore_ascii_case(n))
    {
        return Some(Ok(model((names.named)())));
    }
    let auto = m.variant.eq_ignore_ascii_case("auto");
    if !auto || m.dit.as_os_str().is_empty() || !(names.is_file)(&m.dit) {
        return None;
    }
    Some(
        (names.read)(&m.dit)
            .map(model)
            .map_err(|err| PlanError::Inspect(format!("{err:#}"))),
    )
}

/// The size of every frozen buffer of one block, the tensors of `shapes` under `prefix` (`transformer_blocks.0.`),
/// as the engine holds them: linear weights in `base` (FP8: codes and scales), biases and norm scales in the
/// compute dtype.
pub(crate) fn block_buffers(
    shapes: &[(String, Vec<usize>)],
    prefix: &str,
    base: BaseFormat,
) -> Vec<u64> {
    let compute = dtype_bytes(base.compute_dtype());
    let mut out = Vec::new();
    for (name, shape) in shapes {
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        let linear = shape.len() == 2 && rest.ends_with(".weight");
        match (linear, base) {
            (true, BaseFormat::Dense(d)) => out.push(elements(shape) * dtype_bytes(d)),
            (true, BaseFormat::Fp8(mode)) => {
                let (codes, scales) = fp8_weight_buffers(shape[0], shape[1], mode);
                out.extend([codes, scales]);
            }
            (false, _) => out.push(elements(shape) * compute),
        }
    }
    out
}

/// The blocks of a DiT of `num_blocks` blocks that stream when `count` do: spread evenly, so resident blocks between
/// them hide their copies; at most every block but one.
pub fn spread_streamed_blocks(num_blocks: usize, count: usize) -> Vec<usize> {
    let n = num_blocks;
    streamed_blocks(n, count.min(n.saturating_sub(1)), StreamPlacement::Spread)
}

/// What a dual-stream block's tape holds beyond the terms every such block has: its f32 norm outputs and its
/// attentions' log-sum-exp, each counted in `L·d` and `L·h` values.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TapeCounts {
    /// The f32 norm outputs, in `L·d` values.
    pub f32_norms: u64,
    /// The attentions whose log-sum-exp the tape keeps, in `L·h` values.
    pub attentions: u64,
}

/// The sizes of a dual-stream block of width `d`, MLP width `f` and `heads` heads whose frozen buffers are
/// `buffers` ([`block_buffers`]), for a step of `shape` at `input`'s LoRA rank `r` (`L` tokens, `c` / `s` compute
/// and residual dtype bytes): a tape of `2·L·d·s` of residual stream, `n·L·d·4` of f32 norms, `13·L·d·c` of
/// modulated inputs, projections, roped q/k, v, gates and attention outputs, `2·L·f·c` of MLP activations, `4·L·r·c`
/// of LoRA activations and `a·L·h·4` of log-sum-exp (`n`, `a`: `counts`); `"attention"` checkpointing keeps
/// `L·d·c + L·h·4`, `"attention_projection"` adds `2·L·d·c`.
pub(crate) fn dual_stream_block_kind(
    buffers: &[u64],
    input: &PlanInput,
    shape: &StepShape,
    (d, f, heads): (u64, u64, u64),
    counts: TapeCounts,
) -> BlockKind {
    let (l, s, c) = (shape.tokens, shape.residual_bytes, shape.compute_bytes);
    let r = input.lora.rank as u64;
    let align = ALIGN as u64;
    BlockKind {
        label: "",
        data_bytes: buffers.iter().sum(),
        packed_bytes: buffers.iter().map(|b| b.div_ceil(align) * align).sum(),
        tape_bytes: 2 * l * d * s
            + counts.f32_norms * l * d * 4
            + 13 * l * d * c
            + 2 * l * f * c
            + 4 * l * r * c
            + counts.attentions * l * heads * 4,
        kept_attention_bytes: l * d * c + l * heads * 4,
        kept_projection_bytes: 2 * l * d * c,
    }
}

/// The working set of one dual-stream block's recompute and hand-written backward (`models::mmdit::block::grad`
/// with `models::modulated::StreamTail`), counted from the tensors alive at its peak rather than from the
/// coefficients [`WorkingSet::FUSED_BACKWARD`] fitted to Wan's block: the backward holds the recompute's whole tape
/// until it returns, and the peak is the end of the image stream's backward through its MLP and output projection,
/// whose intermediates are locals alive until that function returns. Over the step's `L` tokens (the image stream
/// is nearly all of them), `d` width, MLP width `f`, `heads` heads and LoRA rank `r`, with `c` / `s` the compute and
/// residual dtype bytes:
///
/// - `7·L·d·s`: the block input and the incoming gradient, both LayerNorm outputs and the residual after the
///   attention (the tape's, in the stream's dtype), the MLP half's input gradient and its sum with the gradient;
/// - `14·L·d·c`: the tape's modulated norms (2), raw q and k, the projection's and the MLP's outputs, the attention's
///   q, k, v and output, and the gradients of the MLP's output, the MLP's input, the projection's output and the
///   attention output;
/// - `4·L·f·c`: the MLP's hidden layer (taped), its GELU recomputed for `net.2`'s backward, and the gradients of
///   both;
/// - `6·L·r·c` of LoRA activations (q, k, v, the projection and both MLP linears) and `L·h·4` of log-sum-exp;
/// - an FP8 base's dequantised weight and an FP8 product's quantised input, as the calibrated model counts them.
///
/// The head's f32 tensors count as [`WorkingSet::bytes_for`] counts them, when they are more. Only for the manual
/// backward ([`WorkingSet::FUSED_BACKWARD`], the engine's default); any other working set (candle's autograd, a
/// sample's forward) keeps its coefficients.
pub(crate) fn dual_stream_working_set(
    input: &PlanInput,
    shape: &StepShape,
    widths: &BlockWidths,
) -> u64 {
    let set = &input.working_set;
    if *set != WorkingSet::FUSED_BACKWARD {
        return set.bytes_for(widths, shape);
    }
    let (l, s, c) = (shape.tokens, shape.residual_bytes, shape.compute_bytes);
    let (d, f, h) = (widths.dim, widths.ffn_dim, widths.heads);
    let r = input.lora.rank as u64;
    let block = l * d * (7 * s + 14 * c)
        + 4 * l * f * c
        + 6 * l * r * c
        + l * h * 4
        + set.dequantised_weights * shape.dequantised_weight_bytes
        + set.quantised_inputs * shape.quantised_input_bytes;
    block.max(l * d * 4 * set.head_tokens_dim_f32)
}

/// The memory pool's fragmentation under the dual-stream block's manual backward on an FP8 base, for its
/// `working` set: [`DUAL_STREAM_FP8_FRAGMENTATION_PERCENT`] of it, measured on the H200 (bench/RESULTS.md, session
/// 36: reserved less the tensors' own peak), far above the shared share a bf16 base stays within. Each of the
/// block's 14 linears dequantises its weight between the `[L, f]` and `[L, d]` tensors the tape holds through the
/// whole backward, and the pool cannot reuse the holes those small temporaries split. `None` (the shared share)
/// for a bf16 base or another working set.
pub(crate) fn dual_stream_fragmentation(
    input: &PlanInput,
    shape: &StepShape,
    working: u64,
) -> Option<u64> {
    if input.working_set != WorkingSet::FUSED_BACKWARD || shape.dequantised_weight_bytes == 0 {
        return None;
    }
    Some(
        (working * DUAL_STREAM_FP8_FRAGMENTATION_PERCENT / 100)
            .max(pool_fragmentation_bytes(working)),
    )
}

/// The dual-stream block's pool fragmentation on an FP8 base, as a percentage of its working set (measured).
pub(crate) const DUAL_STREAM_FP8_FRAGMENTATION_PERCENT: u64 = 42;

/// The weights of `shapes` outside the blocks, all `compute` bytes per value, summed by component: `groups` maps a
/// name prefix to its component's label (labels in the order they first appear).
pub(crate) fn weights_by_component(
    shapes: &[(String, Vec<usize>)],
    groups: &[(&str, &'static str)],
    compute: u64,
) -> Vec<(&'static str, u64)> {
    let mut out: Vec<(&'static str, u64)> = Vec::new();
    for (name, shape) in shapes {
        let Some(&(_, label)) = groups.iter().find(|(p, _)| name.starts_with(p)) else {
            continue;
        };
        let bytes = elements(shape) * compute;
        match out.iter_mut().find(|(l, _)| *l == label) {
            Some((_, total)) => *total += bytes,
            None => out.push((label, bytes)),
        }
    }
    out
}

/// The adapter's parameters and adapted linears for `lora` on the DiT of `shapes`, with the targets musubi-tuner
/// gives `family` (and the family's excludes).
pub(crate) fn family_lora_parameters(
    family: LoraFamily,
    shapes: &[(String, Vec<usize>)],
    lora: &LoraShape,
) -> Result<AdapterCount, LoraError> {
    let targets = LoraTargets::for_family(family, &lora.include_patterns, &lora.exclude_patterns)?;
    lora_parameters_of(shapes, &targets, lora)
}

/// The latent frames of a clip of `frames` frames for a VAE that packs `step` frames a latent after the first
/// (`step`·k + 1 frames), or the error naming the step.
pub(crate) fn latent_frames(frames: usize, step: usize) -> Result<usize, PlanError> {
    if frames == 0 || (frames - 1) % step != 0 {
        return Err(PlanError::Frames { frames, step });
    }
    Ok((frames - 1) / step + 1)
}

/// The image's token grid `(w, h)` of a step of `input` for a DiT that packs `pixels_per_token` pixels a side into
/// a token (the autoencoder's down-sampling × the 2×2 packing), after checking what the plan cannot describe: no
/// batch, sides that are not whole tokens, a LoRA of rank 0.
pub(crate) fn token_grid(
    input: &PlanInput,
    pixels_per_token: usize,
) -> Result<(usize, usize), PlanError> {
    let clip = &input.clip;
    if clip.batch == 0 {
        return Err(PlanError::ZeroBatch);
    }
    let whole = |n: usize| (n > 0 && n % pixels_per_token == 0).then_some(n / pixels_per_token);
    let (Some(w), Some(h)) = (whole(clip.width), whole(clip.height)) else {
        return Err(PlanError::Resolution {
            width: clip.width,
            height: clip.height,
            multiple: pixels_per_token,
        });
    };
    if input.lora.rank == 0 {
        return Err(LoraError::ZeroRank.into());
    }
    Ok((w, h))
}

/// The step shape and block widths of a dual-stream (MMDiT) DiT of width `d`, MLP width `ffn` and `heads` heads over
/// `tokens` tokens a step: the joint sequence between blocks in the compute dtype (no f32 residual stream, so
/// `memory.residual_dtype` does not apply), a modulation's d → 6d the widest dequantised linear, and the MLP's down
/// projection (input `ffn`) the widest input of an FP8 product.
pub(crate) fn dual_stream_shape(
    input: &PlanInput,
    tokens: u64,
    (d, ffn, heads): (u64, u64, u64),
) -> (StepShape, BlockWidths) {
    let compute = dtype_bytes(input.compute);
    let shape = StepShape {
        tokens,
        compute_bytes: compute,
        residual_bytes: compute,
        dequantised_weight_bytes: match input.base {
            BaseFormat::Fp8(_) => 6 * d * d * compute,
            BaseFormat::Dense(_) => 0,
        },
        quantised_input_bytes: if input.fp8_products {
            tokens * (ffn + 4)
        } else {
            0
        },
        per_token_time: false,
    };
    let widths = BlockWidths {
        dim: d,
        ffn_dim: ffn,
        heads,
        per_token_modulation_bytes: 0,
    };
    (shape, widths)
}

/// A dual-stream (MMDiT) DiT as the planner describes it: what a family says about its own model.
pub(crate) struct DualStreamDit<'a> {
    /// The model's name in the plan.
    pub name: String,
    /// The official tensor shapes of the DiT.
    pub shapes: &'a [(String, Vec<usize>)],
    /// The first block's prefix in `shapes` (`transformer_blocks.0.`).
    pub block_prefix: &'a str,
    /// The weights outside the blocks: name prefix and component label ([`weights_by_component`]).
    pub groups: &'a [(&'a str, &'static str)],
    /// Whose musubi-tuner LoRA targets apply.
    pub lora_family: LoraFamily,
    pub num_blocks: usize,
    /// Width `d`, MLP width and heads.
    pub dims: (u64, u64, u64),
    pub head_dim: u64,
    /// Tokens of the joint sequence per sample.
    pub sample_tokens: u64,
    pub pixel_multiple: usize,
    pub frame_step: usize,
}

/// The memory of a step of `dit` at `input`: its blocks ([`dual_stream_block_kind`] with two f32 norms and one
/// attention on the tape), any of them streamed ([`spread_streamed_blocks`]), the weights outside them in the
/// compute dtype, the LoRA, the saved block inputs in the compute dtype, the timestep embedding and RoPE's cos and
/// sin in f32 that every block shares, and the block backward's working set and fragmentation.
pub(crate) fn dual_stream_memory(
    dit: DualStreamDit<'_>,
    input: &PlanInput,
) -> Result<ModelMemory, PlanError> {
    let clip = &input.clip;
    let lora = family_lora_parameters(dit.lora_family, dit.shapes, &input.lora)?;
    let tokens = step_tokens(dit.sample_tokens, clip.batch)?;
    let d = dit.dims.0;
    let compute = dtype_bytes(input.compute);
    let (shape, widths) = dual_stream_shape(input, tokens, dit.dims);
    let counts = TapeCounts {
        f32_norms: 2,
        attentions: 1,
    };
    let buffers = block_buffers(dit.shapes, dit.block_prefix, input.base);
    let n = dit.num_blocks;
    let working = dual_stream_working_set(input, &shape, &widths);
    Ok(ModelMemory {
        name: dit.name,
        kinds: vec![dual_stream_block_kind(
            &buffers, input, &shape, dit.dims, counts,
        )],
        blocks: vec![0; n],
        streamed: (0..n.max(1))
            .map(|count| spread_streamed_blocks(n, count))
            .collect(),
        resident: weights_by_component(dit.shapes, dit.groups, compute),
        lora,
        saved_input_bytes: tokens * d * shape.residual_bytes,
        shared_inputs: vec![(
            "timestep embedding and RoPE tables",
            clip.batch as u64 * d * compute + 2 * tokens * dit.head_dim * 4,
        )],
        working_set_bytes: working,
        fragmentation_bytes: dual_stream_fragmentation(input, &shape, working),
        pixel_multiple: dit.pixel_multiple,
        frame_step: dit.frame_step,
        shape,
    })
}
