//! Element-wise ops whose input and output dtypes differ (f32 ↔ bf16), outside autograd: a vectorised cast and
//! the block's modulation, scaled backward and gated residual with the cast fused in. The residual stream is f32
//! while the block computes in bf16; fusing the cast reads or writes each f32 tensor once instead of twice, and
//! candle's own bf16 → f32 cast kernel runs at about a fifth of the memory bandwidth (H200 profile, 480 µs for
//! a [32760, 1536] tensor). Every function falls back to the candle composition for other devices and dtypes,
//! so callers use them unconditionally.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::DeviceRepr;
use candle_core::cuda_backend::CudaDType;
use candle_core::{
    CudaStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor,
};

use super::elementwise::{as_mod_f32, check_shift, launch_named, Geometry, Launch};
use super::ptx::{self, long};
use crate::ops::Dense;

/// Values per vectorised chunk of the mixed kernels and the fused norms (`MIXED_W` in kernels/common.cuh).
pub(super) const MIXED_WIDTH: usize = 8;

fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16)
}

/// Whether the fused kernel applies: a CUDA tensor converting between f32 and bf16.
fn mixed(xs: &Tensor, out: DType) -> bool {
    xs.device().is_cuda() && is_float(xs.dtype()) && is_float(out) && xs.dtype() != out
}

/// `xs` in `dtype` (f32 ↔ bf16 through the vectorised kernel on CUDA; `to_dtype` otherwise).
pub fn cast(xs: &Tensor, dtype: DType) -> Result<Tensor> {
    if !mixed(xs, dtype) {
        return xs.to_dtype(dtype);
    }
    xs.dense()?.apply_op1_no_bwd(&Cast { out: dtype })
}

/// `x * (1 + scale) + shift` computed in f32 and written in `out` (the modulated norm fed to the block's
/// linears in the compute dtype). Modulation vectors as in [`super::modulate`]. No gradient.
pub fn modulate_to(xs: &Tensor, scale: &Tensor, shift: &Tensor, out: DType) -> Result<Tensor> {
    if !mixed(xs, out) {
        return super::modulate(&xs.detach(), &scale.detach(), &shift.detach())?.to_dtype(out);
    }
    let g = Geometry::of(xs, scale)?;
    check_shift(scale, shift)?;
    xs.dense()?.apply_op3_no_bwd(
        &as_mod_f32(scale)?,
        &as_mod_f32(shift)?,
        &Fused {
            name: "fs_modulate_fwd",
            g,
            scalars: Vec::new(),
            types: (out, out),
        },
    )
}

/// `dy * (offset + scale)` in f32, written in `out`: the modulation's input gradient (`offset` 1) or the gated
/// residual branch's gradient (`offset` 0). CUDA f32 / bf16 tensors only.
pub fn scaled_to(dy: &Tensor, scale: &Tensor, offset: f32, out: DType) -> Result<Tensor> {
    if !dy.device().is_cuda() || !is_float(dy.dtype()) || !is_float(out) {
        candle_core::bail!("scaled_to needs an f32 / bf16 CUDA tensor");
    }
    if dy.dtype() == out {
        return super::elementwise::scaled(dy, scale, offset);
    }
    let g = Geometry::of(dy, scale)?;
    dy.dense()?.apply_op2_no_bwd(
        &as_mod_f32(scale)?,
        &Fused {
            name: "fs_scaled_bwd",
            g,
            scalars: vec![offset],
            types: (out, out),
        },
    )
}

/// `x + y * gate` in f32 with the result in `x`'s dtype, for a branch `y` in another dtype (an f32 residual
/// stream and a bf16 branch) — no cast of `y` first. No gradient.
pub fn gated_residual_mixed(xs: &Tensor, ys: &Tensor, gate: &Tensor) -> Result<Tensor> {
    if !mixed(ys, xs.dtype()) || !xs.device().is_cuda() || xs.dims() != ys.dims() {
        return super::gated_residual(&xs.detach(), &ys.detach(), &gate.detach());
    }
    let g = Geometry::of(xs, gate)?;
    xs.dense()?.apply_op3_no_bwd(
        &ys.dense()?,
        &as_mod_f32(gate)?,
        &Fused {
            name: "fs_gated_fwd",
            g,
            scalars: Vec::new(),
            types: (ys.dtype(), xs.dtype()),
        },
    )
}

/// Launches `{name}_{first input's dtype}_{second}` on `inputs` with an `out` output: `second` is the output
/// dtype except for the gated residual, whose kernel is named by its branch's dtype.
fn launch_mixed(
    name: &str,
    inputs: &[(&CudaStorage, &Layout)],
    scalars: &[f32],
    sizes: &[i64],
    unit: usize,
    (second, out): (DType, DType),
) -> Result<CudaStorage> {
    let n = inputs[0].1.shape().elem_count();
    let function = format!(
        "{name}_{}_{}",
        ptx::suffix(inputs[0].0.dtype())?,
        ptx::suffix(second)?
    );
    let l = Launch {
        name,
        inputs,
        scalars,
        sizes,
        n,
        unit,
    };
    fn go<T: CudaDType + DeviceRepr>(l: &Launch, f: &str) -> Result<CudaStorage> {
        launch_named::<T>(l, f, MIXED_WIDTH)
    }
    match out {
        DType::F32 => go::<f32>(&l, &function),
        DType::BF16 => go::<half::bf16>(&l, &function),
        other => candle_core::bail!("{name}: no {other:?} output"),
    }
}

struct Cast {
    out: DType,
}

impl CustomOp1 for Cast {
    fn name(&self) -> &'static str {
        "framesmith-cast"
    }

    cuda_only_cpu_fwd!("nn::ops' portable version"; a);

    fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
        let n = xl.shape().elem_count();
        let out = launch_mixed(
            "fs_cast",
            &[(x, xl)],
            &[],
            &[long(n)?],
            n,
            (self.out, self.out),
        )?;
        Ok((out, xl.shape().clone()))
    }
}

/// A modulation-geometry kernel `name_{in}_{out}` (modulate, scaled backward, gated residual).
struct Fused {
    name: &'static str,
    g: Geometry,
    scalars: Vec<f32>,
    /// The dtype that names the kernel after the input's, and the output dtype.
    types: (DType, DType),
}

impl Fused {
    /// The kernel over `inputs` (the first is the activation whose shape the output takes).
    fn launch(&self, inputs: &[(&CudaStorage, &Layout)]) -> Result<(CudaStorage, Shape)> {
        let out = launch_mixed(
            self.name,
            inputs,
            &self.scalars,
            &self.g.args()?,
            self.g.dim,
            self.types,
        )?;
        Ok((out, inputs[0].1.shape().clone()))
    }
}

impl CustomOp2 for Fused {
    fn name(&self) -> &'static str {
        self.name
    }

    cuda_only_cpu_fwd!("nn::ops' portable version"; a, b);

    fn cuda_fwd(
        &self,
        a: &CudaStorage,
        al: &Layout,
        b: &CudaStorage,
        bl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.launch(&[(a, al), (b, bl)])
    }
}

impl CustomOp3 for Fused {
    fn name(&self) -> &'static str {
        self.name
    }

    cuda_only_cpu_fwd!("nn::ops' portable version"; a, b, c);

    fn cuda_fwd(
        &self,
        a: &CudaStorage,
        al: &Layout,
        b: &CudaStorage,
        bl: &Layout,
        c: &CudaStorage,
        cl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.launch(&[(a, al), (b, bl), (c, cl)])
    }
}
