//! Wan's description for the planner ([`ModelMemory`]): one kind of block whose bytes come from the official tensor
//! list ([`bytes`]), blocks streamed spread through the model, the clip's tokens through its VAE and patches, and the
//! step's activations as `models::wan::block::grad` records them ([`activations`]).

use framesmith_models::wan::WanConfig;
use framesmith_nn::lora::LoraError;
use framesmith_nn::offload::{streamed_blocks, StreamPlacement};

use super::demo_setup::demo_model_config;
use crate::family::Family;
use crate::plan::{
    dtype_bytes, residual_bytes, step_tokens, BaseFormat, BlockKind, ModelMemory, PlanError,
    PlanInput, StepShape,
};
use crate::plan::{settle_sampling, SampleShape, SamplingMemory};
use crate::plan::{ClipShape, DescribeModel, PlanModel};
use framesmith_config::RunConfig;
use framesmith_data::ValidConfig;
use framesmith_models::wan::vae::VaeConfig;

use super::mode::StartFrame;

mod activations;
mod bytes;
mod sampling;

pub use activations::{
    block_tape_bytes, kept_attention_bytes, per_token_modulation_bytes, shared_inputs,
    working_set_bytes,
};
pub use bytes::{
    block_buffers, block_bytes, block_data_bytes, latent_factors, lora_parameters,
    resident_weights, tokens_per_sample, vae_for,
};

impl DescribeModel for WanConfig {
    fn family(&self) -> &'static dyn Family {
        &super::WanFamily
    }

    fn describe(&self, input: &PlanInput) -> Result<ModelMemory, PlanError> {
        describe(self, input)
    }

    fn num_blocks(&self) -> usize {
        self.num_layers
    }

    fn settle(&self, cfg: &RunConfig, input: &mut PlanInput) {
        input.start_frame = super::mode::resolve(self, cfg.training.mode, cfg.model.demo)
            .is_ok_and(StartFrame::keeps_first_latent_frame);
        // A low-noise expert on a GPU of its own (`training.low_noise_device`) is that card's whole plan, the same as
        // this one's: nothing is parked on either.
        input.experts = (!cfg.model.dit_low_noise.as_os_str().is_empty()
            && !cfg.model.demo
            && cfg.training.low_noise_device.trim().is_empty())
        .then_some(cfg.model.experts);
        settle_sampling(
            cfg,
            input,
            |spec| spec.clip_frames(),
            |spec| spec.clip_guidance() > 1.0,
        );
    }

    fn sampling(
        &self,
        input: &PlanInput,
        sample: &SampleShape,
    ) -> Result<Option<SamplingMemory>, PlanError> {
        sampling::sampling(self, input, sample)
    }
}

impl From<WanConfig> for PlanModel {
    fn from(cfg: WanConfig) -> Self {
        Self::new(cfg)
    }
}

/// The Wan model a config trains: the demo model, the named variant, or the model read from the DiT's header when
/// `model.variant = "auto"` (reads the checkpoint's headers, not its weights). Asked after every other family.
pub(crate) fn plan_model(cfg: &RunConfig) -> Result<PlanModel, PlanError> {
    let m = &cfg.model;
    if m.demo {
        return Ok(demo_model_config().into());
    }
    if !m.variant.eq_ignore_ascii_case("auto") {
        return WanConfig::by_name(&m.variant)
            .map(PlanModel::from)
            .ok_or_else(|| PlanError::UnknownVariant(m.variant.clone()));
    }
    if m.dit.as_os_str().is_empty() {
        return Err(PlanError::UnknownModel);
    }
    framesmith_models::wan::weights::inspect(&m.dit)
        .map(|report| PlanModel::from(report.config))
        .map_err(|err| PlanError::Inspect(format!("{err:#}")))
}

