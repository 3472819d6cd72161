//! `Linear`: one linear layer for every base-weight format (dense f32/bf16/f16, or FP8 e4m3 with per-tensor,
//! per-channel or block-64 scales), frozen, with an optional trainable LoRA.
//! The base matmul runs as a custom op whose backward yields only the input gradient: candle's own matmul
//! backward would compute (and keep) a weight-sized gradient for the frozen base. An FP8 base is dequantised
//! inside the op, in the forward and again in the backward, so no dense copy outlives either.

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Storage, Tensor, D,
};

use super::adapter::Adapter;
use super::fp8::{self, Fp8Scale, Fp8Weight};
use super::load_timing::{timed, LoadPart};
use super::lora::Lora;
use super::vb::Vb;

/// The frozen base weight `[out, in]` of a [`Linear`].
#[derive(Clone, Debug)]
pub enum BaseWeight {
    /// Dense, in the dtype it was loaded in (normally the compute dtype).
    Dense(Tensor),
    /// FP8 e4m3 codes with f32 scales, dequantised on the fly.
    Fp8(Fp8Weight),
}

impl BaseWeight {
    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        match self {
            Self::Dense(w) => {
                let d = w.dims();
                (d[0], d[1])
            }
            Self::Fp8(w) => w.dims(),
        }
    }

    /// The device holding the weight.
    pub fn device(&self) -> &Device {
        match self {
            Self::Dense(w) => w.device(),
            Self::Fp8(w) => w.device(),
        }
    }

    /// Bytes the base occupies (what block streaming moves).
    pub fn storage_bytes(&self) -> usize {
        match self {
            Self::Dense(w) => w.elem_count() * w.dtype().size_in_bytes(),
            Self::Fp8(w) => w.storage_bytes(),
        }
    }

    /// The dense weight `[out, in]` in `dtype` (dequantised for FP8).
    pub fn dense(&self, dtype: DType) -> Result<Tensor> {
        match self {
            Self::Dense(w) => w.to_dtype(dtype),
            Self::Fp8(w) => w.dequantize(dtype),
        }
    }

    /// The input gradient `dy · W` `[m, in]` for `dy` `[m, out]`, added to `acc` (`[m, in]` in `dy`'s dtype, a
    /// tensor the caller owns; in place on CUDA) when given. A weight marked for FP8 products
    /// ([`Fp8Weight::for_fp8_products`]) takes it on FP8 tensor cores where the shape allows
    /// ([`crate::cuda::fp8_gemm::fp8_input_grad`]); otherwise the dense weight in `dy`'s dtype.
    pub fn input_grad(&self, dy: &Tensor, acc: Option<Tensor>) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let Self::Fp8(w) = self {
            use crate::cuda::fp8_gemm;
            let (m, n) = dy.dims2()?;
            let k = w.dims().1;
            let acc_fits = acc.as_ref().is_none_or(|a| fp8_gemm::takes_sum(a));
            if w.fp8_products()
                && dy.device().is_cuda()
                && acc_fits
                && fp8_gemm::input_grad_supported(dy.dtype(), m, n, k)
            {
                return fp8_gemm::fp8_input_grad(dy, w.codes(), w.scale(), acc);
            }
        }
        let w = self.dense(dy.dtype())?;
        match acc {
            Some(acc) => grad::add_matmul(acc, dy, &w, false),
            None => dy.matmul(&w),
        }
    }
}

/// A frozen linear layer `y = x Wᵀ + b` with an optional adapter, e.g. a LoRA
/// `y += up(down(x)) · alpha / rank · multiplier`.
#[derive(Clone)]
pub struct Linear {
    base: BaseWeight,
    bias: Option<Tensor>,
    adapter: Option<Adapter>,
    /// `‖W_o‖²` per output row of the base, computed on DoRA's first use and kept: the base is frozen, and the
    /// copies block streaming makes of a layer (other tensors, the same values) share it.
    base_squares: RowSquares,
}

/// A lazily computed per-row constant of a frozen base, shared by a layer's clones.
#[derive(Clone, Default)]
struct RowSquares(std::sync::Arc<std::sync::OnceLock<Tensor>>);

