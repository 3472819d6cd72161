//! Images to the vision tower's input as transformers' `Qwen2VLImageProcessor` makes it (its PIL backend): each
//! image resized (Pillow bicubic) to `smart_resize`'s size (multiples of patch × merge, pixels within bounds,
//! aspect kept), rescaled to [0, 1], normalised with CLIP's mean and std, and cut into patches flattened in the
//! processor's order (merge squares one after the other; each patch as channel, frame, row, column with the image
//! repeated over the frames); `image_grid_thw` per image.

use candle_core::{Device, Tensor};
use image::RgbImage;

use super::window::Grid;
use crate::resample::{resize, Filter};

/// CLIP's per-channel mean (`OPENAI_CLIP_MEAN`).
pub const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
/// CLIP's per-channel standard deviation (`OPENAI_CLIP_STD`).
pub const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

/// The processor's settings (`preprocessor_config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessorConfig {
    /// Fewest pixels of a resized image.
    pub min_pixels: usize,
    /// Most pixels of a resized image.
    pub max_pixels: usize,
    /// Patch side in pixels.
    pub patch_size: usize,
    /// Frames per patch.
    pub temporal_patch_size: usize,
    /// Patches per side merged into one token.
    pub merge_size: usize,
}

impl Default for ImageProcessorConfig {
    /// Qwen-Image-Edit's `processor/preprocessor_config.json` (Qwen2.5-VL-7B-Instruct's).
    fn default() -> Self {
        Self {
            min_pixels: 3136,
            max_pixels: 12_845_056,
            patch_size: 14,
            temporal_patch_size: 2,
            merge_size: 2,
        }
    }
}

/// Why an image cannot be processed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessorError {
    #[error("an image of {width}×{height} pixels has an aspect ratio above 200, which Qwen2.5-VL refuses")]
    AspectRatio { width: usize, height: usize },
    #[error("an empty image ({width}×{height} pixels) cannot be encoded")]
    Empty { width: usize, height: usize },
    #[error("Qwen2.5-VL image processor: {0}")]
    Tensor(#[from] candle_core::Error),
}

/// `smart_resize`: (height, width) as multiples of `factor` near the image's, with between `min_pixels` and
/// `max_pixels` pixels. Python's `round` (ties to even) is kept.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> Result<(usize, usize), ProcessorError> {
    if height == 0 || width == 0 {
        return Err(ProcessorError::Empty { width, height });
    }
    if height.max(width) as f64 / height.min(width) as f64 > 200.0 {
        return Err(ProcessorError::AspectRatio { width, height });
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let mut h_bar = (h / f).round_ties_even() as usize * factor;
    let mut w_bar = (w / f).round_ties_even() as usize * factor;
    if h_bar * w_bar > max_pixels {
        let beta = (h * w / max_pixels as f64).sqrt();
        h_bar = factor.max((h / beta / f).floor() as usize * factor);
        w_bar = factor.max((w / beta / f).floor() as usize * factor);
    } else if h_bar * w_bar < min_pixels {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() as usize * factor;
        w_bar = (w * beta / f).ceil() as usize * factor;
    }
    Ok((h_bar, w_bar))
}

/// The processor's input to the vision tower.
#[derive(Debug, Clone)]
pub struct ProcessedImages {
    /// [Σ t·h·w, 3 · temporal · patch²] f32: every image's patches, one image after the other.
    pub pixel_values: Tensor,
    /// Each image's (frames, rows, columns) in patches.
    pub grids: Vec<Grid>,
}

impl ImageProcessorConfig {
    /// `image` resized (Pillow bicubic) to the size `smart_resize` gives it.
    pub fn resized(&self, image: &RgbImage) -> Result<RgbImage, ProcessorError> {
        let factor = self.patch_size * self.merge_size;
        let (h, w) = smart_resize(
            image.height() as usize,
            image.width() as usize,
            factor,
            self.min_pixels,
            self.max_pixels,
        )?;
        Ok(resize(image, w as u32, h as u32, Filter::Bicubic))
    }

    /// `Qwen2VLImageProcessor(images)`: `pixel_values` and `image_grid_thw` of `images`, on `device`.
    pub fn preprocess(
        &self,
        images: &[RgbImage],
        device: &Device,
    ) -> Result<ProcessedImages, ProcessorError> {
        let (p, t, m) = (self.patch_size, self.temporal_patch_size, self.merge_size);
        let patch_dim = 3 * t * p * p;
        let mut values = Vec::new();
        let mut grids = Vec::with_capacity(images.len());
        for image in images {
            let resized = self.resized(image)?;
            let (w, h) = (resized.width() as usize, resized.height() as usize);
            let raw = resized.as_raw();
            let normalised: Vec<f32> = raw
                .iter()
                .enumerate()
                .map(|(i, &b)| {
                    let c = i % 3;
                    let v = (f64::from(b) * (1.0 / 255.0)) as f32;
                    (v - CLIP_MEAN[c] as f32) / CLIP_STD[c] as f32
                })
                .collect();
            let (gh, gw) = (h / p, w / p);
            values.reserve(gh * gw * patch_dim);
            for by in 0..gh / m {
                for bx in 0..gw / m {
                    for my in 0..m {
                        for mx in 0..m {
                            let (y0, x0) = ((by * m + my) * p, (bx * m + mx) * p);
                            for c in 0..3 {
                                for _ in 0..t {
                                    for py in 0..p {
                                        let row = ((y0 + py) * w + x0) * 3 + c;
                                        values.extend((0..p).map(|px| normalised[row + px * 3]));
                                    }
                                }
                            }
                        }
                    }
                }
            }
            grids.push([1, gh, gw]);
        }
        let n = values.len() / patch_dim.max(1);
        Ok(ProcessedImages {
            pixel_values: Tensor::from_vec(values, (n, patch_dim), device)?,
            grids,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values transformers' `smart_resize` gives (Python 3.11); 70 / 28 = 2.5 rounds to 2, as Python rounds ties to even.
    #[test]
    fn smart_resize_matches_transformers() -> anyhow::Result<()> {
        for ((h, w), want) in [
            ((61, 45), (56, 56)),
            ((100, 150), (112, 140)),
            ((896, 1184), (896, 1176)),
            ((320, 448), (308, 448)),
            ((42, 70), (56, 56)),
            ((10, 10), (56, 56)),
            ((4000, 3000), (4004, 2996)),
        ] {
            assert_eq!(smart_resize(h, w, 28, 3136, 12_845_056)?, want, "{h}x{w}");
        }
        assert_eq!(smart_resize(896, 1184, 28, 3136, 15_680)?, (84, 140));
        assert!(smart_resize(1, 300, 28, 3136, 12_845_056).is_err());
        Ok(())
    }
}
