//! The adapters' small per-layer passes on CUDA (`kernels/adapter.cu`), outside autograd: LoHa's row-wise outer
//! products and their gradients, DoRA's row norms from their low-rank terms, LoHa's and LoKr's merged weights,
//! a LoRA layer's bias columns. The portable versions (and the references the device checks hold these to) are
//! in `crate::ops::adapter`, which calls these only for f32 factors on CUDA.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Tensor, WithDType};

use super::ptx::{self, cuda_storage, long, untracked};

/// The kernel `fs_{name}_{suffix of dtype}` on `dev`.
fn function(dev: &CudaDevice, name: &str, dtype: DType) -> Result<CudaFunction> {
    ptx::load(
        dev,
        &ptx::ADAPTER,
        &format!("fs_{name}_{}", ptx::suffix(dtype)?),
    )
}

/// A dense f32 CUDA tensor, as every factor the kernels read.
fn f32_dense(t: &Tensor) -> Result<Tensor> {
    t.detach().to_dtype(DType::F32)?.contiguous()
}

/// `[n, r²]` in `dtype` whose row `j` is `s · a_j ⊗ b_j` for `a`, `b` holding `n` vectors of `r` values (rows of
/// [n, r], or with `columns` columns of [r, n]), f32 CUDA tensors.
pub fn pair_products(
    a: &Tensor,
    b: &Tensor,
    [n, r]: [usize; 2],
    columns: bool,
    scale: f64,
    dtype: DType,
) -> Result<Tensor> {
    let (a, b) = (f32_dense(a)?, f32_dense(b)?);
    let (ag, bg) = (a.storage_and_layout(), b.storage_and_layout());
    let (sa, sb) = (
        cuda_storage(&ag.0, "pair products")?,
        cuda_storage(&bg.0, "pair products")?,
    );
    let dev = sa.device().clone();
    let func = function(&dev, "pair_products", dtype)?;
    let args = PairArgs {
        n: long(n)?,
        r: long(r)?,
        columns: i32::from(columns),
        scale: scale as f32,
    };
    let count = n * r * r;
    let out = match dtype {
        DType::F32 => products::<f32>(&func, &dev, [(sa, ag.1), (sb, bg.1)], &args, count)?,
        DType::BF16 => products::<half::bf16>(&func, &dev, [(sa, ag.1), (sb, bg.1)], &args, count)?,
        other => candle_core::bail!("pair products: no {other:?} output"),
    };
    drop((ag, bg));
    Ok(untracked(out, (n, r * r)))
}

/// The sizes and scalars every pair kernel takes after its buffers.
struct PairArgs {
    n: i64,
    r: i64,
    columns: i32,
    scale: f32,
}

