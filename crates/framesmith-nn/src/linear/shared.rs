//! Several LoRA linears on one input (a block's `q`, `k` and `v`), outside autograd: their `down` factors run as
//! one product (the input read once rather than once per layer), and in the backward their `down` gradients and
//! their shares of the input gradient come from one product each over the concatenated low-rank terms.
//! Layers without a LoRA, a single layer, or tensors off CUDA take [`Linear::forward_untracked`] /
//! [`Linear::backward_with`] one by one; the batched results are those of the separate calls up to the order of
//! f32 summation.

use candle_core::{Result, Tensor, D};

use super::grad::{add_matmul, rows, InputGrad, LinearTape, LowRank, ParamGrad};
use super::Linear;
use crate::ops::Dense;

/// Whether the layers batch: more than one, each with a LoRA, on CUDA. On the CPU the separate calls run, whose
/// results do not depend on where a tensor happens to sit in memory (the CPU matmul's order of summation for the
/// concatenated shapes does: two runs of one step differed in a last bit).
fn batches(linears: &[&Linear], xs: &Tensor) -> bool {
    xs.device().is_cuda() && can_batch(linears)
}

/// More than one layer, each with a LoRA.
fn can_batch(linears: &[&Linear]) -> bool {
    linears.len() > 1 && linears.iter().all(|l| l.lora().is_some())
}

impl Linear {
    /// [`Linear::forward_untracked`] of each of `linears` on the same input `xs`, in order.
    pub fn forward_untracked_shared(
        linears: &[&Linear],
        xs: &Tensor,
    ) -> Result<Vec<(Tensor, LinearTape)>> {
        if !batches(linears, xs) {
            return linears.iter().map(|l| l.forward_untracked(xs)).collect();
        }
        Self::forward_batched(linears, xs)
    }

    /// [`Linear::forward_untracked_shared`] with the `down` products batched (every layer has a LoRA).
    fn forward_batched(linears: &[&Linear], xs: &Tensor) -> Result<Vec<(Tensor, LinearTape)>> {
        let x2 = xs.detach().dense()?.flatten_to(D::Minus2)?;
        let dtype = x2.dtype();
        let loras: Vec<_> = linears.iter().filter_map(|l| l.lora()).collect();
        if loras.len() != linears.len() {
            candle_core::bail!("shared forward: a layer lost its LoRA");
        }
        let downs = loras
            .iter()
            .map(|lora| lora.down.as_tensor().detach().to_dtype(dtype))
            .collect::<Result<Vec<_>>>()?;
        let mids = x2.matmul(&Tensor::cat(&downs, 0)?.t()?)?;
        let mut offset = 0;
        let mut out = Vec::with_capacity(linears.len());
        for ((lin, lora), down) in linears.iter().zip(loras).zip(&downs) {
            let rank = down.dim(0)?;
            let raw = mids.narrow(1, offset, rank)?;
            offset += rank;
            out.push(lin.finish_forward(&x2, LowRank::Lora { raw, lora }, lin.out_dims(xs))?);
        }
        Ok(out)
    }

    /// [`Linear::backward_with`] of `linears` that all read `xs`, for their output gradients `dys` and tapes
    /// (in the same order): the input gradient summed over them (as `input` says) and every layer's LoRA
    /// gradients, `down` then `up` for each layer in order.
    pub fn backward_shared(
        linears: &[&Linear],
        xs: &Tensor,
        tapes: &[&LinearTape],
        dys: &[Tensor],
        input: InputGrad,
    ) -> Result<(Option<Tensor>, Vec<ParamGrad>)> {
        if tapes.len() != linears.len() || dys.len() != linears.len() {
            candle_core::bail!(
                "shared backward: {} layers, {} tapes, {} output gradients",
                linears.len(),
                tapes.len(),
                dys.len()
            );
        }
        if !batches(linears, xs) {
            return one_by_one(linears, xs, tapes, dys, input);
        }
        Self::backward_batched(linears, xs, tapes, dys, input)
    }

