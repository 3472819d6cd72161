//! LayerNorm fused with the Wan block's modulation (`kernels/norm.cu`, `fs_ln_mod_fwd_*` / `fs_ln_bwd_add_*`),
//! outside autograd; the same with RMSNorm's statistics ([`Stats::Rms`], LTX-2's blocks). The forward writes
//! `LayerNorm(x) · (1 + scale) + shift` in the compute dtype in one pass (the separate kernels write LayerNorm's
//! f32 output, read it back and write the modulated copy); the backward takes the modulated value's gradient and
//! the residual gradient and returns the block input's, with the modulation's backward, LayerNorm's backward and
//! the residual add in one pass (three kernels and two f32 intermediates otherwise). Same arithmetic and
//! roundings as the separate ops, which [`crate::ops`] runs on other devices and dtypes.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaStorage, DType, Layout, Result, Tensor, D};

use super::elementwise::{as_mod_f32, check_shift, Geometry};
use super::mixed::MIXED_WIDTH;
use super::ptx::{self, cuda_storage, long, untracked};
use crate::ops::Dense;

/// `$go::<A, B>(args)` for the f32 / bf16 dtypes `($a, $b)` of a kernel's two type parameters.
macro_rules! dtype_pair {
    ($a:expr, $b:expr, $go:ident($($arg:expr),*)) => {
        match ($a, $b) {
            (DType::F32, DType::F32) => $go::<f32, f32>($($arg),*),
            (DType::F32, DType::BF16) => $go::<f32, half::bf16>($($arg),*),
            (DType::BF16, DType::F32) => $go::<half::bf16, f32>($($arg),*),
            (DType::BF16, DType::BF16) => $go::<half::bf16, half::bf16>($($arg),*),
            (a, b) => candle_core::bail!("fused LayerNorm: no {a:?} / {b:?} kernel"),
        }
    };
}

/// The statistics the fused kernels normalise each row by, with the epsilon added to the variance.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stats {
    /// LayerNorm: mean and variance.
    Layer(f64),
    /// RMSNorm without a weight: the mean square, the row not centred (`round(x · rstd)` as
    /// [`super::norm::rms_norm`] stores it).
    Rms(f64),
}

impl Stats {
    fn eps(self) -> f32 {
        match self {
            Stats::Layer(eps) | Stats::Rms(eps) => eps as f32,
        }
    }

    /// The kernels' `rms` flag.
    fn rms(self) -> i32 {
        i32::from(matches!(self, Stats::Rms(_)))
    }
}

/// Whether the fused kernels take `xs` (a float CUDA tensor) and `other` dtype.
pub fn applies(xs: &Tensor, other: DType) -> bool {
    let float = |d: DType| matches!(d, DType::F32 | DType::BF16);
    xs.device().is_cuda() && float(xs.dtype()) && float(other) && xs.rank() >= 2
}

/// 1 when rows split into 8-value chunks and every buffer starts 16-byte aligned.
fn vec_flag(cols: usize, buffers: &[(&Layout, DType)]) -> i32 {
    let aligned = buffers
        .iter()
        .all(|(l, d)| (l.start_offset() * d.size_in_bytes()) % 16 == 0);
    i32::from(cols % MIXED_WIDTH == 0 && aligned)
}

