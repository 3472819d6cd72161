//! The adapters' small per-layer passes (LoHa's row-wise outer products and their gradients, DoRA's row norms),
//! each one kernel on CUDA for f32 factors and the candle composition written here elsewhere — the reference the
//! device checks hold the kernels to. Outside autograd: the adapters' hand-written backward calls them.

use candle_core::{DType, Result, Tensor};

/// Whether the CUDA kernels take factors `ts`: f32 CUDA tensors outside autograd.
#[cfg(feature = "cuda")]
fn on_kernel(ts: &[&Tensor]) -> bool {
    ts.iter()
        .all(|t| t.device().is_cuda() && t.dtype() == DType::F32 && !t.track_op())
}

/// A dtype the kernels write or read: f32 or bf16.
#[cfg(feature = "cuda")]
fn kernel_dtype(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16)
}

/// `(n, r)` of two factors each holding `n` vectors of `r` values: rows of [n, r], or with `columns` columns of
/// [r, n].
fn pair_dims(a: &Tensor, b: &Tensor, columns: bool) -> Result<[usize; 2]> {
    let (rows, cols) = a.dims2()?;
    if b.dims() != a.dims() {
        candle_core::bail!(
            "pair products: factors of shapes {:?} and {:?}",
            a.dims(),
            b.dims()
        );
    }
    Ok(if columns { [cols, rows] } else { [rows, cols] })
}

/// `a` as [n, r] rows in its own dtype (a column factor transposed and copied).
fn as_rows(a: &Tensor, columns: bool) -> Result<Tensor> {
    if columns {
        a.t()?.contiguous()
    } else {
        Ok(a.clone())
    }
}

/// The [n, r²] matrix whose row `j` is `scale · a_j ⊗ b_j` (`a_j[p] · b_j[q]` at column `p·r + q`), for factors
/// `a`, `b` holding `n` vectors of `r` values — rows of [n, r], or with `columns` columns of [r, n] — computed in
/// the factors' dtype (f32; f64 in tests) and written in `dtype`. LoHa's rank-`r²` factors: one kernel on CUDA,
/// where candle ran a batched product of `n` [r, 1] by [1, r] matrices (one GPU tile each) and a cast.
pub fn pair_products(
    a: &Tensor,
    b: &Tensor,
    columns: bool,
    scale: f64,
    dtype: DType,
) -> Result<Tensor> {
    let [n, r] = pair_dims(a, b, columns)?;
    #[cfg(feature = "cuda")]
    if on_kernel(&[a, b]) && kernel_dtype(dtype) {
        return crate::cuda::adapter::pair_products(a, b, [n, r], columns, scale, dtype);
    }
    let (a, b) = (
        as_rows(&a.detach(), columns)?,
        as_rows(&b.detach(), columns)?,
    );
    let outer = a
        .reshape((n, r, 1))?
        .matmul(&b.reshape((n, 1, r))?)?
        .reshape((n, r * r))?;
    let outer = if scale == 1.0 {
        outer
    } else {
        (outer * scale)?
    };
    outer.to_dtype(dtype)
}

/// The gradients `(∂a, ∂b)` of [`pair_products`] (same `a`, `b`, `columns`, `scale`) for the output gradient `d`
/// [n, r²] in any float dtype: `∂a_j[p] = scale · Σ_q d[j, p·r + q] b_j[q]` and `∂b_j[q] = scale · Σ_p d[j, p·r + q]
/// a_j[p]`, in the factors' dtype and layout. One kernel on CUDA for both, reading `d` as it is (no cast).
pub fn pair_products_backward(
    d: &Tensor,
    a: &Tensor,
    b: &Tensor,
    columns: bool,
    scale: f64,
) -> Result<(Tensor, Tensor)> {
    let [n, r] = pair_dims(a, b, columns)?;
    if d.dims() != [n, r * r] {
        candle_core::bail!(
            "pair products backward: a gradient of shape {:?} for {n} vectors of {r}",
            d.dims()
        );
    }
    #[cfg(feature = "cuda")]
    if on_kernel(&[a, b]) && kernel_dtype(d.dtype()) && d.device().is_cuda() {
        return crate::cuda::adapter::pair_products_backward(d, a, b, [n, r], columns, scale);
    }
    let work = a.dtype();
    let (a, b) = (
        as_rows(&a.detach(), columns)?,
        as_rows(&b.detach(), columns)?,
    );
    let d = d.detach().to_dtype(work)?.reshape((n, r, r))?;
    // Per vector j: d_j [r, r] times b_j as a column gives ∂a_j; a_j as a row times d_j gives ∂b_j.
    let da = d.matmul(&b.reshape((n, r, 1))?)?.reshape((n, r))?;
    let db = a.reshape((n, 1, r))?.matmul(&d)?.reshape((n, r))?;
    let finish = |g: Tensor| -> Result<Tensor> {
        let g = if scale == 1.0 { g } else { (g * scale)? };
        if columns {
            g.t()?.contiguous()
        } else {
            Ok(g)
        }
    };
    Ok((finish(da)?, finish(db)?))
}