fn products<T: CudaDType + DeviceRepr + WithDType>(
    func: &CudaFunction,
    dev: &CudaDevice,
    [a, b]: [(&CudaStorage, &Layout); 2],
    args: &PairArgs,
    count: usize,
) -> Result<CudaStorage> {
    let av = ptx::view::<f32>(a.0, a.1)?;
    let bv = ptx::view::<f32>(b.0, b.1)?;
    // SAFETY: the kernel writes every one of the `count` values (one per grid-stride index) before it is read.
    let out = unsafe { dev.alloc::<T>(count)? };
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(func);
    l.arg(&av).arg(&bv).arg(&out);
    l.arg(&args.n)
        .arg(&args.r)
        .arg(&args.columns)
        .arg(&args.scale);
    // SAFETY: argument order and types match fs_pair_products_* in kernels/adapter.cu; `a` and `b` hold n·r f32
    // values each (checked by the caller), the output n·r².
    unsafe { l.launch(ptx::elementwise_config(count)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// The gradients `(∂a, ∂b)` of [`pair_products`] for `d` [n, r²] (f32 or bf16), f32 in the factors' layout.
pub fn pair_products_backward(
    d: &Tensor,
    a: &Tensor,
    b: &Tensor,
    [n, r]: [usize; 2],
    columns: bool,
    scale: f64,
) -> Result<(Tensor, Tensor)> {
    let d = d.detach().contiguous()?;
    let (a, b) = (f32_dense(a)?, f32_dense(b)?);
    let guards = [
        d.storage_and_layout(),
        a.storage_and_layout(),
        b.storage_and_layout(),
    ];
    let stores = guards
        .iter()
        .map(|(st, _)| cuda_storage(st, "pair products backward"))
        .collect::<Result<Vec<_>>>()?;
    let dev = stores[0].device().clone();
    let func = function(&dev, "pair_products_bwd", d.dtype())?;
    let args = PairArgs {
        n: long(n)?,
        r: long(r)?,
        columns: i32::from(columns),
        scale: scale as f32,
    };
    let inputs = [
        (stores[0], guards[0].1),
        (stores[1], guards[1].1),
        (stores[2], guards[2].1),
    ];
    let (da, db) = match d.dtype() {
        DType::F32 => folds::<f32>(&func, &dev, inputs, &args, n * r)?,
        DType::BF16 => folds::<half::bf16>(&func, &dev, inputs, &args, n * r)?,
        other => candle_core::bail!("pair products backward: no {other:?} gradient"),
    };
    drop(stores);
    drop(guards);
    let shape = if columns { (r, n) } else { (n, r) };
    Ok((untracked(da, shape), untracked(db, shape)))
}

fn folds<T: CudaDType + DeviceRepr + WithDType>(
    func: &CudaFunction,
    dev: &CudaDevice,
    [d, a, b]: [(&CudaStorage, &Layout); 3],
    args: &PairArgs,
    count: usize,
) -> Result<(CudaStorage, CudaStorage)> {
    let dv = ptx::view::<T>(d.0, d.1)?;
    let av = ptx::view::<f32>(a.0, a.1)?;
    let bv = ptx::view::<f32>(b.0, b.1)?;
    // SAFETY: the kernel writes every one of the `count` values of both outputs before they are read.
    let (da, db) = unsafe { (dev.alloc::<f32>(count)?, dev.alloc::<f32>(count)?) };
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(func);
    l.arg(&dv).arg(&av).arg(&bv).arg(&da).arg(&db);
    l.arg(&args.n)
        .arg(&args.r)
        .arg(&args.columns)
        .arg(&args.scale);
    // SAFETY: argument order and types match fs_pair_products_bwd_* in kernels/adapter.cu; `d` holds n·r² values,
    // the factors and both outputs n·r (checked by the caller).
    unsafe { l.launch(ptx::elementwise_config(count)) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(da, dev.clone()),
        CudaStorage::wrap_cuda_slice(db, dev.clone()),
    ))
}

/// DoRA's row norms [out, 1] f32 from `squares` = ‖W_o‖² (out values, f32), `up` [out, r] (f32), `wa` = A Wᵀ
/// [r, out] (f32 or bf16) and `gram` = A Aᵀ [r, r] (f32), for the LoRA scale `scale`.
pub fn dora_norms(
    squares: &Tensor,
    up: &Tensor,
    wa: &Tensor,
    gram: &Tensor,
    scale: f64,
    eps: f64,
) -> Result<Tensor> {
    let (out, r) = up.dims2()?;
    let wa = wa.detach().contiguous()?;
    let (squares, up, gram) = (f32_dense(squares)?, f32_dense(up)?, f32_dense(gram)?);
    let guards = [
        squares.storage_and_layout(),
        up.storage_and_layout(),
        wa.storage_and_layout(),
        gram.storage_and_layout(),
    ];
    let stores = guards
        .iter()
        .map(|(st, _)| cuda_storage(st, "DoRA norms"))
        .collect::<Result<Vec<_>>>()?;
    let dev = stores[0].device().clone();
    let func = function(&dev, "dora_norms", wa.dtype())?;
    let inputs = [
        (stores[0], guards[0].1),
        (stores[1], guards[1].1),
        (stores[2], guards[2].1),
        (stores[3], guards[3].1),
    ];
    let sizes = [long(out)?, long(r)?];
    let scalars = [scale as f32, eps as f32];
    let norms = match wa.dtype() {
        DType::F32 => norms::<f32>(&func, &dev, inputs, sizes, scalars)?,
        DType::BF16 => norms::<half::bf16>(&func, &dev, inputs, sizes, scalars)?,
        other => candle_core::bail!("DoRA norms: no {other:?} kernel"),
    };
    drop(stores);
    drop(guards);
    Ok(untracked(norms, (out, 1)))
}

fn norms<T: CudaDType + DeviceRepr + WithDType>(
    func: &CudaFunction,
    dev: &CudaDevice,
    [squares, up, wa, gram]: [(&CudaStorage, &Layout); 4],
    [out, r]: [i64; 2],
    [scale, eps]: [f32; 2],
) -> Result<CudaStorage> {
    let sv = ptx::view::<f32>(squares.0, squares.1)?;
    let uv = ptx::view::<f32>(up.0, up.1)?;
    let wv = ptx::view::<T>(wa.0, wa.1)?;
    let gv = ptx::view::<f32>(gram.0, gram.1)?;
    let rows = usize::try_from(out).map_err(|_| candle_core::Error::Msg("negative rows".into()))?;
    // SAFETY: the kernel writes every one of the `rows` values before they are read.
    let norms = unsafe { dev.alloc::<f32>(rows)? };
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(func);
    l.arg(&sv).arg(&uv).arg(&wv).arg(&gv).arg(&norms);
    l.arg(&out).arg(&r).arg(&scale).arg(&eps);
    // SAFETY: argument order and types match fs_dora_norms_* in kernels/adapter.cu; `squares` holds out values,
    // `up` out·r, `wa` r·out, `gram` r·r (checked by the caller), the output out.
    unsafe { l.launch(ptx::elementwise_config(rows)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(norms, dev.clone()))
}

/// `w + p1 ⊙ p2` for three f32 or bf16 CUDA tensors of one shape and dtype, the product rounded to the dtype
/// before the sum.
pub fn add_product(w: &Tensor, p1: &Tensor, p2: &Tensor) -> Result<Tensor> {
    let (w, p1, p2) = (w.contiguous()?, p1.contiguous()?, p2.contiguous()?);
    let dtype = w.dtype();
    let n = w.elem_count();
    let guards = [
        w.storage_and_layout(),
        p1.storage_and_layout(),
        p2.storage_and_layout(),
    ];
    let stores = guards
        .iter()
        .map(|(st, _)| cuda_storage(st, "add product"))
        .collect::<Result<Vec<_>>>()?;
    let dev = stores[0].device().clone();
    let func = function(&dev, "add_product", dtype)?;
    let aligned = guards
        .iter()
        .all(|(_, l)| (l.start_offset() * dtype.size_in_bytes()) % 16 == 0);
    let vec = n % super::mixed::MIXED_WIDTH == 0 && aligned;
    let inputs = [
        (stores[0], guards[0].1),
        (stores[1], guards[1].1),
        (stores[2], guards[2].1),
    ];
    let out = match dtype {
        DType::F32 => sum_product::<f32>(&func, &dev, inputs, n, vec)?,
        DType::BF16 => sum_product::<half::bf16>(&func, &dev, inputs, n, vec)?,
        other => candle_core::bail!("add product: no {other:?} kernel"),
    };
    drop(stores);
    drop(guards);
    Ok(untracked(out, w.shape().clone()))
}

fn sum_product<T: CudaDType + DeviceRepr + WithDType>(
    func: &CudaFunction,
    dev: &CudaDevice,
    [w, p1, p2]: [(&CudaStorage, &Layout); 3],
    n: usize,
    vec: bool,
) -> Result<CudaStorage> {
    let wv = ptx::view::<T>(w.0, w.1)?;
    let av = ptx::view::<T>(p1.0, p1.1)?;
    let bv = ptx::view::<T>(p2.0, p2.1)?;
    // SAFETY: the kernel writes every one of the n values before they are read.
    let out = unsafe { dev.alloc::<T>(n)? };
    let (n_arg, vec_arg) = (long(n)?, i64::from(vec));
    let width = if vec { super::mixed::MIXED_WIDTH } else { 1 };
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(func);
    l.arg(&wv)
        .arg(&av)
        .arg(&bv)
        .arg(&out)
        .arg(&n_arg)
        .arg(&vec_arg);
    // SAFETY: argument order and types match fs_add_product_* in kernels/adapter.cu; the three inputs and the
    // output hold n values; `vec` only when n is a multiple of 8 and every buffer starts 16-byte aligned.
    unsafe { l.launch(ptx::elementwise_config(n / width)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// A LoRA layer's `(mid, mid1)` from its down product `raw` [m, r] (f32 or bf16 CUDA, rows at one stride: a narrow
/// of a batched product's columns is read in place): `mid` = raw · scale in raw's dtype (candle's affine, bit for
/// bit) and `mid1` = [mid | 1 | 0…] [m, width].
pub fn lora_mid(raw: &Tensor, scale: f64, width: usize) -> Result<(Tensor, Tensor)> {
    let (m, r) = raw.dims2()?;
    let (storage, layout) = raw.storage_and_layout();
    let rows = crate::ops::row_strided(layout)
        .filter(|s| s.rows == m && s.cols == r && width > r)
        .ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "LoRA activation: {:?} with strides {:?} is not rows at one stride, or width {width} too small",
                raw.dims(),
                layout.stride()
            ))
        })?;
    let store = cuda_storage(&storage, "LoRA activation")?;
    let dev = store.device().clone();
    let func = function(&dev, "lora_mid", raw.dtype())?;
    let (mid, mid1) = match raw.dtype() {
        DType::F32 => mids::<f32>(&func, store, rows, width, scale as f32)?,
        DType::BF16 => mids::<half::bf16>(
            &func,
            store,
            rows,
            width,
            half::bf16::from_f64(scale).to_f32(),
        )?,
        other => candle_core::bail!("LoRA activation: no {other:?} kernel"),
    };
    drop(storage);
    Ok((untracked(mid, (m, r)), untracked(mid1, (m, width))))
}

fn mids<T: CudaDType + DeviceRepr + WithDType>(
    func: &CudaFunction,
    store: &CudaStorage,
    rows: crate::ops::RowStrided,
    width: usize,
    scale: f32,
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = store.device().clone();
    let (m, r) = (rows.rows, rows.cols);
    let end = rows.start + (m.max(1) - 1) * rows.stride + r;
    let raw = store.as_cuda_slice::<T>()?.slice(rows.start..end);
    // SAFETY: the kernel writes every value of both outputs (one grid-stride index per value of `mid1`, which
    // covers every value of `mid`) before either is read.
    let (mid, mid1) = unsafe { (dev.alloc::<T>(m * r)?, dev.alloc::<T>(m * width)?) };
    let args = [long(m)?, long(r)?, long(rows.stride)?, long(width)?];
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(func);
    l.arg(&raw).arg(&mid).arg(&mid1);
    l.arg(&args[0])
        .arg(&args[1])
        .arg(&args[2])
        .arg(&args[3])
        .arg(&scale);
    // SAFETY: argument order and types match fs_lora_mid_* in kernels/adapter.cu; `raw` holds row i's r values at
    // i · stride (the slice ends after the last row's), `mid` m·r values, `mid1` m·width.
    unsafe { l.launch(ptx::elementwise_config(m * width)) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(mid, dev.clone()),
        CudaStorage::wrap_cuda_slice(mid1, dev),
    ))
}

/// `[up | bias | 0…]` [n, width] in `bias`' dtype (f32 or bf16) from a LoRA's f32 `up` [n, r] (CUDA) and the
/// layer's bias [n].
pub fn lora_up(up: &Tensor, bias: &Tensor, width: usize) -> Result<Tensor> {
    let (n, r) = up.dims2()?;
    if bias.elem_count() != n || width <= r {
        candle_core::bail!(
            "LoRA factor with its bias: up {:?}, bias {:?}, width {width}",
            up.dims(),
            bias.dims()
        );
    }
    let up = f32_dense(up)?;
    let bias = bias.detach().contiguous()?;
    let dtype = bias.dtype();
    let (ug, bg) = (up.storage_and_layout(), bias.storage_and_layout());
    let (su, sb) = (
        cuda_storage(&ug.0, "LoRA factor with its bias")?,
        cuda_storage(&bg.0, "LoRA factor with its bias")?,
    );
    let dev = su.device().clone();
    let func = function(&dev, "lora_up", dtype)?;
    let sizes = [long(n)?, long(r)?, long(width)?];
    let out = match dtype {
        DType::F32 => ups::<f32>(&func, &dev, [(su, ug.1), (sb, bg.1)], sizes, n * width)?,
        DType::BF16 => ups::<half::bf16>(&func, &dev, [(su, ug.1), (sb, bg.1)], sizes, n * width)?,
        other => candle_core::bail!("LoRA factor with its bias: no {other:?} kernel"),
    };
    drop((ug, bg));
    Ok(untracked(out, (n, width)))
}

fn ups<T: CudaDType + DeviceRepr + WithDType>(
    func: &CudaFunction,
    dev: &CudaDevice,
    [up, bias]: [(&CudaStorage, &Layout); 2],
    [n, r, width]: [i64; 3],
    count: usize,
) -> Result<CudaStorage> {
    let uv = ptx::view::<f32>(up.0, up.1)?;
    let bv = ptx::view::<T>(bias.0, bias.1)?;
    // SAFETY: the kernel writes every one of the `count` values before they are read.
    let out = unsafe { dev.alloc::<T>(count)? };
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(func);
    l.arg(&uv).arg(&bv).arg(&out);
    l.arg(&n).arg(&r).arg(&width);
    // SAFETY: argument order and types match fs_lora_up_* in kernels/adapter.cu; `up` holds n·r f32 values, the
    // bias n, the output n·width.
    unsafe { l.launch(ptx::elementwise_config(count)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// `w + w1 ⊗ w2` for a CUDA weight `w` [a·c, b·d] and its LoKr factors `w1` [a, b] (the scale on it) and `w2`
/// [c, d], all of one dtype (f32 or bf16): the product and the sum in f32, rounded once (see `fs_add_kron_*`).
pub fn add_kron(w: &Tensor, w1: &Tensor, w2: &Tensor) -> Result<Tensor> {
    let (w, w1, w2) = (w.contiguous()?, w1.contiguous()?, w2.contiguous()?);
    let dtype = w.dtype();
    let (rows, cols) = w.dims2()?;
    let (a, b) = w1.dims2()?;
    let (c, d) = w2.dims2()?;
    if rows != a * c || cols != b * d || w1.dtype() != dtype || w2.dtype() != dtype {
        candle_core::bail!(
            "add kron: weight {:?} ({dtype:?}) against factors {:?} ({:?}) and {:?} ({:?})",
            w.dims(),
            w1.dims(),
            w1.dtype(),
            w2.dims(),
            w2.dtype()
        );
    }
    let guards = [
        w.storage_and_layout(),
        w1.storage_and_layout(),
        w2.storage_and_layout(),
    ];
    let stores = guards
        .iter()
        .map(|(st, _)| cuda_storage(st, "add kron"))
        .collect::<Result<Vec<_>>>()?;
    let dev = stores[0].device().clone();
    let func = function(&dev, "add_kron", dtype)?;
    let aligned = guards
        .iter()
        .all(|(_, l)| (l.start_offset() * dtype.size_in_bytes()) % 16 == 0);
    let vec = d % super::mixed::MIXED_WIDTH == 0 && aligned;
    let inputs = [
        (stores[0], guards[0].1),
        (stores[1], guards[1].1),
        (stores[2], guards[2].1),
    ];
    let dims = KronDims { rows, b, c, d };
    let out = match dtype {
        DType::F32 => kron_sum::<f32>(&func, &dev, inputs, dims, vec)?,
        DType::BF16 => kron_sum::<half::bf16>(&func, &dev, inputs, dims, vec)?,
        other => candle_core::bail!("add kron: no {other:?} kernel"),
    };
    drop(stores);
    drop(guards);
    Ok(untracked(out, (rows, cols)))
}

/// The weight's rows (`a · c`) and the factors' `b`, `c`, `d`.
#[derive(Clone, Copy)]
struct KronDims {
    rows: usize,
    b: usize,
    c: usize,
    d: usize,
}

fn kron_sum<T: CudaDType + DeviceRepr + WithDType>(
    func: &CudaFunction,
    dev: &CudaDevice,
    [w, w1, w2]: [(&CudaStorage, &Layout); 3],
    KronDims { rows, b, c, d }: KronDims,
    vec: bool,
) -> Result<CudaStorage> {
    let wv = ptx::view::<T>(w.0, w.1)?;
    let v1 = ptx::view::<T>(w1.0, w1.1)?;
    let v2 = ptx::view::<T>(w2.0, w2.1)?;
    let n = rows * b * d;
    // SAFETY: the kernel writes every one of the n values before they are read.
    let out = unsafe { dev.alloc::<T>(n)? };
    let (rows_arg, b_arg, c_arg, d_arg) = (long(rows)?, long(b)?, long(c)?, long(d)?);
    let vec_arg = i64::from(vec);
    let width = if vec { super::mixed::MIXED_WIDTH } else { 1 };
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(func);
    l.arg(&wv)
        .arg(&v1)
        .arg(&v2)
        .arg(&out)
        .arg(&rows_arg)
        .arg(&b_arg)
        .arg(&c_arg)
        .arg(&d_arg)
        .arg(&vec_arg);
    // SAFETY: argument order and types match fs_add_kron_* in kernels/adapter.cu; `w` and the output hold
    // rows · b · d values, `w1` (rows / c) · b and `w2` c · d (checked by the caller); `vec` only when d is a
    // multiple of 8 and every buffer starts 16-byte aligned.
    unsafe { l.launch(ptx::elementwise_config(n / width)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}