/// Wan model `cfg` for `input`.
pub(crate) fn describe(cfg: &WanConfig, input: &PlanInput) -> Result<ModelMemory, PlanError> {
    let c = &input.clip;
    if c.batch == 0 {
        return Err(PlanError::ZeroBatch);
    }
    let (spatial, step) = latent_factors(cfg);
    if c.frames == 0 || (c.frames - 1) % step != 0 {
        return Err(PlanError::Frames {
            frames: c.frames,
            step,
        });
    }
    let per_sample =
        tokens_per_sample(cfg, c.width, c.height, c.frames).ok_or(PlanError::Resolution {
            width: c.width,
            height: c.height,
            multiple: spatial * cfg.patch_size[1].max(cfg.patch_size[2]),
        })?;
    if input.lora.rank == 0 {
        return Err(LoraError::ZeroRank.into());
    }
    let lora = lora_parameters(cfg, &input.lora)?;
    let tokens = step_tokens(per_sample, c.batch)?;
    let shape = StepShape {
        tokens,
        compute_bytes: dtype_bytes(input.compute),
        residual_bytes: residual_bytes(input.residual),
        dequantised_weight_bytes: match input.base {
            BaseFormat::Fp8(_) => (cfg.dim * cfg.ffn_dim) as u64 * dtype_bytes(input.compute),
            BaseFormat::Dense(_) => 0,
        },
        quantised_input_bytes: if input.fp8_products {
            tokens * (cfg.ffn_dim as u64 + 4)
        } else {
            0
        },
        per_token_time: input.start_frame,
    };
    let batch = c.batch as u64;
    let n = cfg.num_layers;
    Ok(ModelMemory {
        name: variant_name(cfg),
        kinds: vec![BlockKind {
            label: "",
            data_bytes: block_data_bytes(cfg, input.base),
            packed_bytes: block_bytes(cfg, input.base),
            tape_bytes: block_tape_bytes(cfg, batch, input.lora.rank as u64, &shape),
            kept_attention_bytes: kept_attention_bytes(cfg, &shape),
            kept_projection_bytes: shape.tokens * cfg.dim as u64 * shape.compute_bytes,
        }],
        blocks: vec![0; n],
        streamed: (0..n.max(1))
            .map(|blocks_to_swap| streamed_blocks(n, blocks_to_swap, StreamPlacement::Spread))
            .collect(),
        resident: resident_weights(cfg, input.compute),
        lora,
        saved_input_bytes: shape.tokens * cfg.dim as u64 * shape.residual_bytes,
        shared_inputs: shared_inputs(cfg, batch, &shape),
        working_set_bytes: working_set_bytes(&input.working_set, cfg, &shape),
        fragmentation_bytes: None,
        pixel_multiple: 16 * (vae_for(cfg).spatial_factor() / 8).max(1),
        frame_step: vae_for(cfg).temporal_factor(),
        shape,
    })
}

/// The command-line name of a named variant (`t2v-14b`), `tiny` for the demo model, else its shape.
pub fn variant_name(cfg: &WanConfig) -> String {
    if let Some((name, _)) = WanConfig::named_variants()
        .into_iter()
        .find(|(_, c)| c == cfg)
    {
        return name.to_string();
    }
    if *cfg == demo_model_config() {
        return format!("tiny demo model ({} blocks)", cfg.num_layers);
    }
    format!(
        "Wan (dim {}, {} blocks, ffn {})",
        cfg.dim, cfg.num_layers, cfg.ffn_dim
    )
}

/// The largest clip among the Wan latent caches of `valid`'s datasets (read from the cache files' headers, through
/// the demo codec's factors for the `demo` model and the VAE's otherwise); `None` when nothing is cached yet.
pub(crate) fn largest_cached_clip(valid: &ValidConfig, demo: bool) -> Option<ClipShape> {
    use framesmith_data::cache::parse_latent_cache_name;
    crate::plan::largest_cached_clip_of(
        valid,
        |name, kind| parse_latent_cache_name(name, kind).is_some(),
        |[channels, frames, height, width], batch| {
            let (s, t) = cache_factors(channels, demo);
            ClipShape {
                width: width * s,
                height: height * s,
                frames: (frames.max(1) - 1) * t + 1,
                batch,
            }
        },
    )
}

/// Spatial and temporal compression of latents of `channels` channels: the demo codec's for the demo model
/// (its caches are made with it), else the VAE's with that many latent channels.
fn cache_factors(channels: usize, demo: bool) -> (usize, usize) {
    if demo {
        return (crate::demo::codec::FACTOR, crate::demo::codec::TEMPORAL);
    }
    let vae = if channels == VaeConfig::wan22().z_dim {
        VaeConfig::wan22()
    } else {
        VaeConfig::wan21()
    };
    (vae.spatial_factor(), vae.temporal_factor())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
