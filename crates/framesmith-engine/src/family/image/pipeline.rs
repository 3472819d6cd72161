//! What the image families' sampling pipelines share: the seeded start noise, the check of an image's sides, the
//! decoded pixels as an RGB image, and the error of a loop its cancel poll stopped.

use candle_core::{DType, Device, Tensor};
use image::RgbImage;
use rand::rngs::StdRng;
use rand::SeedableRng;

use framesmith_nn::init::randn;

pub use crate::generate::request::Cancelled;

/// The start noise [1, `channels`, h, w] (f32) of `seed`, drawn on the host so a seed gives the same image on any
/// device.
pub fn start_noise(
    seed: u64,
    channels: usize,
    [h, w]: [usize; 2],
    device: &Device,
) -> candle_core::Result<Tensor> {
    let rng = &mut StdRng::seed_from_u64(seed);
    randn(rng, (1, channels, h, w), 0.0, 1.0, device)
}

/// Checks that both sides (`(name, pixels)`, named as the caller's flags or prompt options) are positive multiples
/// of `step` pixels, the size a `family` image takes.
pub(crate) fn check_sides(
    sides: [(&str, usize); 2],
    step: usize,
    family: &str,
) -> anyhow::Result<()> {
    for (name, px) in sides {
        if px == 0 || px % step != 0 {
            anyhow::bail!(
                "{name} {px}: {family} images are sized in multiples of {step} pixels (e.g. {})",
                (px / step).max(1) * step
            );
        }
    }
    Ok(())
}

/// The RGB image of `pixels` [1, 3, h, w], values already in 0..=255.
pub(crate) fn rgb_image(pixels: &Tensor) -> anyhow::Result<RgbImage> {
    let (_, _, h, w) = pixels.dims4()?;
    let bytes = pixels
        .get(0)?
        .permute((1, 2, 0))?
        .to_dtype(DType::U8)?
        .flatten_all()?
        .to_vec1::<u8>()?;
    RgbImage::from_raw(w as u32, h as u32, bytes)
        .ok_or_else(|| anyhow::anyhow!("the decoded image has the wrong number of pixels"))
}
