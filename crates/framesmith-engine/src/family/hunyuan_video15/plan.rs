//! HunyuanVideo 1.5's description for the planner ([`ModelMemory`]): its double-stream blocks with their bytes
//! from the official tensor list, which blocks stream for a count (spread evenly), the joint [text; video]
//! sequence's tokens through the VAE's 16× spatial and 4× temporal compression (1×1×1 patches), the step's
//! activations, and what its samples during training hold and add (image-to-video: each prompt's start image).

use framesmith_config::run::TrainingMode;
use framesmith_config::RunConfig;
use framesmith_models::hunyuan_video15::vae::{Hv15Vae, Hv15VaeConfig};
use framesmith_models::hunyuan_video15::weights::official_shapes;
use framesmith_models::hunyuan_video15::HunyuanVideo15Config;
use framesmith_nn::lora::LoraFamily;

use super::decode::{official_tiles, DECODE_CHUNK_LATENTS};
use super::items::{VAE_FACTOR, VAE_TEMPORAL};
use super::pipeline::DEFAULT_GUIDANCE;
use super::train::{dit_config, is_hv15_file};
use crate::family::image::plan::{
    dual_stream_memory, latent_frames, plan_model_of, token_grid, DualStreamDit, PlanNames,
};
use crate::family::Family;
use crate::generate::prompts::PromptSpec;
use crate::plan::{
    budget_bytes, chunked_decode_bytes, dtype_bytes, settle_sampling, ModelMemory, PlanError,
    PlanInput, SampleShape, SamplingMemory,
};
use crate::plan::{DescribeModel, PlanModel};

/// HunyuanVideo 1.5's transformer as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Hv15PlanModel {
    pub config: HunyuanVideo15Config,
    /// Whether it trains image-to-video (the first frame's SigLIP tokens join the text).
    pub i2v: bool,
}

/// SigLIP tokens of an image-to-video clip's first frame.
pub const SIGLIP_TOKENS: u64 = 729;

impl DescribeModel for Hv15PlanModel {
    fn family(&self) -> &'static dyn Family {
        &super::HunyuanVideo15Family
    }

    fn describe(&self, input: &PlanInput) -> Result<ModelMemory, PlanError> {
        let image_tokens = if self.i2v { SIGLIP_TOKENS } else { 0 };
        describe(&self.config, input, image_tokens)
    }

    fn num_blocks(&self) -> usize {
        self.config.num_layers
    }

    fn settle(&self, cfg: &RunConfig, input: &mut PlanInput) {
        // The negative prompt ("" when none is given) runs as its own pass whenever the scale is above 1.
        let guided = |spec: &PromptSpec| spec.guidance.unwrap_or(DEFAULT_GUIDANCE) > 1.0;
        settle_sampling(cfg, input, PromptSpec::clip_frames, guided);
    }

    fn sampling(
        &self,
        input: &PlanInput,
        sample: &SampleShape,
    ) -> Result<Option<SamplingMemory>, PlanError> {
        Ok(Some(sampling(&self.config, self.i2v, input, sample)))
    }
}

/// What HunyuanVideo 1.5's samples of `sample` hold and add ([`super::samples`]): the VAE (loaded at the start) and
/// each prompt's Qwen2.5-VL states (and its negative prompt's) stay on the device for the whole run, and for
/// image-to-video (`i2v`) each prompt's start image as the DiT takes it, its SigLIP features and first-frame latents
/// (SigLIP and the VAE's encoder run before the DiT loads and are gone by then); the DiT's forward at the sample's
/// size counts the 729 image tokens with the text. A clip is denoised with Euler, the negative prompt's pass after
/// the prompt's (its prediction held meanwhile), each pass's input the noisy latents beside the condition latents
/// and mask, then decoded in the official tiles two latent frames at a time.
fn sampling(
    cfg: &HunyuanVideo15Config,
    i2v: bool,
    input: &PlanInput,
    sample: &SampleShape,
) -> SamplingMemory {
    let c = dtype_bytes(input.compute);
    let vae = Hv15VaeConfig::released();
    let vae_bytes = Hv15Vae::tensor_shapes(&vae).map_or(0, |shapes| {
        shapes
            .iter()
            .map(|(_, shape)| shape.iter().product::<usize>() as u64 * c)
            .sum()
    });
    let (frames, pixels) = (sample.frames as u64, (sample.width * sample.height) as u64);
    let s = VAE_FACTOR as u64;
    let grid = pixels / (s * s);
    let channels = cfg.out_channels as u64;
    let latent_frames = (frames.saturating_sub(1)) / VAE_TEMPORAL as u64 + 1;
    let latents = channels * latent_frames * grid;
    let passes = 1 + u64::from(sample.guided);
    let prompts = sample.prompts as u64;
    let embeddings = prompts * passes * TEXT_TOKENS * cfg.text_embed_dim as u64 * c;
    let mut held = vec![
        ("VAE".to_owned(), vae_bytes),
        (
            format!("{prompts} prompts' Qwen2.5-VL states (and their negative prompts')"),
            embeddings,
        ),
    ];
    if i2v {
        held.push((
            format!("{prompts} start images' SigLIP features and first-frame latents"),
            prompts * (SIGLIP_TOKENS * cfg.image_embed_dim as u64 + channels * grid) * c,
        ));
    }
    // The model input of a pass: the noisy latents, the condition latents and the mask, in f32 and in the
    // compute dtype; and the first frame's latents in f32 beside it.
    let model_input = (2 * channels + 1) * latent_frames * grid * (4 + c);
    let first_frame = if i2v { channels * grid * 4 } else { 0 };
    // The decode: a tile's chunk at the decoder's last stage (its first encoder width at full resolution, two
    // latent frames' video frames) beside the clip assembled in the compute dtype; then the clip with two f32
    // copies on its way to RGB8.
    let tile = official_tiles(budget_bytes(input).unwrap_or(u64::MAX)).sample_size as u64;
    let widest = vae.block_out_channels.first().copied().unwrap_or(128) as u64;
    let chunk_frames = frames.min((DECODE_CHUNK_LATENTS * VAE_TEMPORAL) as u64);
    let chunk = chunked_decode_bytes(widest, chunk_frames, pixels.min(tile * tile), c);
    let video = 3 * frames * pixels;
    SamplingMemory {
        held,
        // The latents, each pass's prediction, the guided velocity's scaled difference and sum (f32).
        denoise_state_bytes: (3 + passes) * latents * 4 + model_input + first_frame,
        decode_bytes: (chunk + video * c).max(video * (c + 2 * 4)),
        // The clip's RGB8 bytes copied to the host, and the frames handed to the PNG and MP4 writers.
        decoded_host_bytes: video * 2,
    }
}

