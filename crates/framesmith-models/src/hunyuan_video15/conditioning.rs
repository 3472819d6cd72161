//! The conditioning of HunyuanVideo 1.5 as the blocks see it: one text stream per sample holding, in the official
//! order, the I2V image tokens (`vision_in`), the valid glyph tokens (`byt5_in`) and the valid Qwen2.5-VL tokens
//! (`txt_in`), each with its `cond_type_embedding` row (2, 1, 0), then zero padding to the batch's longest; and the
//! I2V model input, the noisy latents with the condition latents and their mask as extra channels.

use candle_core::{DType, Result, Tensor};

/// Token states [b, l, d] whose first `lens[i]` tokens of sample i are valid, the rest padding.
#[derive(Clone, Debug)]
pub struct TextStates {
    pub states: Tensor,
    pub lens: Vec<usize>,
}

impl TextStates {
    /// The states with every token valid.
    pub fn all_valid(states: Tensor) -> Result<Self> {
        let (b, l, _) = states.dims3()?;
        Ok(Self {
            states,
            lens: vec![l; b],
        })
    }

    /// The states with the lengths of a mask [b, l] (non-zero: valid) whose valid tokens come first, as the
    /// official pipeline makes them; any other pattern is an error.
    pub fn from_mask(states: Tensor, mask: &Tensor) -> Result<Self> {
        let rows = mask.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let lens = rows
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let len = row.iter().take_while(|&&v| v != 0.0).count();
                if row[len..].iter().any(|&v| v != 0.0) {
                    candle_core::bail!(
                        "HunyuanVideo 1.5: the text mask of sample {i} has a valid token after padding; the mask \
                         must be valid tokens followed by padding, as the pipeline makes it"
                    );
                }
                Ok(len)
            })
            .collect::<Result<_>>()?;
        Ok(Self { states, lens })
    }

    fn check(&self, b: usize, what: &str) -> Result<()> {
        let (n, l, _) = self.states.dims3()?;
        if n != b || self.lens.len() != b || self.lens.iter().any(|&k| k > l) {
            candle_core::bail!(
                "HunyuanVideo 1.5: {what} lengths {:?} for states of {:?} in a batch of {b}",
                self.lens,
                self.states.dims()
            );
        }
        Ok(())
    }
}

