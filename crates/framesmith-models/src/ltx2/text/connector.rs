//! LTX-2's video text connector (ltx-core's `Embeddings1DConnector` as `EmbeddingsProcessor.create_embeddings`
//! runs it), with the checkpoint's names under `video_embeddings_connector`: each prompt's features reordered so
//! its tokens come first (the tokenizer pads on the left; the connector expects padding last), the padding
//! replaced by the learnable registers (`learnable_registers` [128, D], register `j mod 128` at position `j`), then
//! 1-D transformer blocks (`transformer_1d_blocks.N`: parameter-free RMSNorm → self-attention with RoPE over
//! positions 0..l and q / k RMSNorms, optionally gated → residual; RMSNorm → GELU-tanh feed-forward → residual)
//! over every position unmasked (the registers are attended to), and a final RMSNorm. The attention and the
//! feed-forward are the transformer's own ([`crate::ltx2::block`]), the RoPE its split table over one axis.

use candle_core::{DType, Device, Result, Tensor};

use super::config::{ConnectorConfig, CONNECTOR_REGISTERS, CONNECTOR_THETA};
use crate::ltx2::block::{Attention, FeedForward};
use crate::ltx2::config::Ltx2Config;
use crate::ltx2::rope::RopeTable;
use framesmith_nn::norm::rms_norm;
use framesmith_nn::vb::Vb;

/// The epsilon of the connector's RMSNorms.
const EPS: f64 = 1e-6;

/// `transformer_1d_blocks.N`.
struct Block1d {
    attn1: Attention,
    ff: FeedForward,
}

/// The video connector.
pub struct Connector {
    blocks: Vec<Block1d>,
    /// `learnable_registers` [128, D] in the compute dtype.
    registers: Tensor,
    /// The sizes as the transformer's attention and RoPE take them.
    cfg: Ltx2Config,
}

/// The connector's sizes as an [`Ltx2Config`] (the attention, feed-forward and RoPE read theirs from one).
fn as_transformer_config(c: &ConnectorConfig) -> Result<Ltx2Config> {
    let width = c.inner_dim();
    Ltx2Config::from_transformer_json(&serde_json::json!({
        "num_attention_heads": c.heads,
        "attention_head_dim": c.head_dim,
        "cross_attention_dim": width,
        "positional_embedding_theta": CONNECTOR_THETA,
        "positional_embedding_max_pos": c.max_pos,
        "apply_gated_attention": c.gated_attention,
        "norm_eps": EPS,
        "rope_type": c.rope_type,
        "frequencies_precision": c.frequencies_precision,
    }))
    .map_err(|e| candle_core::Error::Msg(format!("LTX-2 connector config: {e}")))
}

impl Connector {
    /// Reads the connector of `config` under `vb` (`video_embeddings_connector`).
    pub fn load(vb: &Vb, config: &ConnectorConfig) -> Result<Self> {
        let cfg = as_transformer_config(config)?;
        let width = config.inner_dim();
        let blocks = (0..config.layers)
            .map(|i| {
                let b = vb.pp("transformer_1d_blocks").pp(i);
                Ok(Block1d {
                    attn1: Attention::load(&b.pp("attn1"), &cfg, width)?,
                    ff: FeedForward::load(&b.pp("ff"), width)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            blocks,
            registers: vb.get((CONNECTOR_REGISTERS, width), "learnable_registers")?,
            cfg,
        })
    }

    /// The connector's width.
    pub fn width(&self) -> usize {
        self.cfg.inner_dim()
    }

    /// The connector's output [b, l, D] for `features` [b, l, D] and their `mask` [b, l] (non-zero: a token):
    /// each row's tokens first, in order, then the registers.
    pub fn forward(&self, features: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (b, l, width) = features.dims3()?;
        if width != self.width() || mask.dims() != [b, l] {
            candle_core::bail!(
                "LTX-2 connector: features {:?} with mask {:?}, expected [b, l, {}] and [b, l]",
                features.dims(),
                mask.dims(),
                self.width()
            );
        }
        if l % CONNECTOR_REGISTERS != 0 {
            candle_core::bail!(
                "LTX-2 connector: {l} tokens is not a multiple of its {CONNECTOR_REGISTERS} registers"
            );
        }
        let device = features.device();
        let dtype = features.dtype();
        let registers = self
            .registers
            .to_dtype(dtype)?
            .repeat((l / CONNECTOR_REGISTERS, 1))?;
        let keep = mask
            .to_device(&Device::Cpu)?
            .to_dtype(DType::F32)?
            .to_vec2::<f32>()?;
        let rows = keep
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let order: Vec<u32> = (0..l as u32)
                    .filter(|&j| row[j as usize] != 0.0)
                    .chain((0..l as u32).filter(|&j| row[j as usize] == 0.0))
                    .collect();
                let tokens = order
                    .iter()
                    .take_while(|&&j| row[j as usize] != 0.0)
                    .count();
                let sorted = features
                    .get(i)?
                    .index_select(&Tensor::new(order, device)?, 0)?;
                let tail = registers.narrow(0, tokens, l - tokens)?;
                Tensor::cat(&[&sorted.narrow(0, 0, tokens)?, &tail], 0)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut xs = Tensor::stack(&rows, 0)?;
        let positions = Tensor::arange(0f32, l as f32, device)?
            .reshape((1, 1, l, 1))?
            .repeat((b, 1, 1, 2))?;
        let rope = RopeTable::new(&positions, &self.cfg, dtype, device)?;
        for block in &self.blocks {
            let h = rms_norm(&xs, None, EPS)?;
            xs = (&xs + block.attn1.forward(&h, &h, Some((&rope, &rope)), None)?)?;
            let h = rms_norm(&xs, None, EPS)?;
            xs = (&xs + block.ff.forward(&h)?)?;
        }
        rms_norm(&xs, None, EPS)
    }
}