    /// [`Linear::backward_shared`] with the low-rank terms batched (every layer has a LoRA).
    fn backward_batched(
        linears: &[&Linear],
        xs: &Tensor,
        tapes: &[&LinearTape],
        dys: &[Tensor],
        input: InputGrad,
    ) -> Result<(Option<Tensor>, Vec<ParamGrad>)> {
        let dtype = xs.dtype();
        let x2 = xs.detach().dense()?.flatten_to(D::Minus2)?;
        let mut dy2s = Vec::with_capacity(linears.len());
        let mut terms = Vec::with_capacity(linears.len());
        for ((lin, tape), dy) in linears.iter().zip(tapes).zip(dys) {
            let dy2 = rows(dy, dtype)?;
            let t = lin.low_rank_backward(&x2, tape, &dy2)?.ok_or_else(|| {
                candle_core::Error::Msg("shared backward: a layer lost its LoRA".into())
            })?;
            terms.push(t);
            dy2s.push(dy2);
        }
        // [m, Σ rank] and [Σ rank, in]: one product for every `down` gradient, one for the LoRAs' input gradient.
        let t_all = Tensor::cat(&terms.iter().map(|t| &t.t).collect::<Vec<_>>(), 1)?;
        let downs = Tensor::cat(&terms.iter().map(|t| &t.down).collect::<Vec<_>>(), 0)?;
        let d_downs = t_all.t()?.matmul(&x2)?;
        let mut params = Vec::with_capacity(2 * linears.len());
        let mut offset = 0;
        for t in terms {
            let rank = t.down.dim(0)?;
            params.push(t.grad_down(d_downs.narrow(0, offset, rank)?)?);
            params.push(t.d_up);
            offset += rank;
        }
        let mut dx = match input {
            InputGrad::Skip => return Ok((None, params)),
            InputGrad::New => t_all.matmul(&downs)?,
            InputGrad::Add(acc) => add_matmul(acc.flatten_to(D::Minus2)?, &t_all, &downs, false)?,
        };
        // The base products accumulate onto the low-rank sum (in their epilogue on CUDA).
        for (lin, dy2) in linears.iter().zip(&dy2s) {
            dx = add_matmul(dx, dy2, &lin.base.dense(dtype)?, false)?;
        }
        Ok((Some(dx.reshape(xs.shape())?), params))
    }
}