/// DoRA's row norms `‖W_o + s·B_o A‖ + eps` [out, 1] from their terms, without forming the sum: `squares` =
/// `‖W_o‖²` (out values), `up` = B [out, r], `wa` = A Wᵀ [r, out] (any float dtype, e.g. the product's compute
/// dtype), `gram` = A Aᵀ [r, r], `scale` = s: `squares + 2s·Σ_p B[o,p] (A Wᵀ)[p,o] + s²·B_o (A Aᵀ) B_oᵀ`,
/// clamped at zero (rounding can take a vanishing norm below it), square-rooted. In `up`'s dtype; one kernel on
/// CUDA (f32 factors) where candle took about a dozen.
pub fn dora_row_norms(
    squares: &Tensor,
    up: &Tensor,
    wa: &Tensor,
    gram: &Tensor,
    scale: f64,
    eps: f64,
) -> Result<Tensor> {
    let (out, r) = up.dims2()?;
    let fits = squares.elem_count() == out && wa.dims() == [r, out] && gram.dims() == [r, r];
    if !fits {
        candle_core::bail!(
            "DoRA norms: squares of {} values, up {:?}, A Wᵀ {:?}, A Aᵀ {:?}",
            squares.elem_count(),
            up.dims(),
            wa.dims(),
            gram.dims()
        );
    }
    #[cfg(feature = "cuda")]
    if on_kernel(&[up, gram]) && squares.device().is_cuda() && kernel_dtype(wa.dtype()) {
        return crate::cuda::adapter::dora_norms(squares, up, wa, gram, scale, eps);
    }
    let work = up.dtype();
    let (up, gram) = (up.detach(), gram.detach().to_dtype(work)?);
    let cross = (&up * wa.detach().to_dtype(work)?.t()?)?.sum_keepdim(1)?;
    let quad = (up.matmul(&gram)? * &up)?.sum_keepdim(1)?;
    let squares = squares.detach().to_dtype(work)?.reshape((out, 1))?;
    let squares = ((squares + (cross * (2.0 * scale))?)? + (quad * (scale * scale))?)?;
    squares.relu()?.sqrt()? + eps
}

/// `w + p1 ⊙ p2` in `w`'s dtype for three tensors of one shape (LoHa's merged weight from the base and its two
/// products): the product rounded to the dtype, then the sum, as the two separate ops round them; one pass on CUDA
/// (f32 or bf16), where candle's two ops wrote and read back the product.
pub fn add_product(w: &Tensor, p1: &Tensor, p2: &Tensor) -> Result<Tensor> {
    if p1.dims() != w.dims() || p2.dims() != w.dims() {
        candle_core::bail!(
            "add product: shapes {:?}, {:?} and {:?}",
            w.dims(),
            p1.dims(),
            p2.dims()
        );
    }
    let dtype = w.dtype();
    let (p1, p2) = (p1.detach().to_dtype(dtype)?, p2.detach().to_dtype(dtype)?);
    #[cfg(feature = "cuda")]
    if w.device().is_cuda() && kernel_dtype(dtype) && !w.track_op() {
        return crate::cuda::adapter::add_product(w, &p1, &p2);
    }
    w.detach() + (p1 * p2)?
}

