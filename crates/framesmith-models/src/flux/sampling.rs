//! FLUX.1 sampling helpers (the official `sampling.py`): the latent size for an image size, packing 2×2 latent
//! patches into tokens and back, the timestep schedule with its resolution-dependent shift, and the Euler loop.
//! Schedules are computed in f32 exactly as the official float32 tensor ops (reciprocals included) so that they
//! match bit for bit.

use candle_core::{Result, Tensor};

use super::rope::{image_ids, text_ids};

/// Latent channels of FLUX.1.
pub const LATENT_CHANNELS: usize = 16;

/// Latent [h, w] for an image of `height` × `width` pixels (`get_noise`): 2·⌈px/16⌉ each side, so the packed
/// grid is ⌈px/16⌉.
pub fn latent_size(height: usize, width: usize) -> [usize; 2] {
    [2 * height.div_ceil(16), 2 * width.div_ceil(16)]
}

/// `get_noise` without torch's generator: standard normal noise [num_samples, 16, h, w] from candle's RNG.
pub fn noise(
    num_samples: usize,
    height: usize,
    width: usize,
    device: &candle_core::Device,
) -> Result<Tensor> {
    let [h, w] = latent_size(height, width);
    Tensor::randn(0f32, 1.0, (num_samples, LATENT_CHANNELS, h, w), device)
}

/// `b c (h 2) (w 2) -> b (h w) (c 2 2)`: a latent [b, c, H, W] (H, W even) to tokens [b, H/2·W/2, 4c].
pub fn pack(latent: &Tensor) -> Result<Tensor> {
    let (b, c, h, w) = latent.dims4()?;
    if h % 2 != 0 || w % 2 != 0 {
        candle_core::bail!(
            "FLUX: latent size {h}×{w} is not even, so it cannot be packed into 2×2 patches"
        );
    }
    latent
        .reshape((b, c, h / 2, 2, w / 2, 2))?
        .permute((0, 2, 4, 1, 3, 5))?
        .reshape((b, (h / 2) * (w / 2), c * 4))
}

/// `unpack(x, height, width)`: tokens [b, ⌈height/16⌉·⌈width/16⌉, 4c] back to the latent [b, c, H, W].
pub fn unpack(xs: &Tensor, height: usize, width: usize) -> Result<Tensor> {
    let (b, l, d) = xs.dims3()?;
    let (h, w) = (height.div_ceil(16), width.div_ceil(16));
    if l != h * w || d % 4 != 0 {
        candle_core::bail!(
            "FLUX: {l} tokens of width {d} do not unpack to a {height}×{width} image"
        );
    }
    let c = d / 4;
    xs.reshape((b, h, w, c, 2, 2))?
        .permute((0, 3, 1, 4, 2, 5))?
        .reshape((b, c, 2 * h, 2 * w))
}

/// `prepare`'s packed image tokens, their ids and the text ids for a latent and a text length.
pub fn prepare(latent: &Tensor, txt_len: usize) -> Result<[Tensor; 3]> {
    let (b, _, h, w) = latent.dims4()?;
    let img = pack(latent)?;
    let img_ids = image_ids(b, h / 2, w / 2, 0.0, latent.device())?;
    Ok([img, img_ids, text_ids(b, txt_len, latent.device())?])
}

/// The resolution-dependent shift μ (`get_lin_function(y1=base_shift, y2=max_shift)(image_seq_len)`): linear
/// through (256, base_shift) and (4096, max_shift), in f64.
pub fn shift_mu(image_seq_len: usize, base_shift: f64, max_shift: f64) -> f64 {
    let m = (max_shift - base_shift) / (4096.0 - 256.0);
    let b = base_shift - m * 256.0;
    m * image_seq_len as f64 + b
}