/// Each sample's [image; valid glyph; valid text] tokens, zero-padded to the longest: [b, len, dim] and the
/// valid lengths. `image` holds tokens that are all valid; every input is already at the model width.
pub fn joint_text(
    image: Option<&Tensor>,
    byt5: Option<&TextStates>,
    txt: &TextStates,
) -> Result<(Tensor, Vec<usize>)> {
    let (b, _, dim) = txt.states.dims3()?;
    txt.check(b, "text")?;
    if let Some(g) = byt5 {
        g.check(b, "glyph text")?;
    }
    let mut rows = Vec::with_capacity(b);
    let mut lens = Vec::with_capacity(b);
    for i in 0..b {
        let mut parts = Vec::with_capacity(3);
        if let Some(image) = image {
            parts.push(image.get(i)?);
        }
        if let Some(g) = byt5 {
            parts.push(g.states.get(i)?.narrow(0, 0, g.lens[i])?);
        }
        parts.push(txt.states.get(i)?.narrow(0, 0, txt.lens[i])?);
        let row = Tensor::cat(&parts, 0)?;
        lens.push(row.dim(0)?);
        rows.push(row);
    }
    let longest = lens.iter().copied().max().unwrap_or(0);
    let padded = rows
        .into_iter()
        .zip(&lens)
        .map(|(row, &n)| {
            if n == longest {
                return Ok(row);
            }
            let pad = Tensor::zeros((longest - n, dim), row.dtype(), row.device())?;
            Tensor::cat(&[&row, &pad], 0)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((Tensor::stack(&padded, 0)?, lens))
}

/// The model input [b, 2c + 1, f, h, w] for noisy latents [b, c, f, h, w]: with `first_frame` ([b, c, 1, h, w],
/// the VAE latents of the I2V image) the condition channels hold it at frame 0 and the mask is 1 there; without
/// (T2V) both are zero.
pub fn model_input(noisy: &Tensor, first_frame: Option<&Tensor>) -> Result<Tensor> {
    let (b, c, f, h, w) = noisy.dims5()?;
    let (dtype, device) = (noisy.dtype(), noisy.device());
    let (cond, mask) = match first_frame {
        None => (
            Tensor::zeros((b, c, f, h, w), dtype, device)?,
            Tensor::zeros((b, 1, f, h, w), dtype, device)?,
        ),
        Some(first) => {
            if first.dims() != [b, c, 1, h, w] {
                candle_core::bail!(
                    "HunyuanVideo 1.5: the first-frame latents are {:?}, expected [{b}, {c}, 1, {h}, {w}]",
                    first.dims()
                );
            }
            let rest = |channels: usize| Tensor::zeros((b, channels, f - 1, h, w), dtype, device);
            let ones = Tensor::ones((b, 1, 1, h, w), dtype, device)?;
            (
                Tensor::cat(&[&first.to_dtype(dtype)?, &rest(c)?], 2)?,
                Tensor::cat(&[&ones, &rest(1)?], 2)?,
            )
        }
    };
    Tensor::cat(&[noisy, &cond, &mask], 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn joint_text_puts_valid_tokens_first_in_the_official_order() -> Result<()> {
        let dev = Device::Cpu;
        let image = Tensor::full(3f32, (2, 1, 2), &dev)?;
        let glyph = TextStates {
            states: Tensor::full(2f32, (2, 2, 2), &dev)?,
            lens: vec![2, 0],
        };
        let txt = TextStates {
            states: Tensor::full(1f32, (2, 3, 2), &dev)?,
            lens: vec![1, 3],
        };
        let (joint, lens) = joint_text(Some(&image), Some(&glyph), &txt)?;
        assert_eq!(lens, vec![4, 4]);
        let first: Vec<f32> = joint.get(0)?.narrow(1, 0, 1)?.flatten_all()?.to_vec1()?;
        assert_eq!(first, vec![3.0, 2.0, 2.0, 1.0]);
        let second: Vec<f32> = joint.get(1)?.narrow(1, 0, 1)?.flatten_all()?.to_vec1()?;
        assert_eq!(second, vec![3.0, 1.0, 1.0, 1.0]);
        let (_, lens) = joint_text(None, None, &txt)?;
        assert_eq!(lens, vec![1, 3]);
        Ok(())
    }

    #[test]
    fn masks_with_holes_are_refused() -> Result<()> {
        let dev = Device::Cpu;
        let states = Tensor::zeros((1, 3, 2), DType::F32, &dev)?;
        let holes = Tensor::new(&[[1u8, 0, 1]], &dev)?;
        assert!(TextStates::from_mask(states.clone(), &holes).is_err());
        let good = Tensor::new(&[[1i64, 1, 0]], &dev)?;
        assert_eq!(TextStates::from_mask(states, &good)?.lens, vec![2]);
        Ok(())
    }

    #[test]
    fn the_i2v_input_marks_the_first_frame() -> Result<()> {
        let dev = Device::Cpu;
        let noisy = Tensor::zeros((1, 2, 3, 1, 1), DType::F32, &dev)?;
        let first = Tensor::full(5f32, (1, 2, 1, 1, 1), &dev)?;
        let x = model_input(&noisy, Some(&first))?;
        assert_eq!(x.dims(), [1, 5, 3, 1, 1]);
        let mask: Vec<f32> = x.narrow(1, 4, 1)?.flatten_all()?.to_vec1()?;
        assert_eq!(mask, vec![1.0, 0.0, 0.0]);
        let cond: Vec<f32> = x.narrow(1, 2, 1)?.flatten_all()?.to_vec1()?;
        assert_eq!(cond, vec![5.0, 0.0, 0.0]);
        let t2v = model_input(&noisy, None)?;
        assert_eq!(t2v.abs()?.sum_all()?.to_scalar::<f32>()?, 0.0);
        Ok(())
    }
}
