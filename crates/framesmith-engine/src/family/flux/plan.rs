//! FLUX.1's description for the planner ([`ModelMemory`]): its double- and single-stream blocks with their bytes
//! from the official tensor list, which blocks stream for a count (`memory.flux_stream_order`), the joint
//! [text; image] sequence's tokens, and the step's activations.

use framesmith_config::run::FluxStreamOrder;
use framesmith_config::RunConfig;
use framesmith_models::flux::tokenizer::T5_MAX_TOKENS_DEV;
use framesmith_models::flux::weights::official_shapes;
use framesmith_models::flux::FluxConfig;
use framesmith_nn::lora::{LoraError, LoraFamily};
use framesmith_nn::offload::{streamed_blocks, StreamPlacement, ALIGN};

use super::train::{is_flux_file, train_dit};
use crate::family::image::plan::{
    block_buffers, family_lora_parameters, plan_model_of, token_grid, weights_by_component,
    PlanNames,
};
use crate::family::Family;
use crate::plan::{
    dtype_bytes, step_tokens, BaseFormat, BlockKind, BlockWidths, ModelMemory, PlanError,
    PlanInput, StepShape,
};
use crate::plan::{settle_sampling, SampleShape, SamplingMemory};
use crate::plan::{AdapterCount, DescribeModel, LoraShape, PlanModel};

mod sampling;

/// FLUX.1's DiT as the planner sees it: its sizes and the order its blocks stream in (`memory.flux_stream_order`).
#[derive(Debug, Clone, PartialEq)]
pub struct FluxPlanModel {
    pub config: FluxConfig,
    pub order: FluxStreamOrder,
}

impl DescribeModel for FluxPlanModel {
    fn family(&self) -> &'static dyn Family {
        &super::FluxFamily
    }

    fn describe(&self, input: &PlanInput) -> Result<ModelMemory, PlanError> {
        describe(&self.config, self.order, input)
    }

    fn num_blocks(&self) -> usize {
        self.config.depth + self.config.depth_single_blocks
    }

    fn settle(&self, cfg: &RunConfig, input: &mut PlanInput) {
        // FLUX.1 trains on images: one frame, whatever a video default says.
        input.clip.frames = 1;
        // Images, guidance-distilled: one pass per step, no negative prompt.
        settle_sampling(cfg, input, |_| 1, |_| false);
    }

    fn sampling(
        &self,
        input: &PlanInput,
        sample: &SampleShape,
    ) -> Result<Option<SamplingMemory>, PlanError> {
        sampling::sampling(&self.config, input, sample)
    }
}

/// The `model.variant` names that plan FLUX.1 [dev] (a run trains it from its file, with `variant = "auto"`).
pub const FLUX_DEV_NAMES: [&str; 3] = ["flux-dev", "flux1-dev", "flux.1-dev"];

/// FLUX.1 [dev] when the config names it (`model.variant = "flux-dev"`) or its `model.dit` is a FLUX.1 file (with
/// `variant = "auto"`; reads the file's header, not its weights); `None` for any other model.
pub(crate) fn plan_model(cfg: &RunConfig) -> Option<Result<PlanModel, PlanError>> {
    let names = PlanNames {
        variants: &FLUX_DEV_NAMES,
        named: FluxConfig::dev,
        is_file: |path| !path.is_dir() && is_flux_file(path),
        read: |path| Ok(train_dit(path)?.0),
    };
    plan_model_of(cfg, &names, |config| {
        PlanModel::new(FluxPlanModel {
            config,
            order: cfg.memory.flux_stream_order,
        })
    })
}

