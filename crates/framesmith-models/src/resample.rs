//! Image resizing exactly as Pillow 13's `Image.resize` does it for 8-bit RGB (`libImaging/Resample.c`): a
//! separable convolution whose kernel widens by the scale when shrinking, coefficients normalised per output pixel
//! and turned into 22-bit fixed point, one pass per axis, each rounded to 8 bits. Every image processor that
//! resizes with Pillow runs it (Lanczos in diffusers' `VaeImageProcessor.resize` for Qwen-Image-Edit's condition
//! images, bicubic in the Qwen2-VL and SigLIP image processors), so the same bytes come out here; the `image`
//! crate's filters are float and differ by a level here and there.

use image::RgbImage;

/// Pillow's resampling filters used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// `Image.BICUBIC`: Keys' cubic with a = −0.5, support 2.
    Bicubic,
    /// `Image.LANCZOS`: sinc windowed by sinc, support 3.
    Lanczos,
}

const PRECISION_BITS: u32 = 32 - 8 - 2;

impl Filter {
    fn support(self) -> f64 {
        match self {
            Self::Bicubic => 2.0,
            Self::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            Self::Bicubic => {
                let a = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * a
                } else {
                    0.0
                }
            }
            Self::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let x = x * std::f64::consts::PI;
        x.sin() / x
    }
}

/// For each output pixel along one axis: the first input pixel and the fixed-point weights of the ones after it
/// (`precompute_coeffs` and `normalize_coeffs_8bpc`).
fn coefficients(in_size: usize, out_size: usize, filter: Filter) -> Vec<(usize, Vec<i32>)> {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    let ss = 1.0 / filterscale;
    (0..out_size)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            // C's `(int)` truncates toward zero; negative starts are clamped to 0 either way.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let w: Vec<f64> = (xmin..xmax.max(xmin))
                .map(|x| filter.weight((x as f64 - center + 0.5) * ss))
                .collect();
            let total: f64 = w.iter().sum();
            let fixed = w
                .iter()
                .map(|&k| {
                    let k = if total != 0.0 { k / total } else { k };
                    let scaled = k * f64::from(1u32 << PRECISION_BITS);
                    if k < 0.0 {
                        (scaled - 0.5) as i32
                    } else {
                        (scaled + 0.5) as i32
                    }
                })
                .collect();
            (xmin, fixed)
        })
        .collect()
}

fn clip8(v: i32) -> u8 {
    if v >= (1 << PRECISION_BITS << 8) {
        255
    } else if v <= 0 {
        0
    } else {
        (v >> PRECISION_BITS) as u8
    }
}

/// One pass of weights over `taps` samples spaced `stride` apart starting at `base` in `src` (3 channels).
fn convolve(src: &[u8], base: usize, stride: usize, weights: &[i32], out: &mut [u8]) {
    for c in 0..3 {
        let mut ss: i32 = 1 << (PRECISION_BITS - 1);
        for (i, &k) in weights.iter().enumerate() {
            ss = ss.wrapping_add(i32::from(src[base + i * stride + c]).wrapping_mul(k));
        }
        out[c] = clip8(ss);
    }
}

/// Horizontal pass of `weights` over rows `rows` of `src` (`src_w` pixels wide) into `out_w` columns.
fn horizontal(
    src: &[u8],
    src_w: usize,
    rows: std::ops::Range<usize>,
    weights: &[(usize, Vec<i32>)],
) -> Vec<u8> {
    let out_w = weights.len();
    let mut out = vec![0u8; rows.len() * out_w * 3];
    for (r, y) in rows.enumerate() {
        for (x, (start, k)) in weights.iter().enumerate() {
            let at = (r * out_w + x) * 3;
            convolve(src, (y * src_w + start) * 3, 3, k, &mut out[at..at + 3]);
        }
    }
    out
}

/// Vertical pass of `weights` (row starts relative to `first`) over `src` (`w` pixels wide).
fn vertical(src: &[u8], w: usize, first: usize, weights: &[(usize, Vec<i32>)]) -> Vec<u8> {
    let mut out = vec![0u8; weights.len() * w * 3];
    for (y, (start, k)) in weights.iter().enumerate() {
        for x in 0..w {
            let at = (y * w + x) * 3;
            convolve(
                src,
                ((start - first) * w + x) * 3,
                w * 3,
                k,
                &mut out[at..at + 3],
            );
        }
    }
    out
}

/// `image` resized to `width`×`height` as Pillow 13's `image.resize((width, height), filter)` does: the
/// horizontal pass first (over the rows the vertical pass reads), unless the height shrinks by more than twice
/// as many pixels as the width, then the vertical pass first (Pillow 12 and older always start horizontally;
/// the two orders differ by one level at some pixels).
pub fn resize(image: &RgbImage, width: u32, height: u32, filter: Filter) -> RgbImage {
    let (in_w, in_h) = (image.width() as usize, image.height() as usize);
    let (out_w, out_h) = (width as usize, height as usize);
    if (in_w, in_h) == (out_w, out_h) {
        return image.clone();
    }
    if out_w * out_h * in_w * in_h == 0 {
        return RgbImage::new(width, height);
    }
    let src = image.as_raw();
    let shrink_h = in_h as i64 - out_h as i64;
    let vertical_first = shrink_h > 0 && shrink_h > (in_w as i64 - out_w as i64) * 2;
    let (need_h, need_v) = (out_w != in_w, out_h != in_h);
    let raw = if vertical_first {
        let tall = vertical(src, in_w, 0, &coefficients(in_h, out_h, filter));
        match need_h {
            true => horizontal(&tall, in_w, 0..out_h, &coefficients(in_w, out_w, filter)),
            false => tall,
        }
    } else {
        let vert = coefficients(in_h, out_h, filter);
        let (first, last) = match need_v {
            true => (
                vert.first().map_or(0, |(start, _)| *start),
                vert.last().map_or(0, |(start, k)| start + k.len()),
            ),
            false => (0, in_h),
        };
        let wide = match need_h {
            true => horizontal(src, in_w, first..last, &coefficients(in_w, out_w, filter)),
            false => src[first * in_w * 3..last * in_w * 3].to_vec(),
        };
        match need_v {
            true => vertical(&wide, out_w, first, &vert),
            false => wide,
        }
    };
    RgbImage::from_raw(width, height, raw).unwrap_or_else(|| RgbImage::new(width, height))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flat_image_stays_flat_both_ways() {
        let flat = RgbImage::from_pixel(7, 5, image::Rgb([10, 200, 255]));
        for filter in [Filter::Bicubic, Filter::Lanczos] {
            for (w, h) in [(3, 2), (20, 11), (7, 9)] {
                let out = resize(&flat, w, h, filter);
                assert_eq!((out.width(), out.height()), (w, h));
                assert!(
                    out.pixels().all(|p| p.0 == [10, 200, 255]),
                    "{filter:?} {w}x{h}"
                );
            }
        }
    }

    #[test]
    fn the_same_size_is_a_copy() {
        let img = RgbImage::from_fn(4, 3, |x, y| image::Rgb([x as u8, y as u8, 7]));
        assert_eq!(resize(&img, 4, 3, Filter::Lanczos), img);
    }
}
