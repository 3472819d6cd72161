//! The Qwen2.5-VL language model as a text encoder (`Qwen2_5_VLTextModel`): token embedding, decoder layers and
//! the final RMSNorm, under the checkpoint's names (`embed_tokens.weight`, `layers.{i}.…`, `norm.weight`; the
//! loaders strip `model.language_model.` / `model.`). [`Qwen25VlText::hidden_states`] gives
//! `hidden_states[-(skip + 1)]` of the official model for token ids and a mask.
//!
//! Layers are resident on the compute device, or kept in host memory and moved onto it one at a time
//! ([`LayerPlacement::Streamed`]) so that the 7B encoder runs on a card that cannot hold it.

use candle_core::{DType, Device, Result, Tensor};

use super::layer::{attention_bias, rope, rope_from_positions, DecoderLayer, Rope};
use super::Qwen25VlTextConfig;
use framesmith_nn::norm::rms_norm;
use framesmith_nn::vb::Vb;

/// Where the decoder layers live between uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LayerPlacement {
    /// On the compute device.
    #[default]
    Resident,
    /// In host memory (with the token embedding), each layer copied to the compute device for its forward and
    /// dropped after it.
    Streamed,
}

/// The language model. Frozen: inference only.
pub struct Qwen25VlText {
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: Tensor,
    cfg: Qwen25VlTextConfig,
    placement: LayerPlacement,
    device: Device,
}

impl Qwen25VlText {
    /// Builds the model from `vb` (names without a prefix) on `vb.device()`; streamed layers and the embedding
    /// are built in host memory instead.
    pub fn new(cfg: &Qwen25VlTextConfig, vb: &Vb, placement: LayerPlacement) -> Result<Self> {
        if let Err(e) = cfg.validate() {
            candle_core::bail!("{e}");
        }
        let host = match placement {
            LayerPlacement::Resident => vb.clone(),
            LayerPlacement::Streamed => vb.with_device(&Device::Cpu),
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::new(cfg, &host.pp("layers").pp(i)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            embed_tokens: host
                .pp("embed_tokens")
                .get((cfg.vocab_size, cfg.hidden_size), "weight")?,
            layers,
            norm: vb.pp("norm").get(cfg.hidden_size, "weight")?,
            cfg: cfg.clone(),
            placement,
            device: vb.device().clone(),
        })
    }

    /// The model's sizes.
    pub fn config(&self) -> &Qwen25VlTextConfig {
        &self.cfg
    }

    /// The device the layers run on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The compute dtype.
    pub fn dtype(&self) -> DType {
        self.norm.dtype()
    }

    /// `hidden_states[-(skip_last_layers + 1)]` of the official model for `ids` [b, l] (integers) and `mask`
    /// [b, l] (non-zero: a token; padding on either side), as [b, l, hidden] in the compute dtype on the compute
    /// device. `0`: the final RMSNorm's output (what Qwen-Image uses); `k > 0`: the output of layer `N - k`
    /// without the norm (HunyuanVideo 1.5 takes `k = 2`), and the last `k` layers are not run. Positions are
    /// 0..l for every row, as transformers gives text-only input; with right padding the tokens' states do not
    /// depend on the padding.
    pub fn hidden_states(
        &self,
        ids: &Tensor,
        mask: &Tensor,
        skip_last_layers: usize,
    ) -> Result<Tensor> {
        let (b, l) = ids.dims2()?;
        if mask.dims() != [b, l] {
            candle_core::bail!(
                "Qwen2.5-VL: mask shape {:?} differs from ids shape {:?}",
                mask.dims(),
                ids.dims()
            );
        }
        if b * l == 0 {
            return Tensor::zeros((b, l, self.cfg.hidden_size), self.dtype(), &self.device);
        }
        let xs = self.embed(ids)?;
        let rope = rope(&self.cfg, l, self.dtype(), &self.device)?;
        self.run(xs, mask, &rope, skip_last_layers)
    }

    /// The token embeddings [b, l, hidden] of `ids` [b, l] in the compute dtype on the compute device.
    pub fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, l) = ids.dims2()?;
        let flat = ids
            .flatten_all()?
            .to_dtype(DType::I64)?
            .to_device(&Device::Cpu)?;
        if b * l == 0 {
            return Tensor::zeros((b, l, self.cfg.hidden_size), self.dtype(), &self.device);
        }
        let (min, max) = (
            flat.min(0)?.to_scalar::<i64>()?,
            flat.max(0)?.to_scalar::<i64>()?,
        );
        if min < 0 || max as usize >= self.cfg.vocab_size {
            candle_core::bail!(
                "Qwen2.5-VL: token id out of range [{min}, {max}] for the vocabulary of {}",
                self.cfg.vocab_size
            );
        }
        self.embed_tokens
            .index_select(&flat.to_device(self.embed_tokens.device())?, 0)?
            .reshape((b, l, self.cfg.hidden_size))?
            .to_device(&self.device)?
            .to_dtype(self.dtype())
    }

    /// [`Self::hidden_states`] of input embeddings `xs` [b, l, hidden] (token embeddings with others spliced
    /// in) at multimodal positions: `positions[row]` holds each token's (time, height, width) positions
    /// (transformers' `get_rope_index`; padding's are ignored).
    pub fn hidden_states_at(
        &self,
        xs: &Tensor,
        mask: &Tensor,
        positions: &[[Vec<u32>; 3]],
        skip_last_layers: usize,
    ) -> Result<Tensor> {
        let l = xs.dim(1)?;
        let rope = rope_from_positions(&self.cfg, positions, l, self.dtype(), &self.device)?;
        let xs = xs.to_device(&self.device)?.to_dtype(self.dtype())?;
        self.run(xs, mask, &rope, skip_last_layers)
    }

    /// The decoder layers (all but the last `skip_last_layers`) and, without a skip, the final norm.
    fn run(
        &self,
        xs: Tensor,
        mask: &Tensor,
        rope: &Rope,
        skip_last_layers: usize,
    ) -> Result<Tensor> {
        let (b, l, _) = xs.dims3()?;
        if mask.dims() != [b, l] {
            candle_core::bail!(
                "Qwen2.5-VL: mask shape {:?} differs from the input's [{b}, {l}]",
                mask.dims()
            );
        }
        let n = self.layers.len();
        if skip_last_layers > n {
            candle_core::bail!("Qwen2.5-VL: cannot skip {skip_last_layers} of {n} layers");
        }
        let bias = attention_bias(&mask.to_device(&Device::Cpu)?, None)?.to_device(&self.device)?;
        let mut xs = xs;
        for layer in &self.layers[..n - skip_last_layers] {
            xs = match self.placement {
                LayerPlacement::Resident => layer.forward(&xs, rope, &bias)?,
                LayerPlacement::Streamed => {
                    layer.to_device(&self.device)?.forward(&xs, rope, &bias)?
                }
            };
        }
        if skip_last_layers == 0 {
            xs = rms_norm(&xs, Some(&self.norm), self.cfg.rms_norm_eps)?;
        }
        Ok(xs)
    }
}