/// The indices (into `Flux::blocks`: the `depth` double-stream blocks, then the single-stream ones) of
/// `blocks_to_swap` streamed blocks. `single_first` / `double_first` take blocks of that kind until it runs out,
/// then of the other; within a kind, and over all blocks with `spread`, the streamed blocks are spread evenly so
/// resident blocks sit between them and hide their copies. At most every block but one streams.
pub fn flux_streamed_blocks(
    cfg: &FluxConfig,
    blocks_to_swap: usize,
    order: FluxStreamOrder,
) -> Vec<usize> {
    let (double, single) = (cfg.depth, cfg.depth_single_blocks);
    let total = double + single;
    let blocks_to_swap = blocks_to_swap.min(total.saturating_sub(1));
    let of_kind = |n: usize, first: usize, len: usize| -> Vec<usize> {
        streamed_blocks(len, n.min(len), StreamPlacement::Spread)
            .into_iter()
            .map(|i| first + i)
            .collect()
    };
    let mut out = match order {
        FluxStreamOrder::Spread => streamed_blocks(total, blocks_to_swap, StreamPlacement::Spread),
        FluxStreamOrder::SingleFirst => {
            let s = blocks_to_swap.min(single);
            let mut v = of_kind(blocks_to_swap - s, 0, double);
            v.extend(of_kind(s, double, single));
            v
        }
        FluxStreamOrder::DoubleFirst => {
            let d = blocks_to_swap.min(double);
            let mut v = of_kind(d, 0, double);
            v.extend(of_kind(blocks_to_swap - d, double, single));
            v
        }
    };
    out.sort_unstable();
    out
}

/// Text tokens per sample: T5-XXL's padded length for FLUX.1 [dev].
const TEXT_TOKENS: u64 = T5_MAX_TOKENS_DEV as u64;

/// Pixels per token side: the autoencoder's 8× and the 2×2 packing of latents into tokens.
const PIXELS_PER_TOKEN: usize = 16;

/// One block of the kind under `prefix`: (resident bytes, packed bytes as the streamer aligns each buffer).
fn block_sizes(cfg: &FluxConfig, prefix: &str, base: BaseFormat) -> (u64, u64) {
    let align = ALIGN as u64;
    let buffers = block_buffers(&official_shapes(cfg), prefix, base);
    (
        buffers.iter().sum(),
        buffers.iter().map(|b| b.div_ceil(align) * align).sum(),
    )
}

/// The weights outside the blocks, all in the compute dtype, by component.
fn resident_weights(cfg: &FluxConfig, compute: u64) -> Vec<(&'static str, u64)> {
    const GROUPS: [(&str, &str); 6] = [
        ("img_in.", "image and text input projections"),
        ("txt_in.", "image and text input projections"),
        ("time_in.", "time, guidance and pooled-text embeddings"),
        ("guidance_in.", "time, guidance and pooled-text embeddings"),
        ("vector_in.", "time, guidance and pooled-text embeddings"),
        ("final_layer.", "final layer"),
    ];
    weights_by_component(&official_shapes(cfg), &GROUPS, compute)
}

/// The adapter's size on FLUX.1's blocks (musubi-tuner's rules and FLUX.1 excludes).
fn lora_parameters(cfg: &FluxConfig, lora: &LoraShape) -> Result<AdapterCount, LoraError> {
    family_lora_parameters(LoraFamily::Flux, &official_shapes(cfg), lora)
}

/// The double- and single-stream blocks' sizes for a step of `shape` (the tapes and kept values
/// [`describe`] spells out).
fn block_kinds(cfg: &FluxConfig, input: &PlanInput, shape: &StepShape) -> Vec<BlockKind> {
    let (l, s, compute) = (shape.tokens, shape.residual_bytes, shape.compute_bytes);
    let r = input.lora.rank as u64;
    let (d, f, heads) = (
        cfg.hidden_size as u64,
        cfg.mlp_hidden_dim() as u64,
        cfg.num_heads as u64,
    );
    let kept_attention = l * d * compute + l * heads * 4;
    let double_tape = 2 * l * d * s
        + 2 * l * d * 4
        + 13 * l * d * compute
        + 2 * l * f * compute
        + 4 * l * r * compute
        + l * heads * 4;
    let single_tape = l * d * s
        + l * d * 4
        + 7 * l * d * compute
        + l * (3 * d + f) * compute
        + l * (d + f) * compute
        + 2 * l * r * compute
        + l * heads * 4;
    let (double_data, double_packed) = block_sizes(cfg, "double_blocks.0.", input.base);
    let (single_data, single_packed) = block_sizes(cfg, "single_blocks.0.", input.base);
    vec![
        BlockKind {
            label: "double-stream",
            data_bytes: double_data,
            packed_bytes: double_packed,
            tape_bytes: double_tape,
            kept_attention_bytes: kept_attention,
            kept_projection_bytes: 2 * l * d * compute,
        },
        BlockKind {
            label: "single-stream",
            data_bytes: single_data,
            packed_bytes: single_packed,
            tape_bytes: single_tape,
            kept_attention_bytes: kept_attention,
            kept_projection_bytes: l * d * compute,
        },
    ]
}

