//! FLUX.1's samples during training as the planner counts them ([`crate::family::flux::samples`]): the autoencoder
//! (encoder and decoder, loaded at the start) and each prompt's T5-XXL and CLIP-L outputs stay on the device for the
//! whole run; a sample is one guidance-distilled pass per step (no negative prompt), then the decode.

use framesmith_models::flux::autoencoder::{AutoEncoder, AutoEncoderConfig};
use framesmith_models::flux::tokenizer::T5_MAX_TOKENS_DEV;
use framesmith_models::flux::FluxConfig;

use crate::plan::{dtype_bytes, PlanError, PlanInput, SampleShape, SamplingMemory};

/// The autoencoder's weights: the convolutions in the compute dtype, the GroupNorms in f32.
fn autoencoder_bytes(ae: &AutoEncoderConfig, compute: u64) -> u64 {
    AutoEncoder::tensor_shapes(ae).map_or(0, |shapes| {
        shapes
            .iter()
            .map(|(name, shape)| {
                let bytes = if name.contains("norm") { 4 } else { compute };
                shape.iter().product::<usize>() as u64 * bytes
            })
            .sum()
    })
}

/// The decoder's working set for an image of `pixels`, counted from `flux::autoencoder`'s code at the stage with
/// the most: a GroupNorm over `C` channels of `P` pixels holds its input (`c` bytes an element) and two f32
/// tensors at a time (`c + 8` bytes an element; it drops each as the next exists); a convolution
/// its input, the normed and activated copies and its output (`(3·C_in + C_out)·c`); an up-sampling its input,
/// the ×2 nearest copy and the convolution's output.
pub(super) fn decode_bytes(ae: &AutoEncoderConfig, pixels: u64, c: u64) -> u64 {
    let levels = ae.ch_mult.len();
    let Some(&top) = ae.ch_mult.last() else {
        return 0;
    };
    let norm = |ch: u64, p: u64| (c + 8) * ch * p;
    let conv = |cin: u64, cout: u64, p: u64| (3 * cin + cout) * c * p;
    let mut block_in = (ae.ch * top) as u64;
    let mut peak = 0;
    for i in (0..levels).rev() {
        let p = pixels >> (2 * i);
        let block_out = (ae.ch * ae.ch_mult[i]) as u64;
        for _ in 0..=ae.num_res_blocks {
            peak = peak
                .max(norm(block_in, p))
                .max(conv(block_in, block_out, p));
            block_in = block_out;
        }
        if i > 0 {
            let up = pixels >> (2 * (i - 1));
            peak = peak.max(block_in * (p + 2 * up) * c);
        }
    }
    peak
}

/// What FLUX.1's samples of `sample` hold and add, for the DiT `cfg`.
pub(super) fn sampling(
    cfg: &FluxConfig,
    input: &PlanInput,
    sample: &SampleShape,
) -> Result<Option<SamplingMemory>, PlanError> {
    let c = dtype_bytes(input.compute);
    let ae = AutoEncoderConfig::flux1();
    let pixels = (sample.width * sample.height) as u64;
    let prompts = sample.prompts as u64;
    let embeddings = prompts
        * (T5_MAX_TOKENS_DEV as u64 * cfg.context_in_dim as u64 + cfg.vec_in_dim as u64)
        * c;
    // The noise, the packed latents, their step and the prediction: [tokens, 64] f32 each.
    let latent_tokens = pixels / 256;
    Ok(Some(SamplingMemory {
        held: vec![
            (
                "autoencoder (encoder and decoder)".into(),
                autoencoder_bytes(&ae, c),
            ),
            (
                format!("{prompts} prompts' T5-XXL and CLIP-L outputs"),
                embeddings,
            ),
        ],
        denoise_state_bytes: 4 * latent_tokens * cfg.in_channels as u64 * 4,
        decode_bytes: decode_bytes(&ae, pixels, c),
        // The f32 image copied to the host, and its RGB8 pixels.
        decoded_host_bytes: pixels * 3 * (4 + 1),
    }))
}