/// A LoRA layer's activation as its forward uses it with a bias, from its down product `raw` [m, r] (`x downᵀ`,
/// which may be a column narrow of a batched product): `mid` = raw · scale in raw's dtype (the tape's activation)
/// and `[mid | 1 | 0…]` [m, width] (the bias as one more rank column, zero columns up to `width`). One kernel on
/// CUDA (f32 or bf16 outside autograd, the same values bit for bit); candle's affine and concatenation
/// elsewhere — the reference the device checks hold it to.
pub fn lora_mid(raw: &Tensor, scale: f64, width: usize) -> Result<(Tensor, Tensor)> {
    let (m, r) = raw.dims2()?;
    if width <= r {
        candle_core::bail!("LoRA activation: width {width} for rank {r}");
    }
    #[cfg(feature = "cuda")]
    if raw.device().is_cuda()
        && kernel_dtype(raw.dtype())
        && !raw.track_op()
        && m > 0
        && super::row_strided(raw.layout()).is_some_and(|s| s.rows == m && s.cols == r)
    {
        return crate::cuda::adapter::lora_mid(raw, scale, width);
    }
    let mid = (raw.detach() * scale)?;
    let (dtype, dev) = (mid.dtype(), mid.device());
    let mut parts = vec![mid.clone(), Tensor::ones((m, 1), dtype, dev)?];
    if width > r + 1 {
        parts.push(Tensor::zeros((m, width - r - 1), dtype, dev)?);
    }
    Ok((mid, Tensor::cat(&parts, 1)?))
}

/// `[up | bias | 0…]` [n, width] in `bias`' dtype: a LoRA's `up` factor [n, r] (cast to that dtype) with the
/// layer's bias [n] as one more column, the other side of [`lora_mid`]. One kernel on CUDA (an f32 factor, an f32
/// or bf16 bias, outside autograd); candle's cast and concatenation elsewhere.
pub fn lora_up(up: &Tensor, bias: &Tensor, width: usize) -> Result<Tensor> {
    let (n, r) = up.dims2()?;
    if bias.elem_count() != n || width <= r {
        candle_core::bail!(
            "LoRA factor with its bias: up {:?}, bias {:?}, width {width}",
            up.dims(),
            bias.dims()
        );
    }
    let dtype = bias.dtype();
    #[cfg(feature = "cuda")]
    if up.device().is_cuda()
        && up.dtype() == DType::F32
        && kernel_dtype(dtype)
        && !up.track_op()
        && !bias.track_op()
        && n > 0
    {
        return crate::cuda::adapter::lora_up(up, bias, width);
    }
    let mut parts = vec![up.detach().to_dtype(dtype)?, bias.detach().reshape((n, 1))?];
    if width > r + 1 {
        parts.push(Tensor::zeros((n, width - r - 1), dtype, up.device())?);
    }
    Tensor::cat(&parts, 1)
}