/// `torch.linspace(1, 0, n)` in f32 as torch's CPU kernel computes it: `start + step·i` for the first half and
/// `end − step·(n − 1 − i)` for the second, each a fused multiply-add (one rounding).
fn linspace_one_to_zero(n: usize) -> Vec<f32> {
    if n == 1 {
        return vec![1.0];
    }
    let (start, end) = (1f32, 0f32);
    let step = (end - start) / (n - 1) as f32;
    let half = n / 2;
    (0..n)
        .map(|i| {
            if i < half {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((n - 1 - i) as f32, end)
            }
        })
        .collect()
}

/// `time_shift(mu, 1.0, t)` = e^μ / (e^μ + (1/t − 1)) on f32 values as torch evaluates it (`a / t` is
/// `reciprocal(t) * a`); t = 0 gives 0.
fn time_shift(mu: f64, t: f32) -> f32 {
    let e = mu.exp() as f32;
    let denom = e + (1.0 / t - 1.0);
    (1.0 / denom) * e
}

/// The shift of [`schedule`]: base and maximum μ (0.5 and 1.15 officially), or none (schnell).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shift {
    pub base_shift: f64,
    pub max_shift: f64,
}

impl Default for Shift {
    fn default() -> Self {
        Self {
            base_shift: 0.5,
            max_shift: 1.15,
        }
    }
}

/// `get_schedule(num_steps, image_seq_len, shift=…)`: `num_steps + 1` timesteps from 1 to 0, shifted towards 1
/// for long sequences when `shift` is given.
pub fn schedule(num_steps: usize, image_seq_len: usize, shift: Option<Shift>) -> Vec<f32> {
    let ts = linspace_one_to_zero(num_steps + 1);
    match shift {
        Some(s) => {
            let mu = shift_mu(image_seq_len, s.base_shift, s.max_shift);
            ts.into_iter().map(|t| time_shift(mu, t)).collect()
        }
        None => ts,
    }
}