/// The FLUX.1 DiT `cfg`, its blocks streamed in `order`, for `input` (an image step: `clip.frames` is ignored).
///
/// The tapes (kept with `checkpointing = "off"`) are counted from the fields of `flux::double_block::grad` and
/// `flux::single_block::grad` (`L` tokens of the joint sequence, `d` width, `f` MLP width, `h` heads, `r` rank,
/// `c` / `s` compute and residual dtype bytes): a double-stream block keeps `2·L·d·s` of residual stream, `2·L·d·4`
/// of f32 norms, `13·L·d·c` of modulated inputs, projections, roped q/k, v and attention output, `2·L·f·c` of MLP
/// activations, `4·L·r·c` of LoRA activations and `L·h·4` of log-sum-exp; a single-stream block `L·d·s`, `L·d·4`,
/// `7·L·d·c`, `linear1`'s output `L·(3d + f)·c`, `linear2`'s input `L·(d + f)·c`, `2·L·r·c` and `L·h·4`. With
/// `checkpointing = "attention"` each block of either kind keeps its joint attention's output and log-sum-exp,
/// `L·d·c + L·h·4` (`nn::attention::KeptBlock`); `"attention_projection"` adds its gated branches' outputs, `2·L·d·c`
/// (`proj` and `mlp.2` over both streams) for a double-stream block and `L·d·c` (`linear2`) for a single one. The working
/// set uses the calibrated coefficients of [`WorkingSet`] with `linear1`'s output width `3d + f` as the MLP width;
/// it is not yet measured on FLUX.1.
pub(crate) fn describe(
    cfg: &FluxConfig,
    order: FluxStreamOrder,
    input: &PlanInput,
) -> Result<ModelMemory, PlanError> {
    let c = &input.clip;
    let (w, h) = token_grid(input, PIXELS_PER_TOKEN)?;
    let lora = lora_parameters(cfg, &input.lora)?;
    let batch = c.batch as u64;
    let tokens = step_tokens((w * h) as u64 + TEXT_TOKENS, c.batch)?;
    let (d, f, heads) = (
        cfg.hidden_size as u64,
        cfg.mlp_hidden_dim() as u64,
        cfg.num_heads as u64,
    );
    let compute = dtype_bytes(input.compute);
    let linear1 = 3 * d + f;
    let shape = StepShape {
        tokens,
        compute_bytes: compute,
        // The joint sequence between blocks is in the compute dtype (the batch comes in it; the model has no f32
        // residual stream, so `memory.residual_dtype` does not apply).
        residual_bytes: compute,
        dequantised_weight_bytes: match input.base {
            BaseFormat::Fp8(_) => linear1 * d * compute,
            BaseFormat::Dense(_) => 0,
        },
        // The widest block linear input: the single blocks' `linear2` takes the attention output and the MLP's.
        quantised_input_bytes: if input.fp8_products {
            tokens * (d + f + 4)
        } else {
            0
        },
        per_token_time: false,
    };
    let (l, s) = (tokens, shape.residual_bytes);
    let n = cfg.depth + cfg.depth_single_blocks;
    let widths = BlockWidths {
        dim: d,
        ffn_dim: linear1,
        heads,
        per_token_modulation_bytes: 0,
    };
    Ok(ModelMemory {
        name: if cfg.guidance_embed {
            "FLUX.1 [dev]".into()
        } else {
            "FLUX.1 (no guidance input)".into()
        },
        kinds: block_kinds(cfg, input, &shape),
        blocks: (0..n).map(|i| usize::from(i >= cfg.depth)).collect(),
        streamed: (0..n.max(1))
            .map(|blocks_to_swap| flux_streamed_blocks(cfg, blocks_to_swap, order))
            .collect(),
        resident: resident_weights(cfg, compute),
        lora,
        saved_input_bytes: l * d * s,
        // The conditioning vector, and RoPE's cos and sin over each token's head dimension in f32.
        shared_inputs: vec![(
            "conditioning vector and RoPE tables",
            batch * d * compute + 2 * l * cfg.head_dim() as u64 * 4,
        )],
        working_set_bytes: input.working_set.bytes_for(&widths, &shape),
        fragmentation_bytes: None,
        pixel_multiple: PIXELS_PER_TOKEN,
        frame_step: 0,
        shape,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
