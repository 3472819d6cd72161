//! The element-wise custom ops behind `elementwise`'s functions: each one's CUDA forward, and the backward it gives
//! autograd.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{
    CudaStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor,
};

use super::{launch_dispatch, Geometry, Launch};
use crate::cuda::ptx::{self, long};
use crate::ops::Dense;

/// Tokens per block in the modulation-gradient reduction.
const TOKENS_PER_CHUNK: usize = 64;

pub(super) struct Modulate {
    pub(super) g: Geometry,
}

impl CustomOp3 for Modulate {
    fn name(&self) -> &'static str {
        "framesmith-modulate"
    }

    cuda_only_cpu_fwd!("the matching *_reference function in nn::ops"; a, b, c);

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        scale: &CudaStorage,
        sl: &Layout,
        shift: &CudaStorage,
        hl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let n = xl.shape().elem_count();
        let out = launch_dispatch(&Launch {
            name: "fs_modulate_fwd",
            inputs: &[(x, xl), (scale, sl), (shift, hl)],
            scalars: &[],
            sizes: &self.g.args()?,
            n,
            unit: self.g.dim,
        })?;
        Ok((out, xl.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        scale: &Tensor,
        shift: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dy = dy.dense()?;
        let dx = dy.apply_op2_no_bwd(
            scale,
            &ScaledBwd {
                g: self.g,
                offset: 1.0,
            },
        )?;
        if !scale.track_op() && !shift.track_op() {
            return Ok((Some(dx), None, None));
        }
        let (dscale, dshift) = mod_param_grad(x, &dy, self.g, true)?;
        let dshift = dshift.map(|d| d.reshape(shift.shape())).transpose()?;
        Ok((Some(dx), Some(dscale.reshape(scale.shape())?), dshift))
    }
}

pub(super) struct Gated {
    pub(super) g: Geometry,
}

impl CustomOp3 for Gated {
    fn name(&self) -> &'static str {
        "framesmith-gated-residual"
    }

    cuda_only_cpu_fwd!("the matching *_reference function in nn::ops"; a, b, c);

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        y: &CudaStorage,
        yl: &Layout,
        gate: &CudaStorage,
        gl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let n = xl.shape().elem_count();
        let out = launch_dispatch(&Launch {
            name: "fs_gated_fwd",
            inputs: &[(x, xl), (y, yl), (gate, gl)],
            scalars: &[],
            sizes: &self.g.args()?,
            n,
            unit: self.g.dim,
        })?;
        Ok((out, xl.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        y: &Tensor,
        gate: &Tensor,
        _res: &Tensor,
        dout: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dout = dout.dense()?;
        let dy = dout.apply_op2_no_bwd(
            gate,
            &ScaledBwd {
                g: self.g,
                offset: 0.0,
            },
        )?;
        let dgate = if gate.track_op() {
            Some(
                mod_param_grad(y, &dout, self.g, false)?
                    .0
                    .reshape(gate.shape())?,
            )
        } else {
            None
        };
        Ok((Some(dout), Some(dy), dgate))
    }
}

/// `dy * (offset + scale)`.
pub(super) struct ScaledBwd {
    pub(super) g: Geometry,
    pub(super) offset: f32,
}

impl CustomOp2 for ScaledBwd {
    fn name(&self) -> &'static str {
        "framesmith-scaled-bwd"
    }

    cuda_only_cpu_fwd!("the matching *_reference function in nn::ops"; a, b);

    fn cuda_fwd(
        &self,
        dy: &CudaStorage,
        dyl: &Layout,
        scale: &CudaStorage,
        sl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let n = dyl.shape().elem_count();
        let out = launch_dispatch(&Launch {
            name: "fs_scaled_bwd",
            inputs: &[(dy, dyl), (scale, sl)],
            scalars: &[self.offset],
            sizes: &self.g.args()?,
            n,
            unit: self.g.dim,
        })?;
        Ok((out, dyl.shape().clone()))
    }
}