/// `LayerNorm(x) · (1 + scale) + shift` (LayerNorm without affine parameters, statistics and arithmetic in f32,
/// its output rounded to `x`'s dtype as the separate kernel stores it), written in `out`; RMSNorm instead with
/// [`Stats::Rms`]. `x` [b, …, D]; modulation [b, 1, D] or [b, L, D]. CUDA f32 / bf16 only; the caller checks
/// [`applies`].
pub fn layer_norm_modulate(
    xs: &Tensor,
    scale: &Tensor,
    shift: &Tensor,
    stats: Stats,
    out: DType,
) -> Result<Tensor> {
    let g = Geometry::of(xs, scale)?;
    check_shift(scale, shift)?;
    let (x, s, h) = (xs.dense()?, as_mod_f32(scale)?, as_mod_f32(shift)?);
    let guards = [
        x.storage_and_layout(),
        s.storage_and_layout(),
        h.storage_and_layout(),
    ];
    let (xc, sc, hc) = (
        cuda_storage(&guards[0].0, "fused LayerNorm")?,
        cuda_storage(&guards[1].0, "fused LayerNorm")?,
        cuda_storage(&guards[2].0, "fused LayerNorm")?,
    );
    let dev = xc.device().clone();
    let (rows, cols) = (g.batch * g.tokens, g.dim);
    let func = ptx::load(
        &dev,
        &ptx::NORM,
        &format!(
            "fs_ln_mod_fwd_{}_{}",
            ptx::suffix(x.dtype())?,
            ptx::suffix(out)?
        ),
    )?;
    let layouts = [
        (guards[0].1, x.dtype()),
        (guards[1].1, DType::F32),
        (guards[2].1, DType::F32),
    ];
    let vec = vec_flag(cols, &layouts);
    let sizes = [long(cols)?, long(g.tokens)?, long(g.mod_tokens)?];
    let sv = ptx::view::<f32>(sc, guards[1].1)?;
    let hv = ptx::view::<f32>(hc, guards[2].1)?;
    fn go<TI: CudaDType + DeviceRepr, TO: CudaDType + DeviceRepr>(
        func: &candle_core::cuda_backend::cudarc::driver::CudaFunction,
        dev: &candle_core::CudaDevice,
        (xc, xl): (&CudaStorage, &Layout),
        (sv, hv): (
            &candle_core::cuda_backend::cudarc::driver::CudaView<'_, f32>,
            &candle_core::cuda_backend::cudarc::driver::CudaView<'_, f32>,
        ),
        rows: usize,
        (sizes, eps, vec, rms): ([i64; 3], f32, i32, i32),
    ) -> Result<CudaStorage> {
        let xv = ptx::view::<TI>(xc, xl)?;
        // SAFETY: every row is written by its block before the tensor is read.
        let y = unsafe { dev.alloc::<TO>(xl.shape().elem_count())? };
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(func);
        b.arg(&xv).arg(sv).arg(hv).arg(&y);
        b.arg(&sizes[0])
            .arg(&sizes[1])
            .arg(&sizes[2])
            .arg(&eps)
            .arg(&vec)
            .arg(&rms);
        // SAFETY: argument order and types match fs_ln_mod_fwd in kernels/norm.cu; x and y hold rows × cols
        // values, scale and shift one row per sample or per token; `vec` only for whole aligned chunks.
        unsafe { b.launch(ptx::row_config(rows)?) }.w()?;
        Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
    }
    let args = (sizes, stats.eps(), vec, stats.rms());
    let x_in = (xc, guards[0].1);
    let y = dtype_pair!(
        x.dtype(),
        out,
        go(&func, &dev, x_in, (&sv, &hv), rows, args)
    )?;
    drop(guards);
    Ok(untracked(y, x.shape().clone()))
}

