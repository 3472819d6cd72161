//! Qwen-Image's description for the planner ([`ModelMemory`]): its dual-stream blocks with their bytes from the
//! official tensor list, which blocks stream for a count (spread evenly), the joint [text; image] sequence's
//! tokens, and the step's activations.

use framesmith_config::RunConfig;
use framesmith_data::family::qwen_image::cache::parse_qwen_latent_cache_name;
use framesmith_data::ValidConfig;
use framesmith_models::qwen_image::weights::official_shapes;
use framesmith_models::qwen_image::QwenImageConfig;
use framesmith_nn::lora::LoraFamily;

use super::pipeline::DEFAULT_CFG_SCALE;
use super::train::{dit_config, is_qwen_image_file};
use crate::family::image::plan::{
    dual_stream_memory, plan_model_of, token_grid, DualStreamDit, PlanNames,
};
use crate::family::Family;
use crate::generate::prompts::PromptSpec;
use crate::plan::{chunked_decode_bytes, settle_sampling, SampleShape, SamplingMemory};
use crate::plan::{dtype_bytes, ModelMemory, PlanError, PlanInput};
use crate::plan::{largest_cached_clip_of, ClipShape, DescribeModel, PlanModel};
use framesmith_models::wan::vae::{VaeConfig, WanVae};

/// Qwen-Image's transformer as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct QwenImagePlanModel {
    pub config: QwenImageConfig,
}

impl DescribeModel for QwenImagePlanModel {
    fn family(&self) -> &'static dyn Family {
        &super::QwenImageFamily
    }

    fn describe(&self, input: &PlanInput) -> Result<ModelMemory, PlanError> {
        describe(&self.config, input)
    }

    fn num_blocks(&self) -> usize {
        self.config.num_layers
    }

    fn settle(&self, cfg: &RunConfig, input: &mut PlanInput) {
        // Qwen-Image trains on images: one frame, whatever a video default says.
        input.clip.frames = 1;
        // True CFG against the negative prompt (" " when none is given) whenever the scale is above 1.
        let guided = |spec: &PromptSpec| spec.guidance.unwrap_or(DEFAULT_CFG_SCALE) > 1.0;
        settle_sampling(cfg, input, |_| 1, guided);
    }

    /// The VAE (Wan 2.1's architecture, loaded at the start) and each prompt's hidden states (and its negative
    /// prompt's) stay on the device for the whole run; a guided sample runs the negative prompt's pass after the
    /// prompt's; the VAE decodes the image as one chunk of one frame.
    fn sampling(
        &self,
        input: &PlanInput,
        sample: &SampleShape,
    ) -> Result<Option<SamplingMemory>, PlanError> {
        let c = dtype_bytes(input.compute);
        let vae = VaeConfig::wan21();
        let vae_bytes = WanVae::tensor_shapes(&vae).map_or(0, |shapes| {
            shapes
                .iter()
                .map(|(_, shape)| shape.iter().product::<usize>() as u64 * c)
                .sum()
        });
        let pixels = (sample.width * sample.height) as u64;
        let passes = 1 + u64::from(sample.guided);
        let prompts = sample.prompts as u64;
        let embeddings =
            prompts * passes * TEXT_TOKENS * self.config.joint_attention_dim as u64 * c;
        let widest = (vae.dim * vae.dim_mult.first().copied().unwrap_or(1)) as u64;
        Ok(Some(SamplingMemory {
            held: vec![
                ("VAE".into(), vae_bytes),
                (
                    format!("{prompts} prompts' hidden states (and their negative prompts')"),
                    embeddings,
                ),
            ],
            // The noise, the packed latents, their step and the predictions (one held through the negative
            // prompt's pass): [tokens, 64] f32 each.
            denoise_state_bytes: (3 + passes) * (pixels / 256) * self.config.in_channels as u64 * 4,
            // The decoded image in f32 beside the decoder's own working set.
            decode_bytes: chunked_decode_bytes(widest, 1, pixels, c) + 3 * pixels * 4,
            decoded_host_bytes: pixels * 3 * (4 + 1),
        }))
    }
}

/// The `model.variant` names that plan Qwen-Image (a run trains it from its file, with `variant = "auto"`).
pub const QWEN_IMAGE_NAMES: [&str; 2] = ["qwen-image", "qwen_image"];

