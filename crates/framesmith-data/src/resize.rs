//! Resizing an image or video frame to its bucket as musubi-tuner does: scale so the bucket is covered
//! (Lanczos when enlarging, pixel-area averaging when shrinking), then crop the centre.

use image::imageops::{self, FilterType};
use image::RgbImage;

use super::bucket::Size;

/// The filter a resize uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeFilter {
    /// Size already equals the bucket: nothing to do.
    None,
    /// Enlarging: Lanczos (a = 3), like PIL's `Image.LANCZOS`.
    Lanczos,
    /// Shrinking or same scale: average over the covered pixel area, like OpenCV's `INTER_AREA`.
    Area,
}

/// How an image of one size is brought to a bucket: scaled size, then a centre crop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResizePlan {
    /// Size after scaling, covering the bucket on both sides.
    pub scaled: Size,
    /// Left edge of the crop in the scaled image.
    pub crop_left: u32,
    /// Top edge of the crop in the scaled image.
    pub crop_top: u32,
    /// The bucket: size after cropping.
    pub bucket: Size,
    /// Which filter scales.
    pub filter: ResizeFilter,
}

/// musubi-tuner's `resize_image_to_bucket` arithmetic: one scale for both sides (the larger of the two ratios),
/// sides rounded half up, crop offsets rounded down.
pub fn resize_plan(src: Size, bucket: Size) -> ResizePlan {
    if src == bucket {
        return ResizePlan {
            scaled: src,
            crop_left: 0,
            crop_top: 0,
            bucket,
            filter: ResizeFilter::None,
        };
    }
    let (iw, ih) = (f64::from(src.0), f64::from(src.1));
    let scale = (f64::from(bucket.0) / iw).max(f64::from(bucket.1) / ih);
    // Python's int(x + 0.5) truncates; every value here is positive, so `as` matches it.
    let scaled = ((iw * scale + 0.5) as u32, (ih * scale + 0.5) as u32);
    // Rounding can leave a side one pixel short only if the bucket is not covered; keep the crop in range.
    let scaled = (scaled.0.max(bucket.0), scaled.1.max(bucket.1));
    ResizePlan {
        scaled,
        crop_left: (scaled.0 - bucket.0) / 2,
        crop_top: (scaled.1 - bucket.1) / 2,
        bucket,
        filter: if scale > 1.0 {
            ResizeFilter::Lanczos
        } else {
            ResizeFilter::Area
        },
    }
}

/// Resizes and centre-crops `image` to `bucket` (`(width, height)`).
pub fn resize_to_bucket(image: &RgbImage, bucket: Size) -> RgbImage {
    let plan = resize_plan(image.dimensions(), bucket);
    let scaled = match plan.filter {
        ResizeFilter::None => return image.clone(),
        ResizeFilter::Lanczos => {
            imageops::resize(image, plan.scaled.0, plan.scaled.1, FilterType::Lanczos3)
        }
        ResizeFilter::Area => resize_area(image, plan.scaled),
    };
    imageops::crop_imm(&scaled, plan.crop_left, plan.crop_top, bucket.0, bucket.1).to_image()
}

/// For each output index along one axis: the source indices it covers and their weights (summing to 1).
fn area_weights(src_len: u32, dst_len: u32) -> Vec<Vec<(usize, f32)>> {
    let scale = f64::from(src_len) / f64::from(dst_len);
    let src_end = f64::from(src_len);
    (0..dst_len)
        .map(|d| {
            let start = f64::from(d) * scale;
            let end = (start + scale).min(src_end);
            let width = end - start;
            let mut taps = Vec::new();
            let mut s = start.floor();
            while s < end {
                let covered = (s + 1.0).min(end) - s.max(start);
                if covered > 1e-9 {
                    taps.push((s as usize, (covered / width) as f32));
                }
                s += 1.0;
            }
            taps
        })
        .collect()
}

