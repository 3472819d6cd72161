//! Wan's samples during training as the planner counts them ([`crate::family::wan::samples`]): the VAE (loaded at
//! the start) and each prompt's umT5 embeddings (and its negative prompt's) stay on the device for the whole run; a
//! clip is denoised with UniPC, the negative prompt's pass after the prompt's (its prediction held meanwhile), and
//! decoded untiled by the causal 3-D VAE one latent frame at a time (four video frames each after the first).

use framesmith_models::wan::vae::{VaeConfig, WanVae};
use framesmith_models::wan::WanConfig;

use super::vae_for;
use crate::family::wan::demo_setup::demo_model_config;
use crate::plan::{chunked_decode_bytes, dtype_bytes, PlanError, PlanInput};
use crate::plan::{SampleShape, SamplingMemory};

/// The VAE's weights in the compute dtype.
fn vae_bytes(vae: &VaeConfig, c: u64) -> u64 {
    WanVae::tensor_shapes(vae).map_or(0, |shapes| {
        shapes
            .iter()
            .map(|(_, shape)| shape.iter().product::<usize>() as u64 * c)
            .sum()
    })
}

/// The decode of a clip of `frames` × `pixels` by `vae` in `c`-byte elements: a chunk at the decoder's last stage
/// (its widest channels × four frames, at the pixels it works at: Wan 2.2's un-patchifies after it) beside the
/// frames decoded so far; then the joined clip beside the chunks, and its conversion to RGB8 on the device (the
/// clip and two f32 copies at a time in `generate::frames::video_to_frames`).
fn decode_bytes(vae: &VaeConfig, frames: u64, pixels: u64, c: u64) -> u64 {
    let stages = 1usize << vae.dim_mult.len().saturating_sub(1);
    let patch = (vae.spatial_factor() / stages).max(1) as u64;
    let widest = (vae.dec_dim * vae.dim_mult.first().copied().unwrap_or(1)) as u64;
    let video = 3 * frames * pixels;
    let chunk = chunked_decode_bytes(widest, frames.min(4), pixels / (patch * patch), c);
    (chunk + video * c)
        .max(2 * video * c)
        .max(video * (c + 2 * 4))
}

/// What Wan's samples of `sample` hold and add, for the DiT `cfg` (the demo model's codec has no weights).
pub(super) fn sampling(
    cfg: &WanConfig,
    input: &PlanInput,
    sample: &SampleShape,
) -> Result<Option<SamplingMemory>, PlanError> {
    let c = dtype_bytes(input.compute);
    let vae = vae_for(cfg);
    let demo = *cfg == demo_model_config();
    let (frames, pixels) = (sample.frames as u64, (sample.width * sample.height) as u64);
    let latent_frames = vae.latent_frames(sample.frames) as u64;
    let s = vae.spatial_factor() as u64;
    let latents = cfg.latent_channels() as u64 * latent_frames * (pixels / (s * s)) * 4;
    let passes = 1 + u64::from(sample.guided);
    let prompts = sample.prompts as u64;
    let embeddings = prompts * passes * (cfg.text_len * cfg.text_dim) as u64 * c;
    let mut held = Vec::with_capacity(2);
    if !demo {
        held.push(("VAE".to_owned(), vae_bytes(&vae, c)));
    }
    held.push((
        format!("{prompts} prompts' umT5 embeddings (and their negative prompts')"),
        embeddings,
    ));
    Ok(Some(SamplingMemory {
        held,
        // The latents, the noise prediction of each pass, the guided velocity and UniPC's two kept outputs.
        denoise_state_bytes: (3 + passes + 2) * latents,
        decode_bytes: if demo {
            3 * frames * pixels * (c + 2 * 4)
        } else {
            decode_bytes(&vae, frames, pixels, c)
        },
        // The clip's RGB8 bytes copied to the host, and the frames handed to the PNG and MP4 writers.
        decoded_host_bytes: 3 * frames * pixels * 2,
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn longer_and_guided_clips_need_more() {
        let cfg = WanConfig::wan21_t2v_14b();
        let input = crate::plan::tests::fp8_14b();
        let sample = |frames: usize, guided: bool| SampleShape {
            width: 832,
            height: 480,
            frames,
            steps: 20,
            guided,
            prompts: 1,
        };
        let of = |s| sampling(&cfg, &input, &s).unwrap().unwrap();
        let (short, long) = (of(sample(17, true)), of(sample(81, true)));
        assert!(long.decode_bytes > short.decode_bytes);
        assert!(long.denoise_state_bytes > short.denoise_state_bytes);
        assert_eq!(long.held[0].0, "VAE");
        // umT5's 512 × 4096 embedding for the prompt and for the negative prompt, in bf16.
        assert_eq!(long.held[1].1, 2 * 512 * 4096 * 2);
        assert_eq!(of(sample(81, false)).held[1].1, 512 * 4096 * 2);
        // The 81-frame decode: the last stage's chunk (96 channels × 4 frames over every pixel) beside the clip.
        let pixels = 832 * 480;
        assert_eq!(
            long.decode_bytes,
            chunked_decode_bytes(96, 4, pixels, 2) + 3 * 81 * pixels * 2
        );
    }
}