/// `w + w1 ⊗ w2` in `w`'s dtype for a weight [a·c, b·d] and LoKr's factors `w1` [a, b] (the scale on it) and `w2`
/// [c, d] (LoKr's merged weight): the Kronecker product and the sum in f32 (f64 for an f64 weight), rounded once,
/// as LyCORIS merges; one pass on CUDA (f32 or bf16), where candle's broadcast product and sum wrote and read an
/// f32 [out, in] twice.
pub fn add_kron(w: &Tensor, w1: &Tensor, w2: &Tensor) -> Result<Tensor> {
    let dtype = w.dtype();
    #[cfg(feature = "cuda")]
    if w.device().is_cuda() && kernel_dtype(dtype) && !w.track_op() {
        let (w1, w2) = (w1.detach().to_dtype(dtype)?, w2.detach().to_dtype(dtype)?);
        return crate::cuda::adapter::add_kron(w, &w1, &w2);
    }
    let (a, b) = w1.dims2()?;
    let (c, d) = w2.dims2()?;
    if w.dims() != [a * c, b * d] {
        candle_core::bail!(
            "add kron: weight {:?} against factors {:?} and {:?}",
            w.dims(),
            w1.dims(),
            w2.dims()
        );
    }
    let work = if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let read = |t: &Tensor| t.detach().to_dtype(work);
    let kron = read(w1)?
        .reshape((a, 1, b, 1))?
        .broadcast_mul(&read(w2)?.reshape((1, c, 1, d))?)?
        .reshape((a * c, b * d))?;
    (read(w)? + kron)?.to_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use crate::init::randn;
    use crate::testing::rel;

    /// The pair products equal the broadcast products they stand for, for row and column factors, and their
    /// backward equals candle's autograd through that broadcast composition.
    #[test]
    fn pair_products_and_their_gradients_match_broadcast_products() -> Result<()> {
        let rng = &mut StdRng::seed_from_u64(41);
        let dev = Device::Cpu;
        let (n, r, scale) = (7, 3, 0.625);
        for columns in [false, true] {
            let shape = if columns { (r, n) } else { (n, r) };
            let a = Var::from_tensor(&randn(rng, shape, 0.0, 1.0, &dev)?)?;
            let b = Var::from_tensor(&randn(rng, shape, 0.0, 1.0, &dev)?)?;
            let rows = |v: &Var| as_rows(v.as_tensor(), columns);
            // a_j[p] · b_j[q] by broadcasting [n, r, 1] against [n, 1, r].
            let want = rows(&a)?
                .reshape((n, r, 1))?
                .broadcast_mul(&rows(&b)?.reshape((n, 1, r))?)?
                .reshape((n, r * r))?
                .affine(scale, 0.0)?;
            let got = pair_products(a.as_tensor(), b.as_tensor(), columns, scale, DType::F32)?;
            assert!(rel(&got, &want)? < 1e-7, "columns {columns}: forward");
            let d = randn(rng, (n, r * r), 0.0, 1.0, &dev)?;
            let store = (&want * &d)?.sum_all()?.backward()?;
            let (da, db) =
                pair_products_backward(&d, a.as_tensor(), b.as_tensor(), columns, scale)?;
            for (name, got, var) in [("a", &da, &a), ("b", &db, &b)] {
                let want = store
                    .get(var.as_tensor())
                    .ok_or_else(|| candle_core::Error::msg("no gradient"))?;
                assert_eq!(got.dims(), var.dims(), "columns {columns}: {name} shape");
                assert!(rel(got, want)? < 1e-6, "columns {columns}: ∂{name}");
            }
        }
        Ok(())
    }

    /// The sum with the product equals the two ops it stands for, with the product rounded to bf16 before the sum.
    #[test]
    fn add_product_rounds_the_product_before_the_sum() -> Result<()> {
        let rng = &mut StdRng::seed_from_u64(47);
        let dev = Device::Cpu;
        let [w, p1, p2] = [0.3, 1.0, 1.0]
            .map(|std| randn(rng, (5, 8), 0.0, std, &dev).and_then(|t| t.to_dtype(DType::BF16)));
        let (w, p1, p2) = (w?, p1?, p2?);
        let got = add_product(&w, &p1, &p2)?;
        assert_eq!(got.dtype(), DType::BF16);
        let f32 = |t: &Tensor| t.to_dtype(DType::F32);
        let product = (f32(&p1)? * f32(&p2)?)?.to_dtype(DType::BF16)?;
        let want = (f32(&w)? + f32(&product)?)?.to_dtype(DType::BF16)?;
        assert_eq!(rel(&got, &want)?, 0.0);
        assert!(add_product(&w, &p1, &p2.t()?).is_err());
        Ok(())
    }

    /// A LoRA's activation and `up` factor with the bias column: the scaled activation, a 1 and zeros beside it,
    /// and the factor beside the bias, for a column narrow of a batched product too.
    #[test]
    fn lora_bias_columns_hold_the_scaled_activation_and_the_bias() -> Result<()> {
        let rng = &mut StdRng::seed_from_u64(53);
        let dev = Device::Cpu;
        let (m, r, n, width, scale) = (5, 3, 4, 8, 0.75);
        let batched = randn(rng, (m, 2 * r), 0.0, 1.0, &dev)?;
        let raw = batched.narrow(1, r, r)?;
        let (mid, mid1) = lora_mid(&raw, scale, width)?;
        assert_eq!(rel(&mid, &(raw.contiguous()? * scale)?)?, 0.0);
        assert_eq!(mid1.dims(), [m, width]);
        assert_eq!(rel(&mid1.narrow(1, 0, r)?, &mid)?, 0.0);
        assert_eq!(
            mid1.narrow(1, r, 1)?.flatten_all()?.to_vec1::<f32>()?,
            vec![1.0; m]
        );
        assert_eq!(
            mid1.narrow(1, r + 1, width - r - 1)?
                .abs()?
                .sum_all()?
                .to_scalar::<f32>()?,
            0.0
        );
        let up = randn(rng, (n, r), 0.0, 1.0, &dev)?;
        let bias = randn(rng, n, 0.0, 1.0, &dev)?.to_dtype(DType::BF16)?;
        let up1 = lora_up(&up, &bias, width)?;
        assert_eq!(
            (up1.dims(), up1.dtype()),
            ([n, width].as_slice(), DType::BF16)
        );
        assert_eq!(rel(&up1.narrow(1, 0, r)?, &up.to_dtype(DType::BF16)?)?, 0.0);
        assert_eq!(rel(&up1.narrow(1, r, 1)?.flatten_all()?, &bias)?, 0.0);
        assert!(lora_mid(&raw, scale, r).is_err());
        assert!(lora_up(&up, &bias.narrow(0, 0, n - 1)?, width).is_err());
        Ok(())
    }

    /// LoKr's merged weight holds `w[o, p] + w1[o / c, p / d] · w2[o % c, p % d]` entry by entry, rounded once to
    /// the weight's dtype; factors that do not tile the weight are refused.
    #[test]
    fn add_kron_adds_the_kronecker_product_entry_by_entry() -> Result<()> {
        let rng = &mut StdRng::seed_from_u64(59);
        let dev = Device::Cpu;
        let [a, b, c, d] = [3, 2, 4, 5];
        let w = randn(rng, (a * c, b * d), 0.0, 0.3, &dev)?.to_dtype(DType::BF16)?;
        let w1 = randn(rng, (a, b), 0.0, 1.0, &dev)?;
        let w2 = randn(rng, (c, d), 0.0, 1.0, &dev)?;
        let got = add_kron(&w, &w1, &w2)?;
        assert_eq!(got.dtype(), DType::BF16);
        let (wv, v1, v2) = (
            w.to_dtype(DType::F32)?.to_vec2::<f32>()?,
            w1.to_vec2::<f32>()?,
            w2.to_vec2::<f32>()?,
        );
        let mut want = Vec::new();
        for o in 0..a * c {
            for p in 0..b * d {
                want.push(wv[o][p] + v1[o / c][p / d] * v2[o % c][p % d]);
            }
        }
        let want = Tensor::from_vec(want, (a * c, b * d), &dev)?.to_dtype(DType::BF16)?;
        assert_eq!(rel(&got, &want)?, 0.0);
        assert!(add_kron(&w, &w1.t()?, &w2).is_err());
        Ok(())
    }

    /// DoRA's row norms from their terms equal the norms of the merged weight's rows.
    #[test]
    fn dora_row_norms_equal_the_merged_rows_norms() -> Result<()> {
        let rng = &mut StdRng::seed_from_u64(43);
        let dev = Device::Cpu;
        let (out, r, input, s) = (9, 3, 11, 0.75);
        let w = randn(rng, (out, input), 0.0, 0.5, &dev)?.to_dtype(DType::F64)?;
        let down = randn(rng, (r, input), 0.0, 0.5, &dev)?.to_dtype(DType::F64)?;
        let up = randn(rng, (out, r), 0.0, 0.5, &dev)?.to_dtype(DType::F64)?;
        let merged = (&w + (up.matmul(&down)? * s)?)?;
        let want = (merged.sqr()?.sum_keepdim(1)?.sqrt()? + 1e-7)?;
        let squares = w.sqr()?.sum_keepdim(1)?;
        let wa = down.matmul(&w.t()?)?;
        let gram = down.matmul(&down.t()?)?;
        let got = dora_row_norms(&squares, &up, &wa, &gram, s, 1e-7)?;
        assert_eq!(got.dims(), [out, 1]);
        assert!(rel(&got, &want)? < 1e-12, "{}", rel(&got, &want)?);
        Ok(())
    }
}
