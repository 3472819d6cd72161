//! Gemma 3's language model as a text encoder (`Gemma3TextModel` of transformers): the token embedding scaled by
//! `√hidden` (the scale rounded to the compute dtype, as transformers keeps it), the decoder layers and the final
//! norm, under the checkpoint's names (`embed_tokens.weight`, `layers.{i}.…`, `norm.weight`; the loader strips
//! `language_model.model.` / `model.language_model.` / `model.`). [`Gemma3Text::hidden_states`] gives every hidden
//! state of the official model (`output_hidden_states=True`): the embedding, each layer's output, the last one
//! after the final norm.
//!
//! Layers are resident on the compute device, or kept in host memory and moved onto it one at a time
//! ([`LayerPlacement::Streamed`]) so that the 12B encoder runs on a card that cannot hold it; the token embedding
//! stays in host memory either way.

use candle_core::{DType, Device, Result, Tensor};

use super::config::{Gemma3TextConfig, LayerType};
use super::layer::{attention_bias, rope, DecoderLayer, GemmaRmsNorm};
pub use crate::qwen25vl::LayerPlacement;
use framesmith_nn::vb::Vb;

/// The language model. Frozen: inference only.
pub struct Gemma3Text {
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: GemmaRmsNorm,
    cfg: Gemma3TextConfig,
    placement: LayerPlacement,
    dtype: DType,
    device: Device,
}

impl Gemma3Text {
    /// Builds the model from `vb` (names without a prefix) on `vb.device()`; streamed layers are built in host
    /// memory instead, and the token embedding always is (a lookup of a prompt's rows; 12B's is 2 GB in bf16).
    pub fn new(cfg: &Gemma3TextConfig, vb: &Vb, placement: LayerPlacement) -> Result<Self> {
        if let Err(e) = cfg.validate() {
            candle_core::bail!("{e}");
        }
        let host = match placement {
            LayerPlacement::Resident => vb.clone(),
            LayerPlacement::Streamed => vb.with_device(&Device::Cpu),
        };
        let layers = cfg
            .layer_types
            .iter()
            .enumerate()
            .map(|(i, &kind)| DecoderLayer::new(cfg, &host.pp("layers").pp(i), kind))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            embed_tokens: vb
                .with_device(&Device::Cpu)
                .pp("embed_tokens")
                .get((cfg.vocab_size, cfg.hidden_size), "weight")?,
            layers,
            norm: GemmaRmsNorm::load(&vb.pp("norm"), cfg.hidden_size, cfg.rms_norm_eps)?,
            cfg: cfg.clone(),
            placement,
            dtype: vb.dtype(),
            device: vb.device().clone(),
        })
    }

    /// The model's sizes.
    pub fn config(&self) -> &Gemma3TextConfig {
        &self.cfg
    }

    /// The device the layers run on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The compute dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// How the layers are kept.
    pub fn placement(&self) -> LayerPlacement {
        self.placement
    }

    /// The scaled token embeddings [b, l, hidden] of `ids` [b, l] in the compute dtype on the compute device.
    pub fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, l) = ids.dims2()?;
        let flat = ids
            .flatten_all()?
            .to_dtype(DType::I64)?
            .to_device(&Device::Cpu)?;
        let ids_list = flat.to_vec1::<i64>()?;
        if let Some(bad) = ids_list
            .iter()
            .find(|&&i| i < 0 || i as usize >= self.cfg.vocab_size)
        {
            candle_core::bail!(
                "Gemma 3: token id {bad} out of range for the vocabulary of {}",
                self.cfg.vocab_size
            );
        }
        let rows = self
            .embed_tokens
            .index_select(&flat.to_device(self.embed_tokens.device())?, 0)?
            .reshape((b, l, self.cfg.hidden_size))?
            .to_device(&self.device)?
            .to_dtype(self.dtype)?;
        // transformers keeps `embed_scale` in the weights' dtype: √3840 is 62.0 in bf16.
        let scale = Tensor::new(&[(self.cfg.hidden_size as f64).sqrt()], &self.device)?
            .to_dtype(self.dtype)?;
        rows.broadcast_mul(&scale)
    }

    /// Every hidden state of the official model for `ids` [b, l] (integers) and `mask` [b, l] (non-zero: a
    /// token; padding on either side), `num_hidden_layers + 1` tensors [b, l, hidden] in the compute dtype: the
    /// scaled embedding, then each layer's output, the last after the final norm. Positions are 0..l for every
    /// row, as transformers gives them without `position_ids`.
    pub fn hidden_states(&self, ids: &Tensor, mask: &Tensor) -> Result<Vec<Tensor>> {
        let (b, l) = ids.dims2()?;
        if mask.dims() != [b, l] {
            candle_core::bail!(
                "Gemma 3: mask shape {:?} differs from ids shape {:?}",
                mask.dims(),
                ids.dims()
            );
        }
        if b * l == 0 {
            candle_core::bail!("Gemma 3: no token to encode");
        }
        let mut xs = self.embed(ids)?;
        let cpu_mask = mask.to_device(&Device::Cpu)?;
        let full_bias = attention_bias(&cpu_mask, None)?.to_device(&self.device)?;
        let sliding_bias =
            attention_bias(&cpu_mask, Some(self.cfg.sliding_window))?.to_device(&self.device)?;
        let tables = |kind| {
            rope(
                self.cfg.rope(kind),
                self.cfg.head_dim,
                l,
                self.dtype,
                &self.device,
            )
        };
        let (full_rope, sliding_rope) = (tables(LayerType::Full)?, tables(LayerType::Sliding)?);
        let mut states = Vec::with_capacity(self.layers.len() + 1);
        for layer in &self.layers {
            states.push(xs.clone());
            let (rope, bias) = match layer.kind {
                LayerType::Full => (&full_rope, &full_bias),
                LayerType::Sliding => (&sliding_rope, &sliding_bias),
            };
            xs = match self.placement {
                LayerPlacement::Resident => layer.forward(&xs, rope, bias)?,
                LayerPlacement::Streamed => {
                    layer.to_device(&self.device)?.forward(&xs, rope, bias)?
                }
            };
        }
        states.push(self.norm.forward(&xs)?);
        Ok(states)
    }
}
