//! Image preprocessing of Wan's I2V pipelines: PyTorch's bicubic `F.interpolate` (what the official code uses
//! both for the CLIP input and for the frame it VAE-encodes) and the CLIP normalisation. Pixel arithmetic on the
//! host; tensors only at the edges.

use candle_core::{DType, Device, Result, Tensor};

use super::ClipVisionConfig;

/// PyTorch's cubic-convolution constant for bicubic interpolation.
const CUBIC_A: f64 = -0.75;

/// Weights of the taps at offsets −1, 0, 1, 2 around a source position with fractional part `t`.
fn cubic_weights(t: f64) -> [f64; 4] {
    let a = CUBIC_A;
    let near = |x: f64| ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    let far = |x: f64| ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

/// For each output index, the four (clamped) source indices and their weights, as PyTorch computes them with
/// `align_corners=False`: source position `scale · (i + 0.5) − 0.5`, not clamped, taps clamped to the border.
fn taps(input: usize, output: usize) -> Vec<([usize; 4], [f64; 4])> {
    let scale = input as f64 / output as f64;
    (0..output)
        .map(|i| {
            let real = scale * (i as f64 + 0.5) - 0.5;
            let base = real.floor();
            let idx = [-1.0, 0.0, 1.0, 2.0]
                .map(|k| (base + k).clamp(0.0, input.saturating_sub(1) as f64) as usize);
            (idx, cubic_weights(real - base))
        })
        .collect()
}

/// Bicubic resize of planar data `[c, h, w]` (row-major) to `[c, out_h, out_w]` with the semantics of
/// `F.interpolate(mode='bicubic', align_corners=False)` (no antialiasing, values not clamped).
pub fn resize_bicubic(
    data: &[f32],
    (c, h, w): (usize, usize, usize),
    (out_h, out_w): (usize, usize),
) -> Vec<f32> {
    let (rows, cols) = (taps(h, out_h), taps(w, out_w));
    let mut out = Vec::with_capacity(c * out_h * out_w);
    // Columns first into a [h, out_w] plane, then rows: the same sums as PyTorch's 4×4 taps.
    let mut plane = vec![0f64; h * out_w];
    for ch in data.chunks_exact(h * w).take(c) {
        for (y, row) in ch.chunks_exact(w).enumerate() {
            for (x, (idx, wt)) in cols.iter().enumerate() {
                plane[y * out_w + x] = (0..4).map(|k| wt[k] * row[idx[k]] as f64).sum();
            }
        }
        for (idx, wt) in &rows {
            for x in 0..out_w {
                let v: f64 = (0..4).map(|k| wt[k] * plane[idx[k] * out_w + x]).sum();
                out.push(v as f32);
            }
        }
    }
    out
}

/// [`resize_bicubic`] on a tensor `[c, h, w]` (any device and dtype; the result is f32 on the same device).
pub fn resize_bicubic_tensor(image: &Tensor, out_h: usize, out_w: usize) -> Result<Tensor> {
    let (c, h, w) = image.dims3()?;
    if h == 0 || w == 0 || out_h == 0 || out_w == 0 {
        candle_core::bail!("cannot resize an image of {w}x{h} to {out_w}x{out_h}");
    }
    let data = image
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let out = resize_bicubic(&data, (c, h, w), (out_h, out_w));
    Tensor::from_vec(out, (c, out_h, out_w), &Device::Cpu)?.to_device(image.device())
}

/// The CLIP input of an image `[3, H, W]` in [−1, 1], as the official `CLIPModel.visual`: bicubic resize to
/// the tower's square size, then `(x · 0.5 + 0.5 − mean) / std` per channel. Returns f32 `[3, S, S]`.
pub fn clip_pixels(image: &Tensor, cfg: &ClipVisionConfig) -> Result<Tensor> {
    if image.dim(0)? != 3 {
        candle_core::bail!(
            "CLIP expects an RGB image [3, H, W], got {:?}",
            image.dims()
        );
    }
    let s = cfg.image_size;
    let resized = resize_bicubic_tensor(image, s, s)?;
    let dev = image.device();
    let mean = Tensor::new(&cfg.mean.map(|m| m as f32), dev)?.reshape((3, 1, 1))?;
    let std = Tensor::new(&cfg.std.map(|v| v as f32), dev)?.reshape((3, 1, 1))?;
    ((resized * 0.5)? + 0.5)?
        .broadcast_sub(&mean)?
        .broadcast_div(&std)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_and_an_integer_position_is_exact() {
        for t in [0.0, 0.25, 0.5, 0.9] {
            let s: f64 = cubic_weights(t).iter().sum();
            assert!((s - 1.0).abs() < 1e-12, "{t}: {s}");
        }
        assert_eq!(cubic_weights(0.0), [0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn same_size_is_identity_and_constants_stay_constant() {
        let data: Vec<f32> = (0..2 * 3 * 5).map(|i| i as f32 * 0.1).collect();
        assert_eq!(resize_bicubic(&data, (2, 3, 5), (3, 5)), data);
        let flat = vec![0.7f32; 3 * 4 * 6];
        let up = resize_bicubic(&flat, (3, 4, 6), (9, 13));
        assert!(up.iter().all(|v| (v - 0.7).abs() < 1e-6));
    }

    /// Values computed by hand from PyTorch's formula for a 1×4 → 1×2 downscale: source positions 0.5 and 2.5.
    #[test]
    fn downscale_matches_the_pytorch_formula() {
        let row = [0.0f32, 1.0, 4.0, 9.0];
        let out = resize_bicubic(&row, (1, 1, 4), (1, 2));
        // t = 0.5: weights [-0.09375, 0.59375, 0.59375, -0.09375]; taps (clamped) [0, 0, 1, 4] and [1, 4, 9, 9].
        let first = -0.09375 * 0.0 + 0.59375 * 0.0 + 0.59375 * 1.0 - 0.09375 * 4.0;
        let second = -0.09375 * 1.0 + 0.59375 * 4.0 + 0.59375 * 9.0 - 0.09375 * 9.0;
        assert!((out[0] as f64 - first).abs() < 1e-6, "{out:?}");
        assert!((out[1] as f64 - second).abs() < 1e-6, "{out:?}");
    }
}