/// The official `denoise` loop: for each pair of timesteps, `img + (t_prev − t_curr) · pred` with `pred` from
/// `model(img, t_vec, guidance_vec)` (t_vec and guidance_vec [b] in `img`'s dtype). The step is taken in f64 and
/// rounded to f32, as the official Python floats are.
pub fn denoise(
    img: &Tensor,
    timesteps: &[f32],
    guidance: f32,
    mut model: impl FnMut(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let b = img.dim(0)?;
    let full = |v: f32| Tensor::full(v, b, img.device())?.to_dtype(img.dtype());
    let guidance_vec = full(guidance)?;
    let mut img = img.clone();
    for pair in timesteps.windows(2) {
        let (t_curr, t_prev) = (pair[0], pair[1]);
        let pred = model(&img, &full(t_curr)?, &guidance_vec)?;
        let dt = (f64::from(t_prev) - f64::from(t_curr)) as f32;
        img = (img + (pred * f64::from(dt))?)?;
    }
    Ok(img)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flux::testkit::{assert_close, Case};
    use candle_core::{DType, Device};

    fn check_schedules(case: &Case) -> anyhow::Result<()> {
        let specs = case.config["schedules"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        anyhow::ensure!(!specs.is_empty(), "no schedules in config.json");
        for spec in specs {
            let steps = spec[0].as_u64().unwrap_or(0) as usize;
            let seq = spec[1].as_u64().unwrap_or(0) as usize;
            let shifted = spec[2].as_bool().unwrap_or(false);
            let key = format!(
                "n{steps}_seq{seq}_{}",
                if shifted { "shift" } else { "noshift" }
            );
            let got = schedule(steps, seq, shifted.then(Shift::default));
            let want = case
                .expected(&format!("schedule.{key}"))?
                .to_vec1::<f32>()?;
            let max_ulps = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs())
                .max()
                .unwrap_or(0);
            assert_eq!(got.len(), want.len(), "{key}");
            assert!(max_ulps == 0, "{key}: {max_ulps} ulps\n{got:?}\n{want:?}");
            eprintln!("schedule.{key}: max {max_ulps} ulp");
            if shifted {
                let mu = case.expected(&format!("mu.{key}"))?.to_vec1::<f64>()?[0];
                assert!((shift_mu(seq, 0.5, 1.15) - mu).abs() <= 1e-15, "mu.{key}");
            }
        }
        Ok(())
    }

    #[test]
    fn matches_the_official_sampling() -> anyhow::Result<()> {
        let case = Case::load("flux_schedule")?;
        check_schedules(&case)?;
        let noise_cfg = &case.config["noise"];
        let (height, width) = (
            noise_cfg["height"].as_u64().unwrap_or(0) as usize,
            noise_cfg["width"].as_u64().unwrap_or(0) as usize,
        );
        let noise_in = case.input("noise")?;
        let [h, w] = latent_size(height, width);
        assert_eq!(noise_in.dims(), [1, LATENT_CHANNELS, h, w]);
        assert_eq!(
            noise(1, height, width, &Device::Cpu)?.dims(),
            noise_in.dims()
        );
        let txt_len = case.input("txt")?.dim(1)?;
        let [packed, img_ids, txt_ids] = prepare(noise_in, txt_len)?;
        assert_close("packed", &packed, case.expected("packed")?, 0.0, 0.0)?;
        assert_close("img_ids", &img_ids, case.expected("img_ids")?, 0.0, 0.0)?;
        assert_close("txt_ids", &txt_ids, case.expected("txt_ids")?, 0.0, 0.0)?;
        let unpacked = unpack(&packed, height, width)?;
        assert_close("unpacked", &unpacked, case.expected("unpacked")?, 0.0, 0.0)?;

        let lp = &case.config["loop"];
        let steps = lp["steps"].as_u64().unwrap_or(0) as usize;
        let (a, b) = (
            lp["a"].as_f64().unwrap_or(0.0),
            lp["b"].as_f64().unwrap_or(0.0),
        );
        let guidance = lp["guidance"].as_f64().unwrap_or(0.0) as f32;
        let ts = schedule(
            steps,
            packed.dim(1)?,
            lp["shift"].as_bool().unwrap_or(false).then(Shift::default),
        );
        let want_ts = case.expected("loop.timesteps")?;
        assert_close(
            "loop.timesteps",
            &Tensor::new(ts.as_slice(), &Device::Cpu)?,
            want_ts,
            0.0,
            1.2e-7,
        )?;
        let mut k = 0;
        let out = denoise(&packed, &ts, guidance, |img, t, g| {
            let pred = ((img * a)? - (t * b)?.reshape((1, 1, 1))?.broadcast_as(img.shape())?)?;
            let check = |name: &str, got: &Tensor| -> Result<()> {
                let want = case
                    .expected(&format!("loop.{name}_{k}"))
                    .map_err(candle_core::Error::msg)?;
                assert_close(name, got, want, 1e-6, 1e-6).map_err(candle_core::Error::msg)?;
                Ok(())
            };
            check("img", img)?;
            check("t", t)?;
            check("pred", &pred)?;
            assert_close(
                "loop.guidance",
                g,
                case.expected("loop.guidance")
                    .map_err(candle_core::Error::msg)?,
                0.0,
                0.0,
            )
            .map_err(candle_core::Error::msg)?;
            k += 1;
            Ok(pred)
        })?;
        assert_eq!(k, steps);
        assert_close("loop.out", &out, case.expected("loop.out")?, 1e-6, 1e-6)?;
        assert_eq!(out.dtype(), DType::F32);
        Ok(())
    }

    #[test]
    fn pack_and_unpack_are_inverse() -> anyhow::Result<()> {
        let latent =
            Tensor::arange(0f32, 2.0 * 16.0 * 4.0 * 6.0, &Device::Cpu)?.reshape((2, 16, 4, 6))?;
        let back = unpack(&pack(&latent)?, 32, 48)?;
        assert_close("roundtrip", &back, &latent, 0.0, 0.0)?;
        Ok(())
    }
}