/// The block input's gradient `dres + LayerNorm_bwd(x, weight, dy)` with `dy = dh · (1 + scale)` (with a
/// modulation) or `dh`, rounded to `x`'s dtype as the separate ops store it; the result in `x`'s dtype (the
/// residual's); RMSNorm's backward instead with [`Stats::Rms`]. `dh` in any float dtype; `dres` in `x`'s. CUDA
/// f32 / bf16 only; the caller checks [`applies`].
pub fn layer_norm_backward_add(
    xs: &Tensor,
    weight: Option<&Tensor>,
    dh: &Tensor,
    scale: Option<&Tensor>,
    dres: &Tensor,
    stats: Stats,
) -> Result<Tensor> {
    if dh.dims() != xs.dims() || dres.dims() != xs.dims() {
        candle_core::bail!(
            "fused LayerNorm backward: x {:?}, dh {:?}, dres {:?} differ",
            xs.dims(),
            dh.dims(),
            dres.dims()
        );
    }
    let cols = xs.dim(D::Minus1)?;
    let dtype = xs.dtype();
    let (tokens, mod_tokens) = match scale {
        Some(s) => {
            let g = Geometry::of(xs, s)?;
            (g.tokens, g.mod_tokens)
        }
        None => (1, 1),
    };
    let x = xs.dense()?;
    let dres = dres.to_dtype(dtype)?.dense()?;
    let dh = dh.dense()?;
    // A missing weight or modulation is a one-element placeholder passed as a null pointer.
    let w = match weight {
        Some(w) if w.elem_count() == cols => w.to_dtype(dtype)?.flatten_all()?.dense()?,
        Some(w) => candle_core::bail!(
            "LayerNorm weight has {} values for {cols} features",
            w.elem_count()
        ),
        None => Tensor::zeros(1, dtype, xs.device())?,
    };
    let s = match scale {
        Some(s) => as_mod_f32(s)?,
        None => Tensor::zeros(1, DType::F32, xs.device())?,
    };
    let guards = [
        x.storage_and_layout(),
        w.storage_and_layout(),
        dh.storage_and_layout(),
        s.storage_and_layout(),
        dres.storage_and_layout(),
    ];
    let stores = guards
        .iter()
        .map(|(s, _)| cuda_storage(s, "fused LayerNorm backward"))
        .collect::<Result<Vec<_>>>()?;
    let dev = stores[0].device().clone();
    let rows = x.elem_count() / cols.max(1);
    let func = ptx::load(
        &dev,
        &ptx::NORM,
        &format!(
            "fs_ln_bwd_add_{}_{}",
            ptx::suffix(dtype)?,
            ptx::suffix(dh.dtype())?
        ),
    )?;
    let mut layouts = vec![
        (guards[0].1, dtype),
        (guards[2].1, dh.dtype()),
        (guards[4].1, dtype),
    ];
    if weight.is_some() {
        layouts.push((guards[1].1, dtype));
    }
    if scale.is_some() {
        layouts.push((guards[3].1, DType::F32));
    }
    let vec = vec_flag(cols, &layouts);
    let sizes = [long(cols)?, long(tokens)?, long(mod_tokens)?];
    let flags = (weight.is_some(), scale.is_some());
    fn go<TX: CudaDType + DeviceRepr, TH: CudaDType + DeviceRepr>(
        func: &candle_core::cuda_backend::cudarc::driver::CudaFunction,
        dev: &candle_core::CudaDevice,
        inputs: [(&CudaStorage, &Layout); 5],
        (has_weight, has_scale): (bool, bool),
        rows: usize,
        (sizes, eps, vec, rms): ([i64; 3], f32, i32, i32),
    ) -> Result<CudaStorage> {
        let [x, w, dh, s, dres] = inputs;
        let xv = ptx::view::<TX>(x.0, x.1)?;
        let wv = ptx::view::<TX>(w.0, w.1)?;
        let dhv = ptx::view::<TH>(dh.0, dh.1)?;
        let sv = ptx::view::<f32>(s.0, s.1)?;
        let rv = ptx::view::<TX>(dres.0, dres.1)?;
        let null = 0u64;
        // SAFETY: every row is written by its block before the tensor is read.
        let dx = unsafe { dev.alloc::<TX>(x.1.shape().elem_count())? };
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(func);
        b.arg(&xv);
        if has_weight {
            b.arg(&wv)
        } else {
            b.arg(&null)
        };
        b.arg(&dhv);
        if has_scale {
            b.arg(&sv)
        } else {
            b.arg(&null)
        };
        b.arg(&rv).arg(&dx);
        b.arg(&sizes[0])
            .arg(&sizes[1])
            .arg(&sizes[2])
            .arg(&eps)
            .arg(&vec)
            .arg(&rms);
        // SAFETY: argument order and types match fs_ln_bwd_add in kernels/norm.cu; x, dh, dres and dx hold
        // rows × cols values, the weight cols, the modulation one row per sample or per token; a missing
        // weight or modulation is a null pointer the kernel does not read; `vec` only for whole aligned chunks.
        unsafe { b.launch(ptx::row_config(rows)?) }.w()?;
        Ok(CudaStorage::wrap_cuda_slice(dx, dev.clone()))
    }
    let inputs = [
        (stores[0], guards[0].1),
        (stores[1], guards[1].1),
        (stores[2], guards[2].1),
        (stores[3], guards[3].1),
        (stores[4], guards[4].1),
    ];
    let args = (sizes, stats.eps(), vec, stats.rms());
    let dx = dtype_pair!(
        dtype,
        dh.dtype(),
        go(&func, &dev, inputs, flags, rows, args)
    )?;
    drop(stores);
    drop(guards);
    Ok(untracked(dx, x.shape().clone()))
}

