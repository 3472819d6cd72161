//! SigLIP's image processor as the official code and musubi-tuner run it (transformers 4.57's
//! `SiglipImageProcessor`, Pillow-based; `SiglipImageProcessorPil` in transformers 5): the RGB image resized
//! with Pillow's bicubic filter to the tower's square size, whatever its aspect ratio ([`crate::resample`], the
//! same bytes as Pillow), then rescaled by 1/255 in float64, cast to float32 and normalised with mean and std 0.5.

use candle_core::{Device, Result, Tensor};
use image::RgbImage;

use crate::resample::{resize, Filter};

/// `rescale_factor` of the processor (1/255 in float64).
const RESCALE: f64 = 1.0 / 255.0;
/// `image_mean` and `image_std` of every SigLIP processor.
const MEAN: f32 = 0.5;
const STD: f32 = 0.5;

/// The normalised pixel of one 8-bit value, as numpy computes it (rescale in float64, then float32 arithmetic).
fn normalise(v: u8) -> f32 {
    ((f64::from(v) * RESCALE) as f32 - MEAN) / STD
}

/// `pixel_values` [3, size, size] (f32, on `device`) of `image`.
pub fn pixel_values(image: &RgbImage, size: usize, device: &Device) -> Result<Tensor> {
    if image.width() == 0 || image.height() == 0 || size == 0 {
        candle_core::bail!(
            "SigLIP cannot prepare an image of {}x{} for {size}x{size}",
            image.width(),
            image.height()
        );
    }
    let side =
        u32::try_from(size).map_err(|_| candle_core::Error::Msg(format!("image size {size}")))?;
    let resized = resize(image, side, side, Filter::Bicubic);
    let table: Vec<f32> = (0..=255u8).map(normalise).collect();
    let plane = size * size;
    let mut data = vec![0f32; 3 * plane];
    for (i, px) in resized.pixels().enumerate() {
        for (c, &v) in px.0.iter().enumerate() {
            data[c * plane + i] = table[usize::from(v)];
        }
    }
    Tensor::from_vec(data, (3, size, size), device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_map_to_minus_one_to_one_in_channel_planes() -> Result<()> {
        assert_eq!((normalise(0), normalise(255)), (-1.0, 1.0));
        let img = RgbImage::from_fn(2, 2, |x, y| image::Rgb([0, 255, (x + 2 * y) as u8]));
        let px = pixel_values(&img, 2, &Device::Cpu)?;
        assert_eq!(px.dims(), [3, 2, 2]);
        let planes = px.flatten_from(1)?.to_vec2::<f32>()?;
        assert_eq!(planes[0], vec![-1.0; 4]);
        assert_eq!(planes[1], vec![1.0; 4]);
        assert_eq!(planes[2][3], normalise(3));
        assert!(pixel_values(&RgbImage::new(0, 3), 2, &Device::Cpu).is_err());
        Ok(())
    }
}