/// Gradients of a modulation vector: `(sum g * a, sum g)` over the tokens that share it, each `[B, Ls, D]` f32.
pub(super) fn mod_param_grad(
    a: &Tensor,
    g: &Tensor,
    geo: Geometry,
    with_sum: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let packed = a
        .dense()?
        .apply_op2_no_bwd(g, &ModParamGrad { g: geo, with_sum })?;
    let ga = packed.get(0)?.reshape(geo.mod_shape())?;
    let gb = if with_sum {
        Some(packed.get(1)?.reshape(geo.mod_shape())?)
    } else {
        None
    };
    Ok((ga, gb))
}

/// Output `[2, B * Ls * D]` f32: row 0 `sum g * a`, row 1 `sum g` (left zero unless `with_sum`).
struct ModParamGrad {
    g: Geometry,
    with_sum: bool,
}

impl CustomOp2 for ModParamGrad {
    fn name(&self) -> &'static str {
        "framesmith-mod-param-grad"
    }

    cuda_only_cpu_fwd!("the matching *_reference function in nn::ops"; a, b);

    fn cuda_fwd(
        &self,
        a: &CudaStorage,
        al: &Layout,
        g: &CudaStorage,
        gl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = a.device().clone();
        let geo = self.g;
        let m = geo.batch * geo.mod_tokens * geo.dim;
        let out = dev.alloc_zeros::<f32>(2 * m)?;
        let suffix = ptx::suffix(a.dtype())?;
        let func = ptx::load(
            &dev,
            &ptx::ELEMENTWISE,
            &format!("fs_mod_param_grad_{suffix}"),
        )?;
        let (ga, gb) = (out.slice(0..m), out.slice(m..2 * m));
        let null = 0u64;
        let [_, d, l, ls] = geo.args()?;
        let chunk = TOKENS_PER_CHUNK as i64;
        let cfg = LaunchConfig {
            grid_dim: (
                geo.dim.div_ceil(ptx::THREADS as usize) as u32,
                geo.tokens.div_ceil(TOKENS_PER_CHUNK).max(1) as u32,
                geo.batch as u32,
            ),
            block_dim: (ptx::THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        macro_rules! launch {
            ($t:ty) => {{
                let (av, gv) = (ptx::view::<$t>(a, al)?, ptx::view::<$t>(g, gl)?);
                let stream = dev.cuda_stream();
                let mut b = stream.launch_builder(&func);
                b.arg(&av).arg(&gv).arg(&ga);
                if self.with_sum { b.arg(&gb) } else { b.arg(&null) };
                b.arg(&d).arg(&l).arg(&ls).arg(&chunk);
                // SAFETY: argument order and types match fs_mod_param_grad in kernels/elementwise.cu; a and g
                // hold B * L * D values and the zeroed output 2 * B * Ls * D.
                unsafe { b.launch(cfg) }.w()?;
            }};
        }
        match a.dtype() {
            DType::F32 => launch!(f32),
            DType::BF16 => launch!(half::bf16),
            other => {
                candle_core::bail!("framesmith-mod-param-grad takes f32 or bf16, not {other:?}")
            }
        }
        Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((2, m))))
    }
}

pub(super) struct Gelu;

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "framesmith-gelu-tanh"
    }

    cuda_only_cpu_fwd!("the matching *_reference function in nn::ops"; a);

    fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
        let n = xl.shape().elem_count();
        let out = launch_dispatch(&Launch {
            name: "fs_gelu_fwd",
            inputs: &[(x, xl)],
            scalars: &[],
            sizes: &[long(n)?],
            n,
            unit: n,
        })?;
        Ok((out, xl.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(&dy.dense()?, &GeluBwd)?))
    }
}

pub(super) struct GeluBwd;

impl CustomOp2 for GeluBwd {
    fn name(&self) -> &'static str {
        "framesmith-gelu-tanh-bwd"
    }

    cuda_only_cpu_fwd!("the matching *_reference function in nn::ops"; a, b);

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        dy: &CudaStorage,
        dyl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let n = xl.shape().elem_count();
        let out = launch_dispatch(&Launch {
            name: "fs_gelu_bwd",
            inputs: &[(x, xl), (dy, dyl)],
            scalars: &[],
            sizes: &[long(n)?],
            n,
            unit: n,
        })?;
        Ok((out, xl.shape().clone()))
    }
}
