//! Every block's video modulation rows of a pass formed at once: the blocks' AdaLN tables stacked when the
//! transformer is read ([`BlockTables`]), and each pass's rows from them ([`PassRows`]), which the blocks then
//! take instead of forming their own in each forward and again in each recompute.

use candle_core::{DType, Result, Tensor};

use super::Modulation;
use crate::ltx2::config::Ltx2Config;
use framesmith_nn::vb::Vb;

/// Every block's `scale_shift_table` [blocks, k, dim] and `prompt_scale_shift_table` [blocks, 2, dim] (LTX-2.3),
/// stacked on the model's device (the tables of streamed blocks too: a few MiB in all).
pub struct BlockTables {
    pub video: Tensor,
    pub prompt: Option<Tensor>,
}

impl BlockTables {
    /// The tables of the `cfg.num_layers` blocks under `vb` (the model's root).
    pub fn load(vb: &Vb, cfg: &Ltx2Config) -> Result<Self> {
        let dim = cfg.inner_dim();
        let blocks = vb.pp("transformer_blocks");
        let stack = |name: &str, k: usize| -> Result<Tensor> {
            let tables = (0..cfg.num_layers)
                .map(|i| blocks.pp(i).get((k, dim), name))
                .collect::<Result<Vec<_>>>()?;
            Tensor::stack(&tables, 0)
        };
        Ok(Self {
            video: stack("scale_shift_table", cfg.adaln_coefficient())?,
            prompt: if cfg.cross_attention_adaln {
                Some(stack("prompt_scale_shift_table", 2)?)
            } else {
                None
            },
        })
    }
}

/// Every block's video modulation rows of one pass with per-sample timesteps, formed in one sum and one cast for
/// all blocks rather than in each block's forward and again in its recompute: the values
/// [`super::Ltx2Block::modulation`] forms from each block's tables.
#[derive(Clone)]
pub struct PassRows {
    /// [blocks, k, b, dim] f32: row j of block i is `rows[i, j]` [b, dim].
    rows: Tensor,
    /// [blocks, 2, b, dim] f32: the cross-attention context's shift and scale (LTX-2.3).
    context: Option<Tensor>,
}

impl PassRows {
    /// The rows of every block from the blocks' stacked `tables`, the AdaLN rows `timestep` [b, 1, k · dim] and
    /// the prompt AdaLN's [b, 1, 2 · dim]: each table added to its timestep rows in the compute dtype `dtype`,
    /// then held in f32, as [`super::Ltx2Block::modulation`] does block by block.
    pub fn new(
        tables: &BlockTables,
        (timestep, prompt_timestep): (&Tensor, Option<&Tensor>),
        b: usize,
        dtype: DType,
    ) -> Result<Self> {
        let sum = |tables: &Tensor, timestep: Option<&Tensor>| -> Result<Tensor> {
            let (blocks, k, dim) = tables.dims3()?;
            // [blocks, k, 1, dim] + [1, k, b, dim].
            let tables = tables.to_dtype(dtype)?.unsqueeze(2)?;
            let sum = match timestep {
                Some(t) => t
                    .to_dtype(dtype)?
                    .reshape((b, k, dim))?
                    .transpose(0, 1)?
                    .unsqueeze(0)?
                    .broadcast_add(&tables)?,
                None => tables.broadcast_as((blocks, k, b, dim))?,
            };
            sum.to_dtype(DType::F32)?.contiguous()
        };
        let context = match &tables.prompt {
            Some(p) => Some(sum(p, prompt_timestep)?),
            None => None,
        };
        Ok(Self {
            rows: sum(&tables.video, Some(timestep))?,
            context,
        })
    }

    /// Block `i`'s rows (`None` past the blocks these were formed for).
    pub(super) fn modulation(&self, i: usize) -> Result<Option<Modulation>> {
        if i >= self.rows.dim(0)? {
            return Ok(None);
        }
        let split = |all: &Tensor| -> Result<Vec<Tensor>> {
            let block = all.get(i)?;
            (0..block.dim(0)?)
                .map(|j| block.get(j)?.unsqueeze(1))
                .collect()
        };
        let context = match &self.context {
            Some(c) => match <[Tensor; 2]>::try_from(split(c)?) {
                Ok(rows) => Some(rows),
                Err(_) => candle_core::bail!("LTX-2: the context's modulation rows are two"),
            },
            None => None,
        };
        Ok(Some(Modulation {
            rows: split(&self.rows)?,
            context,
        }))
    }

    /// Without an autograd history.
    pub fn detach(&self) -> Self {
        Self {
            rows: self.rows.detach(),
            context: self.context.as_ref().map(Tensor::detach),
        }
    }
}