impl Linear {
    /// Reads `weight` [out, in] and, when present, `bias` [out] under `vb`.
    ///
    /// A dense weight stays dense, or is quantised to FP8 when `vb.fp8()` is set. A pre-quantised weight
    /// (dtype F8E4M3) takes its scale from `scale_weight` (ComfyUI `scaled_fp8`, musubi-tuner) or `weight_scale`
    /// (ComfyUI mixed precision, other exporters), or scale 1 when neither exists; it stays FP8 when `vb.fp8()`
    /// is set and is dequantised to the compute dtype otherwise. With `vb.fp8_products()` an FP8 base is held
    /// per channel and marked for FP8 tensor-core products. Input scales (`scale_input`, `input_scale`)
    /// only matter to FP8×FP8 matmuls and are not read: activations stay in the compute dtype here.
    pub fn load(vb: &Vb, in_dim: usize, out_dim: usize) -> Result<Self> {
        // FP8 codes come as their bytes where the source can give them so: no conversion on the way in.
        let (stored, fp8_codes) = match vb.get_fp8_codes("weight")? {
            Some(codes) => (codes, true),
            None => {
                let stored = vb.get_stored("weight")?;
                let fp8 = stored.dtype() == DType::F8E4M3;
                (stored, fp8)
            }
        };
        if stored.dims() != [out_dim, in_dim] {
            candle_core::bail!(
                "tensor `{}` has shape {:?}, expected [{out_dim}, {in_dim}]",
                vb.path("weight"),
                stored.dims()
            );
        }
        let for_products = |w: Fp8Weight| {
            if vb.fp8_products() {
                w.for_fp8_products()
            } else {
                Ok(w)
            }
        };
        let to_device = |w: &Fp8Weight| timed(LoadPart::ToDevice, || w.to_device(vb.device()));
        let base = if fp8_codes {
            let weight = timed(LoadPart::Fp8, || load_prequantized(vb, &stored))?;
            match vb.fp8() {
                Some(_) => {
                    let weight = timed(LoadPart::Fp8, || for_products(weight))?;
                    BaseWeight::Fp8(to_device(&weight)?)
                }
                None => {
                    let dense = timed(LoadPart::Fp8, || weight.dequantize(vb.dtype()))?;
                    BaseWeight::Dense(timed(LoadPart::ToDevice, || dense.to_device(vb.device()))?)
                }
            }
        } else if let Some(mode) = vb.fp8() {
            // FP8 products take one scale per channel: quantised so from the start, rounding each value once.
            let mode = if vb.fp8_products() {
                Fp8Scale::Channel
            } else {
                mode
            };
            let weight = timed(LoadPart::Fp8, || {
                fp8::quantize(&stored, mode).and_then(for_products)
            })?;
            BaseWeight::Fp8(to_device(&weight)?)
        } else {
            let dense = timed(LoadPart::ToDevice, || stored.to_device(vb.device()))?;
            BaseWeight::Dense(dense.to_dtype(vb.dtype())?)
        };
        let bias = if vb.contains("bias") {
            Some(vb.get(out_dim, "bias")?)
        } else {
            None
        };
        Ok(Self::from_base(base, bias))
    }

    /// A layer from a dense weight [out, in] and optional bias [out].
    pub fn from_weights(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self::from_base(BaseWeight::Dense(weight), bias)
    }

    /// A layer from a base weight in any format and optional bias [out].
    pub fn from_base(base: BaseWeight, bias: Option<Tensor>) -> Self {
        Self {
            base,
            bias,
            adapter: None,
            base_squares: RowSquares::default(),
        }
    }

    /// The frozen base weight.
    pub fn base(&self) -> &BaseWeight {
        &self.base
    }

    /// The bias, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// Input width.
    pub fn in_dim(&self) -> usize {
        self.base.dims().1
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        self.base.dims().0
    }

    /// The plain LoRA attached to this layer, if that is its adapter.
    pub fn lora(&self) -> Option<&Lora> {
        self.adapter.as_ref().and_then(Adapter::as_lora)
    }

    /// The adapter attached to this layer, of any kind.
    pub fn adapter(&self) -> Option<&Adapter> {
        self.adapter.as_ref()
    }

    /// The frozen tensors (base weight — FP8 codes and scales — and bias) in a fixed order, for block streaming
    /// to point the layer at same-shaped copies in a GPU slot. The LoRA is not among them: it stays put.
    pub fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out: Vec<&mut Tensor> = match &mut self.base {
            BaseWeight::Dense(w) => vec![w],
            BaseWeight::Fp8(w) => w.tensors_mut().into_iter().collect(),
        };
        if let Some(b) = self.bias.as_mut() {
            out.push(b);
        }
        out
    }

    /// Attaches (or removes) a LoRA.
    pub fn set_lora(&mut self, lora: Option<Lora>) {
        self.adapter = lora.map(Adapter::Lora);
    }

    /// Attaches (or removes) an adapter of any kind.
    pub fn set_adapter(&mut self, adapter: Option<Adapter>) {
        self.adapter = adapter;
    }

    /// Applies the layer to `xs` [..., in]; the result has `xs`' dtype.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let mut out_dims = xs.dims().to_vec();
        if let Some(last) = out_dims.last_mut() {
            *last = self.out_dim();
        }
        let x2 = xs.flatten_to(D::Minus2)?.contiguous()?;
        let mut y = x2.apply_op1(FrozenMatmul {
            base: self.base.clone(),
        })?;
        if let Some(Adapter::Dora(dora)) = &self.adapter {
            // The magnitude rescales the base's output too, so it comes before the bias.
            y = self.dora_forward_tracked(dora, &x2, y)?;
        }
        if let Some(b) = &self.bias {
            y = y.broadcast_add(&b.to_dtype(y.dtype())?)?;
        }
        match &self.adapter {
            Some(Adapter::Lora(lora)) => y = (y + lora.forward(&x2)?)?,
            Some(adapter @ (Adapter::Lokr(_) | Adapter::Loha(_))) => {
                y = (y + self.delta_forward_tracked(adapter, &x2)?)?;
            }
            Some(Adapter::Dora(_)) | None => {}
        }
        y.reshape(out_dims)
    }
}