/// The `model.variant` names that plan HunyuanVideo 1.5 (a run trains it from its file, with `variant = "auto"`).
pub const HV15_NAMES: [&str; 3] = ["hunyuan-video15", "hunyuan_video15", "hunyuan-video-1.5"];

/// HunyuanVideo 1.5 when the config names it (`model.variant = "hunyuan-video15"`) or its `model.dit` is a
/// HunyuanVideo transformer (with `variant = "auto"`; reads the file's header, not its weights), image-to-video
/// when `training.mode` says so; `None` for any other model.
pub(crate) fn plan_model(cfg: &RunConfig) -> Option<Result<PlanModel, PlanError>> {
    let i2v = cfg.training.mode == TrainingMode::ImageToVideo;
    let names = PlanNames {
        variants: &HV15_NAMES,
        named: HunyuanVideo15Config::hunyuan_video15,
        is_file: is_hv15_file,
        read: dit_config,
    };
    plan_model_of(cfg, &names, |config| {
        PlanModel::new(Hv15PlanModel { config, i2v })
    })
}

/// Text tokens per sample the plan counts: Qwen2.5-VL's hidden states of the caption's valid tokens (up to 1000)
/// and the glyph tokens of quoted text (up to 256); 256 covers the captions of usual datasets with no quotes.
const TEXT_TOKENS: u64 = 256;

/// The weights outside the blocks by name prefix and component.
const RESIDENT_GROUPS: [(&str, &str); 7] = [
    ("img_in.", "latent and timestep embeddings"),
    ("time_in.", "latent and timestep embeddings"),
    ("txt_in.", "text refiner"),
    ("byt5_in.", "glyph and image projections"),
    ("vision_in.", "glyph and image projections"),
    ("cond_type_embedding.", "glyph and image projections"),
    ("final_layer.", "output norm and projection"),
];

/// The HunyuanVideo 1.5 transformer `cfg` for `input`, with `image_tokens` I2V image tokens in the text.
///
/// Its blocks are the dual-stream blocks Qwen-Image's are (`models::mmdit`: per-stream modulation, joint attention
/// over [text; video], GELU-tanh MLPs of width `f` = 4d), so the tape is counted as Qwen-Image's (`L` tokens of the
/// joint sequence, `d` width, `h` heads, `r` rank, `c` / `s` compute and residual dtype bytes): `2·L·d·s` of
/// residual stream, `2·L·d·4` of f32 norms, `13·L·d·c` of modulated inputs, projections, roped q/k, v and attention
/// output, `2·L·f·c` of MLP activations, `4·L·r·c` of LoRA activations and `L·h·4` of log-sum-exp; `"attention"`
/// checkpointing keeps `L·d·c + L·h·4`, `"attention_projection"` adds `2·L·d·c`. The working set is the
/// dual-stream block's backward counted from its tensors ([`dual_stream_memory`]): at 49k tokens the
/// coefficients fitted to Wan's block left out one of the MLP's hidden layers and several `[L, d]` gradients.
pub(crate) fn describe(
    cfg: &HunyuanVideo15Config,
    input: &PlanInput,
    image_tokens: u64,
) -> Result<ModelMemory, PlanError> {
    let clip = &input.clip;
    let (w, h) = token_grid(input, VAE_FACTOR * cfg.patch_size.max(1))?;
    let f = latent_frames(clip.frames, VAE_TEMPORAL)? / cfg.patch_size_t.max(1);
    let (d, n) = (cfg.inner_dim() as u64, cfg.num_layers);
    dual_stream_memory(
        DualStreamDit {
            name: if d == 2048 && n == 54 {
                "HunyuanVideo 1.5 (8.3B)".into()
            } else {
                format!("HunyuanVideo-1.5-style ({n} blocks, width {d})")
            },
            shapes: &official_shapes(cfg),
            block_prefix: "double_blocks.0.",
            groups: &RESIDENT_GROUPS,
            lora_family: LoraFamily::HunyuanVideo15,
            num_blocks: n,
            dims: (
                d,
                cfg.mlp_hidden_dim() as u64,
                cfg.num_attention_heads as u64,
            ),
            head_dim: cfg.attention_head_dim as u64,
            sample_tokens: (f * w * h) as u64 + TEXT_TOKENS + image_tokens,
            pixel_multiple: VAE_FACTOR * cfg.patch_size.max(1),
            frame_step: VAE_TEMPORAL,
        },
        input,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