/// LayerNorm with optional affine parameters (in `x`'s dtype) written in `out`: the plain kernel's arithmetic
/// and its rounding to `x`'s dtype, then the cast, in one pass (equal to [`crate::norm::layer_norm`] followed by
/// a cast). `x` [.., D]. CUDA f32 / bf16 only; the caller checks [`applies`].
pub fn layer_norm_to(
    xs: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
    out: DType,
) -> Result<Tensor> {
    let cols = xs.dim(D::Minus1)?;
    let dtype = xs.dtype();
    let x = xs.dense()?;
    // A missing weight or bias is a one-element placeholder passed as a null pointer.
    let param = |p: Option<&Tensor>, what: &str| match p {
        Some(p) if p.elem_count() == cols => p.to_dtype(dtype)?.flatten_all()?.dense(),
        Some(p) => candle_core::bail!(
            "LayerNorm {what} has {} values for {cols} features",
            p.elem_count()
        ),
        None => Tensor::zeros(1, dtype, xs.device()),
    };
    let (w, b) = (param(weight, "weight")?, param(bias, "bias")?);
    let guards = [
        x.storage_and_layout(),
        w.storage_and_layout(),
        b.storage_and_layout(),
    ];
    let stores = guards
        .iter()
        .map(|(s, _)| cuda_storage(s, "fused LayerNorm"))
        .collect::<Result<Vec<_>>>()?;
    let dev = stores[0].device().clone();
    let rows = x.elem_count() / cols.max(1);
    let func = ptx::load(
        &dev,
        &ptx::NORM,
        &format!("fs_ln_fwd_to_{}_{}", ptx::suffix(dtype)?, ptx::suffix(out)?),
    )?;
    let mut layouts = vec![(guards[0].1, dtype)];
    if weight.is_some() {
        layouts.push((guards[1].1, dtype));
    }
    if bias.is_some() {
        layouts.push((guards[2].1, dtype));
    }
    let vec = vec_flag(cols, &layouts);
    let flags = (weight.is_some(), bias.is_some());
    fn go<TI: CudaDType + DeviceRepr, TO: CudaDType + DeviceRepr>(
        func: &candle_core::cuda_backend::cudarc::driver::CudaFunction,
        dev: &candle_core::CudaDevice,
        inputs: [(&CudaStorage, &Layout); 3],
        (has_weight, has_bias): (bool, bool),
        rows: usize,
        (cols, eps, vec): (i64, f32, i32),
    ) -> Result<CudaStorage> {
        let [x, w, b] = inputs;
        let xv = ptx::view::<TI>(x.0, x.1)?;
        let wv = ptx::view::<TI>(w.0, w.1)?;
        let bv = ptx::view::<TI>(b.0, b.1)?;
        let null = 0u64;
        // SAFETY: every row is written by its block before the tensor is read.
        let y = unsafe { dev.alloc::<TO>(x.1.shape().elem_count())? };
        let stream = dev.cuda_stream();
        let mut l = stream.launch_builder(func);
        l.arg(&xv);
        if has_weight {
            l.arg(&wv)
        } else {
            l.arg(&null)
        };
        if has_bias {
            l.arg(&bv)
        } else {
            l.arg(&null)
        };
        l.arg(&y).arg(&cols).arg(&eps).arg(&vec);
        // SAFETY: argument order and types match fs_ln_fwd_to in kernels/norm.cu; x and y hold rows × cols
        // values, weight and bias cols each; a missing one is a null pointer the kernel does not read; `vec`
        // only for whole aligned chunks.
        unsafe { l.launch(ptx::row_config(rows)?) }.w()?;
        Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
    }
    let inputs = [
        (stores[0], guards[0].1),
        (stores[1], guards[1].1),
        (stores[2], guards[2].1),
    ];
    let args = (long(cols)?, eps as f32, vec);
    let y = dtype_pair!(dtype, out, go(&func, &dev, inputs, flags, rows, args))?;
    drop(stores);
    drop(guards);
    Ok(untracked(y, x.shape().clone()))
}