/// [`Linear::backward_shared`] as separate calls: the first layer's input gradient as `input` says, each later
/// one's added to it.
fn one_by_one(
    linears: &[&Linear],
    xs: &Tensor,
    tapes: &[&LinearTape],
    dys: &[Tensor],
    input: InputGrad,
) -> Result<(Option<Tensor>, Vec<ParamGrad>)> {
    let skip = matches!(input, InputGrad::Skip);
    let mut acc = match input {
        InputGrad::Add(a) => Some(a),
        _ => None,
    };
    let mut params = Vec::new();
    for ((lin, tape), dy) in linears.iter().zip(tapes).zip(dys) {
        let input = match (skip, acc.take()) {
            (true, _) => InputGrad::Skip,
            (false, Some(a)) => InputGrad::Add(a),
            (false, None) => InputGrad::New,
        };
        let (dx, p) = lin.backward_with(xs, tape, dy, input)?;
        acc = dx;
        params.extend(p);
    }
    Ok((acc, params))
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Var};
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use crate::fp8::{quantize, Fp8Scale};
    use crate::init::randn;
    use crate::linear::BaseWeight;
    use crate::lora::Lora;
    use crate::testing::rel;

    /// A layer `in` → `out` with a LoRA of `rank` (none for 0), an FP8 base and a bias as asked.
    fn layer(rng: &mut StdRng, out: usize, rank: usize, fp8: bool, bias: bool) -> Result<Linear> {
        let dev = Device::Cpu;
        let w = randn(rng, (out, 10), 0.0, 0.3, &dev)?;
        let base = if fp8 {
            BaseWeight::Fp8(quantize(&w, Fp8Scale::Tensor)?)
        } else {
            BaseWeight::Dense(w)
        };
        let bias = bias.then(|| randn(rng, out, 0.0, 0.1, &dev)).transpose()?;
        let mut lin = Linear::from_base(base, bias);
        if rank > 0 {
            let mut lora = Lora::new([10, out, rank], 1.5, DType::F32, &dev, rng)?;
            lora.up = Var::from_tensor(&randn(rng, (out, rank), 0.0, 0.2, &dev)?)?;
            lora.multiplier = 0.7;
            lin.set_lora(Some(lora));
        }
        Ok(lin)
    }

    fn grads_close(a: &[ParamGrad], b: &[ParamGrad]) -> Result<()> {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(
                x.var.as_tensor().id(),
                y.var.as_tensor().id(),
                "gradient order"
            );
            assert!(rel(&x.grad, &y.grad)? < 1e-6);
        }
        Ok(())
    }

    /// Batched forward and backward equal the separate calls, for layers of different ranks, widths, base
    /// formats and biases, with each way of taking the input gradient; a layer without a LoRA in the group
    /// falls back to the separate calls.
    #[test]
    fn shared_input_layers_match_separate_calls() -> Result<()> {
        let rng = &mut StdRng::seed_from_u64(17);
        for ranks in [[4, 4, 4], [4, 2, 3], [4, 0, 3]] {
            let lins = [
                layer(rng, 6, ranks[0], false, true)?,
                layer(rng, 8, ranks[1], true, false)?,
                layer(rng, 6, ranks[2], false, false)?,
            ];
            let refs: Vec<&Linear> = lins.iter().collect();
            let x = randn(rng, (2, 5, 10), 0.0, 1.0, &Device::Cpu)?;
            // The batched path runs on CUDA only; here it is called directly where it applies.
            let batched = can_batch(&refs);
            let shared = if batched {
                Linear::forward_batched(&refs, &x)?
            } else {
                Linear::forward_untracked_shared(&refs, &x)?
            };
            let separate = lins
                .iter()
                .map(|l| l.forward_untracked(&x))
                .collect::<Result<Vec<_>>>()?;
            let mut dys = Vec::new();
            for ((y, _), (want, _)) in shared.iter().zip(&separate) {
                assert_eq!(y.dims(), want.dims());
                assert!(rel(y, want)? < 1e-6, "forward, ranks {ranks:?}");
                dys.push(randn(rng, y.dims(), 0.0, 1.0, &Device::Cpu)?);
            }
            let tapes: Vec<&LinearTape> = shared.iter().map(|(_, t)| t).collect();
            let acc = randn(rng, (2, 5, 10), 0.0, 1.0, &Device::Cpu)?;
            for input in ["new", "add", "skip"] {
                let make = || match input {
                    "new" => InputGrad::New,
                    "add" => InputGrad::Add(acc.clone()),
                    _ => InputGrad::Skip,
                };
                let (dx, params) = if batched {
                    Linear::backward_batched(&refs, &x, &tapes, &dys, make())?
                } else {
                    Linear::backward_shared(&refs, &x, &tapes, &dys, make())?
                };
                let mut want_dx = match input {
                    "add" => Some(acc.clone()),
                    _ => None,
                };
                let mut want_params = Vec::new();
                for ((lin, tape), dy) in lins.iter().zip(&tapes).zip(&dys) {
                    let (d, p) = lin.backward(&x, tape, dy, input != "skip")?;
                    want_dx = match (want_dx, d) {
                        (Some(a), Some(d)) => Some((a + d)?),
                        (a, d) => a.or(d),
                    };
                    want_params.extend(p);
                }
                grads_close(&params, &want_params)?;
                match (dx, want_dx) {
                    (Some(dx), Some(want)) => {
                        assert_eq!(dx.dims(), x.dims());
                        assert!(
                            rel(&dx, &want)? < 1e-6,
                            "input gradient ({input}, ranks {ranks:?})"
                        );
                    }
                    (None, None) => assert_eq!(input, "skip"),
                    _ => panic!("input gradient present on one side only ({input})"),
                }
            }
        }
        Ok(())
    }
}
