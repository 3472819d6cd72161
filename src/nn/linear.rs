//! `Linear`: one linear layer for every base-weight format, frozen, with an optional trainable LoRA.
//! The base matmul runs as a custom op whose backward yields only the input gradient: candle's own matmul
//! backward would compute (and keep) a weight-sized gradient for the frozen base.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Storage, Tensor, D};

use super::lora::Lora;
use super::vb::Vb;

/// A frozen linear layer `y = x Wᵀ + b` with an optional LoRA `y += up(down(x)) · alpha / rank · multiplier`.
#[derive(Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    lora: Option<Lora>,
}

impl Linear {
    /// Reads `weight` [out, in] and, when present, `bias` [out] under `vb`.
    pub fn load(vb: &Vb, in_dim: usize, out_dim: usize) -> Result<Self> {
        let weight = vb.get((out_dim, in_dim), "weight")?;
        let bias = if vb.contains("bias") {
            Some(vb.get(out_dim, "bias")?)
        } else {
            None
        };
        Ok(Self {
            weight,
            bias,
            lora: None,
        })
    }

    /// A layer from a dense weight [out, in] and optional bias [out].
    pub fn from_weights(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self {
            weight,
            bias,
            lora: None,
        }
    }

    /// Input width.
    pub fn in_dim(&self) -> usize {
        self.weight.dims()[1]
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        self.weight.dims()[0]
    }

    /// The LoRA attached to this layer, if any.
    pub fn lora(&self) -> Option<&Lora> {
        self.lora.as_ref()
    }

    /// Attaches (or removes) a LoRA.
    pub fn set_lora(&mut self, lora: Option<Lora>) {
        self.lora = lora;
    }

    /// Applies the layer to `xs` [..., in].
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let mut out_dims = xs.dims().to_vec();
        if let Some(last) = out_dims.last_mut() {
            *last = self.out_dim();
        }
        let x2 = xs.flatten_to(D::Minus2)?.contiguous()?;
        let mut y = x2.apply_op1_arc(std::sync::Arc::new(Box::new(FrozenMatmul {
            weight: self.weight.clone(),
        })))?;
        if let Some(b) = &self.bias {
            y = y.broadcast_add(b)?;
        }
        if let Some(lora) = &self.lora {
            y = (y + lora.forward(&x2)?)?;
        }
        y.reshape(out_dims)
    }
}

/// `x [m, in] @ Wᵀ` with W captured (not an argument), so no gradient is ever formed for W.
struct FrozenMatmul {
    weight: Tensor,
}

impl FrozenMatmul {
    fn bmnk(&self, layout: &Layout) -> Result<(usize, usize, usize, usize)> {
        let (m, k) = layout.shape().dims2()?;
        let n = self.weight.dims()[0];
        Ok((1, m, n, k))
    }
}

impl CustomOp1 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let bmnk = self.bmnk(layout)?;
        let wt = self.weight.t()?;
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
        let wt = self.weight.t()?;
        let (w_storage, w_layout) = wt.storage_and_layout();
        let Storage::Cuda(w) = &*w_storage else {
            candle_core::bail!("frozen-matmul: weight and input are on different devices")
        };
        let out = storage.matmul(w, bmnk, layout, w_layout)?;
        Ok((out, Shape::from((bmnk.1, bmnk.2))))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad_res.matmul(&self.weight)?))
    }
}
