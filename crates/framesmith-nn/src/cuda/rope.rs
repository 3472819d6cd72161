//! Wan's 3D rotary embedding applied on CUDA (`fs_rope` in `kernels/elementwise.cu`) as a differentiable custom
//! op: adjacent pairs of `xs` [b, l, heads, head_dim] rotated by per-token angle tables. The tables (built by
//! `models::wan::rope::Rope`, frame / height / width parts already laid out) are constants: no gradient flows to
//! them. The backward is the inverse rotation.

use candle_core::{CudaStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, D};

use super::elementwise::{launch_dispatch, Launch};
use super::ptx::long;
use crate::ops::Dense;

/// Rotates `xs` [b, l, h, d] pairwise by `cos` / `sin` tables of `b · l · d/2` values (e.g. [b, l, 1, d/2]).
/// CUDA f32 / bf16 inputs run the kernel (angles applied in f32), others [`rope_reference`].
pub fn rope_apply(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (b, l, h, d) = xs.dims4()?;
    if d % 2 != 0 || cos.elem_count() != b * l * d / 2 || sin.elem_count() != cos.elem_count() {
        candle_core::bail!(
            "rope tables with {} / {} values for x {:?}",
            cos.elem_count(),
            sin.elem_count(),
            xs.dims()
        );
    }
    if !xs.device().is_cuda() || !matches!(xs.dtype(), DType::F32 | DType::BF16) {
        return rope_reference(xs, cos, sin);
    }
    let table = |t: &Tensor| t.detach().to_dtype(DType::F32)?.dense();
    let op = Rope {
        rows: b * l,
        heads: h,
        half: d / 2,
        sign: 1.0,
    };
    xs.dense()?.apply_op3(&table(cos)?, &table(sin)?, op)
}

/// Input gradient of [`rope_apply`] (the inverse rotation of `dy`), outside autograd. CUDA only.
pub fn rope_backward(dy: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (b, l, h, d) = dy.dims4()?;
    if !dy.device().is_cuda() || !matches!(dy.dtype(), DType::F32 | DType::BF16) {
        candle_core::bail!("rope_backward needs an f32 / bf16 CUDA tensor");
    }
    if cos.elem_count() != b * l * d / 2 || sin.elem_count() != cos.elem_count() {
        candle_core::bail!(
            "rope tables with {} / {} values for dy {:?}",
            cos.elem_count(),
            sin.elem_count(),
            dy.dims()
        );
    }
    let table = |t: &Tensor| t.detach().to_dtype(DType::F32)?.dense();
    let op = Rope {
        rows: b * l,
        heads: h,
        half: d / 2,
        sign: -1.0,
    };
    dy.dense()?
        .apply_op3_no_bwd(&table(cos)?, &table(sin)?, &op)
}

/// The rotation written with candle ops (in f32, result in `xs`' dtype): the CPU path and the test reference.
pub fn rope_reference(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (b, l, h, d) = xs.dims4()?;
    let pairs = xs.to_dtype(DType::F32)?.reshape((b, l, h, d / 2, 2))?;
    let re = pairs.narrow(D::Minus1, 0, 1)?.squeeze(D::Minus1)?;
    let im = pairs.narrow(D::Minus1, 1, 1)?.squeeze(D::Minus1)?;
    let cos = cos.to_dtype(DType::F32)?.reshape((b, l, 1, d / 2))?;
    let sin = sin.to_dtype(DType::F32)?.reshape((b, l, 1, d / 2))?;
    let out_re = (re.broadcast_mul(&cos)? - im.broadcast_mul(&sin)?)?;
    let out_im = (re.broadcast_mul(&sin)? + im.broadcast_mul(&cos)?)?;
    Tensor::stack(&[out_re, out_im], D::Minus1)?
        .reshape((b, l, h, d))?
        .to_dtype(xs.dtype())
}

#[derive(Clone, Copy)]
struct Rope {
    rows: usize,
    heads: usize,
    half: usize,
    sign: f32,
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "framesmith-rope"
    }

    cuda_only_cpu_fwd!("rope_reference"; x, cos, sin);

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        cos: &CudaStorage,
        cl: &Layout,
        sin: &CudaStorage,
        sl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let sizes = [long(self.rows)?, long(self.heads)?, long(self.half)?];
        let n = xl.shape().elem_count();
        let out = launch_dispatch(&Launch {
            name: "fs_rope",
            inputs: &[(x, xl), (cos, cl), (sin, sl)],
            scalars: &[self.sign],
            sizes: &sizes,
            n,
            unit: 2 * self.half,
        })?;
        Ok((out, xl.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let inverse = Rope {
            sign: -self.sign,
            ..*self
        };
        let dx = dy.dense()?.apply_op3_no_bwd(cos, sin, &inverse)?;
        Ok((Some(dx), None, None))
    }
}