/// The residual update `x + y · gate` (`gate` `None`: `x + y`) in `x`'s dtype, as the gated-residual kernel
/// computes it, and LayerNorm of it written in `y`'s dtype: affine parameters `weight` / `bias` (in `x`'s dtype,
/// optional) as [`layer_norm_to`], then with `modulation` `(scale, shift)` the block's `· (1 + scale) + shift`
/// as [`layer_norm_modulate`]. One pass: the updated residual is not read back from memory. Gate and modulation
/// [b, 1, D] or [b, L, D]. With [`Stats::Rms`], RMSNorm without affine parameters instead. CUDA f32 / bf16 only;
/// the caller checks [`applies`]. Returns `(x + y·gate, norm)`.
pub fn residual_layer_norm(
    xs: &Tensor,
    y: &Tensor,
    gate: Option<&Tensor>,
    (weight, bias): (Option<&Tensor>, Option<&Tensor>),
    modulation: Option<(&Tensor, &Tensor)>,
    stats: Stats,
) -> Result<(Tensor, Tensor)> {
    if matches!(stats, Stats::Rms(_)) && (weight.is_some() || bias.is_some()) {
        candle_core::bail!("residual RMSNorm: the fused kernel takes no affine parameters");
    }
    if y.dims() != xs.dims() {
        candle_core::bail!(
            "residual LayerNorm: x {:?} and y {:?} differ",
            xs.dims(),
            y.dims()
        );
    }
    let cols = xs.dim(D::Minus1)?;
    let (dtype, out) = (xs.dtype(), y.dtype());
    let (x, yd) = (xs.dense()?, y.dense()?);
    let placeholder = |d: DType| Tensor::zeros(1, d, xs.device());
    let param = |p: Option<&Tensor>, what: &str| match p {
        Some(p) if p.elem_count() == cols => p.to_dtype(dtype)?.flatten_all()?.dense(),
        Some(p) => candle_core::bail!(
            "LayerNorm {what} has {} values for {cols} features",
            p.elem_count()
        ),
        None => placeholder(dtype),
    };
    let (w, b) = (param(weight, "weight")?, param(bias, "bias")?);
    let tokens = |m: Option<&Tensor>| -> Result<(usize, usize)> {
        match m {
            Some(m) => {
                let g = Geometry::of(xs, m)?;
                Ok((g.tokens, g.mod_tokens))
            }
            None => Ok((1, 1)),
        }
    };
    let (l, gate_tokens) = tokens(gate)?;
    let (l2, mod_tokens) = tokens(modulation.map(|(s, _)| s))?;
    let l = l.max(l2);
    if let Some((s, h)) = modulation {
        check_shift(s, h)?;
    }
    let g = gate
        .map(as_mod_f32)
        .transpose()?
        .map_or_else(|| placeholder(DType::F32), Ok)?;
    let (s, h) = match modulation {
        Some((s, h)) => (as_mod_f32(s)?, as_mod_f32(h)?),
        None => (placeholder(DType::F32)?, placeholder(DType::F32)?),
    };
    let guards = [
        x.storage_and_layout(),
        yd.storage_and_layout(),
        g.storage_and_layout(),
        w.storage_and_layout(),
        b.storage_and_layout(),
        s.storage_and_layout(),
        h.storage_and_layout(),
    ];
    let stores = guards
        .iter()
        .map(|(st, _)| cuda_storage(st, "residual LayerNorm"))
        .collect::<Result<Vec<_>>>()?;
    let dev = stores[0].device().clone();
    let rows = x.elem_count() / cols.max(1);
    let func = ptx::load(
        &dev,
        &ptx::NORM,
        &format!(
            "fs_res_ln_fwd_{}_{}",
            ptx::suffix(dtype)?,
            ptx::suffix(out)?
        ),
    )?;
    let mut layouts = vec![(guards[0].1, dtype), (guards[1].1, out)];
    for (present, i, d) in [
        (gate.is_some(), 2, DType::F32),
        (weight.is_some(), 3, dtype),
        (bias.is_some(), 4, dtype),
        (modulation.is_some(), 5, DType::F32),
        (modulation.is_some(), 6, DType::F32),
    ] {
        if present {
            layouts.push((guards[i].1, d));
        }
    }
    let vec = vec_flag(cols, &layouts);
    let present = [
        gate.is_some(),
        weight.is_some(),
        bias.is_some(),
        modulation.is_some(),
    ];
    let sizes = [long(cols)?, long(l)?, long(gate_tokens)?, long(mod_tokens)?];
    let inputs: [(&CudaStorage, &Layout); 7] = std::array::from_fn(|i| (stores[i], guards[i].1));
    let args = (sizes, stats.eps(), vec, stats.rms());
    let (xo, ho) = dtype_pair!(dtype, out, res_ln(&func, &dev, inputs, present, rows, args))?;
    drop(stores);
    drop(guards);
    Ok((
        untracked(xo, x.shape().clone()),
        untracked(ho, x.shape().clone()),
    ))
}