/// Qwen-Image when the config names it (`model.variant = "qwen-image"`) or its `model.dit` is a Qwen-Image
/// transformer (with `variant = "auto"`; reads the file's header, not its weights); `None` for any other model.
pub(crate) fn plan_model(cfg: &RunConfig) -> Option<Result<PlanModel, PlanError>> {
    let names = PlanNames {
        variants: &QWEN_IMAGE_NAMES,
        named: QwenImageConfig::qwen_image,
        is_file: is_qwen_image_file,
        read: dit_config,
    };
    plan_model_of(cfg, &names, |config| {
        PlanModel::new(QwenImagePlanModel { config })
    })
}

/// The largest image among the Qwen-Image latent caches (`_qi`) of `valid`'s datasets, read from the cache files'
/// headers; `None` when nothing is cached for Qwen-Image.
pub(crate) fn largest_cached_clip(valid: &ValidConfig) -> Option<ClipShape> {
    largest_cached_clip_of(
        valid,
        |name, _| parse_qwen_latent_cache_name(name).is_some(),
        |[_, _, height, width], batch| ClipShape {
            width: width * VAE_FACTOR,
            height: height * VAE_FACTOR,
            frames: 1,
            batch,
        },
    )
}

/// Text tokens per sample the plan counts: captions are as long as they are (Qwen2.5-VL's hidden states of the
/// valid tokens, up to 1024); 256 covers the long captions of usual datasets. Longer captions take more.
const TEXT_TOKENS: u64 = 256;

/// Pixels per latent pixel of Qwen-Image's VAE.
const VAE_FACTOR: usize = 8;

/// Pixels per token side: the VAE's 8× and the 2×2 packing of latents into tokens.
const PIXELS_PER_TOKEN: usize = 16;

/// The weights outside the blocks by name prefix and component.
const RESIDENT_GROUPS: [(&str, &str); 6] = [
    ("img_in.", "image and text input projections"),
    ("txt_in.", "image and text input projections"),
    ("txt_norm.", "image and text input projections"),
    ("time_text_embed.", "timestep embedding"),
    ("norm_out.", "output norm and projection"),
    ("proj_out.", "output norm and projection"),
];

/// The Qwen-Image transformer `cfg` for `input` (an image step: `clip.frames` is ignored).
///
/// A dual-stream block is laid out as FLUX.1's double-stream block (per-stream modulation, joint attention over
/// [text; image], per-stream GELU-tanh MLPs of width `f` = 4d), so its tape is counted the same way (`L` tokens of
/// the joint sequence, `d` width, `h` heads, `r` rank, `c` / `s` compute and residual dtype bytes): `2·L·d·s` of
/// residual stream, `2·L·d·4` of f32 norms, `13·L·d·c` of modulated inputs, projections, roped q/k, v and attention
/// output, `2·L·f·c` of MLP activations, `4·L·r·c` of LoRA activations and `L·h·4` of log-sum-exp. With
/// `checkpointing = "attention"` a block keeps its attention output and log-sum-exp, `L·d·c + L·h·4`;
/// `"attention_projection"` adds the four gated branches' outputs over both streams, `2·L·d·c`. The working set is
/// the dual-stream block's backward counted from its tensors ([`dual_stream_memory`]).
pub(crate) fn describe(cfg: &QwenImageConfig, input: &PlanInput) -> Result<ModelMemory, PlanError> {
    let (w, h) = token_grid(input, PIXELS_PER_TOKEN)?;
    let (d, n) = (cfg.inner_dim() as u64, cfg.num_layers);
    dual_stream_memory(
        DualStreamDit {
            name: if d == 3072 && n == 60 {
                "Qwen-Image".into()
            } else {
                format!("Qwen-Image-style ({n} blocks, width {d})")
            },
            shapes: &official_shapes(cfg),
            block_prefix: "transformer_blocks.0.",
            groups: &RESIDENT_GROUPS,
            lora_family: LoraFamily::QwenImage,
            num_blocks: n,
            dims: (
                d,
                cfg.mlp_hidden_dim() as u64,
                cfg.num_attention_heads as u64,
            ),
            head_dim: cfg.attention_head_dim as u64,
            sample_tokens: (w * h) as u64 + TEXT_TOKENS,
            pixel_multiple: PIXELS_PER_TOKEN,
            frame_step: 0,
        },
        input,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