/// Shrinks `image` to `size` by averaging each output pixel's footprint (OpenCV `INTER_AREA` for shrinking).
pub fn resize_area(image: &RgbImage, size: Size) -> RgbImage {
    let (sw, sh) = image.dimensions();
    let (dw, dh) = size;
    if (sw, sh) == (dw, dh) {
        return image.clone();
    }
    let xw = area_weights(sw, dw);
    let yw = area_weights(sh, dh);
    let src = image.as_raw();
    let (sw_us, dw_us) = (sw as usize, dw as usize);
    // Horizontal pass into f32 rows of the source height.
    let mut rows = vec![0f32; dw_us * sh as usize * 3];
    for y in 0..sh as usize {
        let src_row = &src[y * sw_us * 3..(y + 1) * sw_us * 3];
        let dst_row = &mut rows[y * dw_us * 3..(y + 1) * dw_us * 3];
        for (x, taps) in xw.iter().enumerate() {
            for &(sx, w) in taps {
                for c in 0..3 {
                    dst_row[x * 3 + c] += w * f32::from(src_row[sx * 3 + c]);
                }
            }
        }
    }
    let mut out = vec![0u8; dw_us * dh as usize * 3];
    for (y, taps) in yw.iter().enumerate() {
        let dst_row = &mut out[y * dw_us * 3..(y + 1) * dw_us * 3];
        let mut acc = vec![0f32; dw_us * 3];
        for &(sy, w) in taps {
            let row = &rows[sy * dw_us * 3..(sy + 1) * dw_us * 3];
            for (a, v) in acc.iter_mut().zip(row) {
                *a += w * v;
            }
        }
        for (o, a) in dst_row.iter_mut().zip(&acc) {
            *o = a.round().clamp(0.0, 255.0) as u8;
        }
    }
    RgbImage::from_raw(dw, dh, out).unwrap_or_else(|| RgbImage::new(dw, dh))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn plan_matches_musubi_arithmetic() {
        // 1920x1080 → 960x544: scale = max(0.5, 0.50370) = 0.50370; 1920*s+0.5 = 967.6 → 967; 1080*s → 544.
        let p = resize_plan((1920, 1080), (960, 544));
        assert_eq!(p.scaled, (967, 544));
        assert_eq!((p.crop_left, p.crop_top), (3, 0));
        assert_eq!(p.filter, ResizeFilter::Area);
        // 640x480 → 832x624: scale 1.3 both ways, Lanczos, no crop.
        let p = resize_plan((640, 480), (832, 624));
        assert_eq!(p.scaled, (832, 624));
        assert_eq!((p.crop_left, p.crop_top), (0, 0));
        assert_eq!(p.filter, ResizeFilter::Lanczos);
        // 100x100 → 720x720.
        assert_eq!(
            resize_plan((100, 100), (720, 720)).filter,
            ResizeFilter::Lanczos
        );
        // Same size: untouched.
        assert_eq!(
            resize_plan((960, 544), (960, 544)).filter,
            ResizeFilter::None
        );
        // Wide image into a square bucket crops the sides: 1000x500 → 512x512: scale 1.024, 1024x512, left 256.
        let p = resize_plan((1000, 500), (512, 512));
        assert_eq!(p.scaled, (1024, 512));
        assert_eq!((p.crop_left, p.crop_top), (256, 0));
    }

    #[test]
    fn area_average_of_2x2_blocks() {
        let img = RgbImage::from_fn(4, 2, |x, _| {
            let v = if x % 2 == 0 { 0 } else { 100 };
            image::Rgb([v, v, 200])
        });
        let out = resize_area(&img, (2, 1));
        assert_eq!(out.dimensions(), (2, 1));
        assert_eq!(out.get_pixel(0, 0).0, [50, 50, 200]);
        assert_eq!(out.get_pixel(1, 0).0, [50, 50, 200]);
    }

    #[test]
    fn area_weights_cover_fractional_pixels() {
        // 3 → 2: each output covers 1.5 source pixels.
        let w = area_weights(3, 2);
        assert_eq!(w[0].len(), 2);
        assert!((w[0][0].1 - 2.0 / 3.0).abs() < 1e-6 && (w[0][1].1 - 1.0 / 3.0).abs() < 1e-6);
        assert_eq!(w[1].iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        for taps in &w {
            assert!((taps.iter().map(|t| t.1).sum::<f32>() - 1.0).abs() < 1e-6);
        }
    }

    #[test]
    fn resize_to_bucket_gives_bucket_size_and_keeps_flat_colour() {
        let img = RgbImage::from_pixel(37, 23, image::Rgb([10, 120, 250]));
        for bucket in [(16, 16), (64, 32), (32, 48)] {
            let out = resize_to_bucket(&img, bucket);
            assert_eq!(out.dimensions(), bucket);
            let p = out.get_pixel(bucket.0 / 2, bucket.1 / 2).0;
            assert!(
                p.iter()
                    .zip([10u8, 120, 250])
                    .all(|(a, b)| a.abs_diff(b) <= 1),
                "{p:?}"
            );
        }
    }

    #[test]
    fn centre_crop_takes_the_middle() {
        // Left half black, right half white, 4x1 → 2x1 bucket from 4x2 image: scale 1 on height → area path,
        // crop the middle two columns.
        let img = RgbImage::from_fn(4, 2, |x, _| image::Rgb([(x * 60) as u8, 0, 0]));
        let out = resize_to_bucket(&img, (2, 2));
        assert_eq!(out.get_pixel(0, 0).0[0], 60);
        assert_eq!(out.get_pixel(1, 0).0[0], 120);
    }
}
