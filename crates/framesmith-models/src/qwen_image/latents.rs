//! Qwen-Image's latents as its transformer takes them: diffusers' `QwenImagePipeline._pack_latents` folds each
//! 2×2 patch of a latent [b, c, h, w] into one token of width 4c (channel-major: `c, ph, pw`), row by row;
//! [`unpack`] undoes it.

use candle_core::{Result, Tensor};

/// Latents [b, c, h, w] (h and w even) as tokens [b, (h/2)(w/2), 4c].
pub fn pack(xs: &Tensor) -> Result<Tensor> {
    let (b, c, h, w) = xs.dims4()?;
    if h % 2 != 0 || w % 2 != 0 {
        candle_core::bail!("Qwen-Image packs 2×2 patches: a {h}×{w} latent has odd sides");
    }
    xs.reshape((b, c, h / 2, 2, w / 2, 2))?
        .permute((0, 2, 4, 1, 3, 5))?
        .reshape((b, (h / 2) * (w / 2), c * 4))
}

/// Tokens [b, (h/2)(w/2), 4c] back to the latent [b, c, h, w] of latent size `[h, w]`.
pub fn unpack(xs: &Tensor, [h, w]: [usize; 2]) -> Result<Tensor> {
    let (b, l, d) = xs.dims3()?;
    if h % 2 != 0 || w % 2 != 0 || l != (h / 2) * (w / 2) || d % 4 != 0 {
        candle_core::bail!("Qwen-Image: {l} tokens of width {d} do not unpack to a {h}×{w} latent");
    }
    xs.reshape((b, h / 2, w / 2, d / 4, 2, 2))?
        .permute((0, 3, 1, 4, 2, 5))?
        .reshape((b, d / 4, h, w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn tokens_hold_2x2_patches_channel_major_and_unpack_back() -> Result<()> {
        let xs =
            Tensor::arange(0f32, 2.0 * 3.0 * 4.0 * 6.0, &Device::Cpu)?.reshape((2, 3, 4, 6))?;
        let packed = pack(&xs)?;
        assert_eq!(packed.dims(), &[2, 6, 12]);
        // Token (row 1, column 2) of sample 1, entry c·4 + ph·2 + pw: pixel (2 + ph, 4 + pw) of channel c.
        let token = packed.get(1)?.get(5)?.to_vec1::<f32>()?;
        for c in 0..3 {
            for (ph, pw) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                let want = xs
                    .get(1)?
                    .get(c)?
                    .get(2 + ph)?
                    .get(4 + pw)?
                    .to_scalar::<f32>()?;
                assert_eq!(token[c * 4 + ph * 2 + pw], want);
            }
        }
        let back = unpack(&packed, [4, 6])?;
        assert_eq!(
            back.flatten_all()?.to_vec1::<f32>()?,
            xs.flatten_all()?.to_vec1::<f32>()?
        );
        assert!(unpack(&packed, [4, 4]).is_err());
        assert!(pack(&xs.narrow(2, 0, 3)?).is_err());
        Ok(())
    }
}