fn res_ln<TX: CudaDType + DeviceRepr, TY: CudaDType + DeviceRepr>(
    func: &candle_core::cuda_backend::cudarc::driver::CudaFunction,
    dev: &candle_core::CudaDevice,
    inputs: [(&CudaStorage, &Layout); 7],
    [has_gate, has_weight, has_bias, has_mod]: [bool; 4],
    rows: usize,
    (sizes, eps, vec, rms): ([i64; 4], f32, i32, i32),
) -> Result<(CudaStorage, CudaStorage)> {
    let [x, y, g, w, b, s, h] = inputs;
    let xv = ptx::view::<TX>(x.0, x.1)?;
    let yv = ptx::view::<TY>(y.0, y.1)?;
    let gv = ptx::view::<f32>(g.0, g.1)?;
    let wv = ptx::view::<TX>(w.0, w.1)?;
    let bv = ptx::view::<TX>(b.0, b.1)?;
    let sv = ptx::view::<f32>(s.0, s.1)?;
    let hv = ptx::view::<f32>(h.0, h.1)?;
    let null = 0u64;
    let n = x.1.shape().elem_count();
    // SAFETY: every row of both outputs is written by its block before either tensor is read.
    let (xo, ho) = unsafe { (dev.alloc::<TX>(n)?, dev.alloc::<TY>(n)?) };
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(func);
    l.arg(&xv).arg(&yv);
    if has_gate {
        l.arg(&gv)
    } else {
        l.arg(&null)
    };
    if has_weight {
        l.arg(&wv)
    } else {
        l.arg(&null)
    };
    if has_bias {
        l.arg(&bv)
    } else {
        l.arg(&null)
    };
    if has_mod {
        l.arg(&sv).arg(&hv)
    } else {
        l.arg(&null).arg(&null)
    };
    l.arg(&xo).arg(&ho);
    l.arg(&sizes[0])
        .arg(&sizes[1])
        .arg(&sizes[2])
        .arg(&sizes[3])
        .arg(&eps)
        .arg(&vec)
        .arg(&rms);
    // SAFETY: argument order and types match fs_res_ln_fwd in kernels/norm.cu: x, y and both outputs hold
    // rows × cols values, the weight and bias cols, the gate and modulation one row per sample or per token; a
    // missing one is a null pointer the kernel does not read; `vec` only for whole aligned chunks.
    unsafe { l.launch(ptx::row_config(rows)?) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(xo, dev.clone()),
        CudaStorage::wrap_cuda_slice(ho, dev.clone()),
    ))
}