/// The FP8 weight under `vb` from its codes and whichever scale key the checkpoint uses.
fn load_prequantized(vb: &Vb, codes: &Tensor) -> Result<Fp8Weight> {
    if vb.contains("comfy_quant") {
        check_comfy_quant(vb)?;
    }
    let scale = vb.weight_scale()?;
    Fp8Weight::from_checkpoint(codes, scale.as_ref())
        .map_err(|e| candle_core::Error::msg(format!("{e} (weight `{}`)", vb.path("weight"))))
}

/// ComfyUI's per-layer `comfy_quant` marker is JSON in a `U8` tensor; only `float8_e4m3fn` is read here.
fn check_comfy_quant(vb: &Vb) -> Result<()> {
    let bytes = vb
        .get_stored("comfy_quant")?
        .flatten_all()?
        .to_dtype(DType::U8)?
        .to_vec1::<u8>()?;
    let conf: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        candle_core::Error::msg(format!(
            "`{}` is not valid JSON: {e}",
            vb.path("comfy_quant")
        ))
    })?;
    match conf.get("format").and_then(|f| f.as_str()) {
        Some("float8_e4m3fn") => Ok(()),
        other => candle_core::bail!(
            "`{}` uses quantisation format {other:?}; only float8_e4m3fn is supported",
            vb.path("comfy_quant")
        ),
    }
}

/// `x [m, in] @ Wᵀ` with W captured (not an argument), so no gradient is ever formed for W.
struct FrozenMatmul {
    base: BaseWeight,
}

impl FrozenMatmul {
    fn bmnk(&self, layout: &Layout) -> Result<(usize, usize, usize, usize)> {
        let (m, k) = layout.shape().dims2()?;
        let (n, in_dim) = self.base.dims();
        if k != in_dim {
            candle_core::bail!(
                "frozen-matmul: input width {k} does not match the weight's {in_dim}"
            );
        }
        Ok((1, m, n, k))
    }
}

impl CustomOp1 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let bmnk = self.bmnk(layout)?;
        let wt = self.base.dense(storage.dtype())?.t()?;
        let (w_storage, w_layout) = wt.storage_and_layout();
        let Storage::Cpu(w) = &*w_storage else {
            candle_core::bail!("frozen-matmul: weight and input are on different devices")
        };
        let out = storage.matmul(w, bmnk, layout, w_layout)?;
        Ok((out, Shape::from((bmnk.1, bmnk.2))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let bmnk = self.bmnk(layout)?;
        if let BaseWeight::Fp8(w) = &self.base {
            let (_, m, n, k) = bmnk;
            let fp8 = crate::cuda::fp8_gemm::supported(storage.dtype(), m, n, k)
                && layout.is_contiguous();
            if w.fp8_products() && fp8 {
                let out = crate::cuda::fp8_gemm::fp8_linear_storage(
                    storage,
                    layout,
                    w.codes(),
                    w.scale(),
                )?;
                return Ok((out, Shape::from((m, n))));
            }
        }
        let wt = self.base.dense(storage.dtype())?.t()?;
        let (w_storage, w_layout) = wt.storage_and_layout();
        let Storage::Cuda(w) = &*w_storage else {
            candle_core::bail!("frozen-matmul: weight and input are on different devices")
        };
        let out = storage.matmul(w, bmnk, layout, w_layout)?;
        Ok((out, Shape::from((bmnk.1, bmnk.2))))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(self.base.input_grad(grad_res, None)?))
    }
}

mod grad;
mod kinds;
mod shared;
pub use grad::{add_matmul, add_matmul_bias, matmul_bias, InputGrad, LinearTape, ParamGrad};

#[cfg(test)]
mod tests;
