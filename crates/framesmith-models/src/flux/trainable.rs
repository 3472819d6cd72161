//! FLUX.1 as the engine trains it: [`TrainableModel`] for [`Flux`] and [`TrainableBlock`] for [`FluxBlock`] — the
//! double- and single-stream blocks as one list of units on the joint [text; image] sequence, each with a
//! hand-written backward. With selective checkpointing a block keeps its attention (and, optionally, its gated
//! branches' outputs) for the recompute ([`KeptBlock`]); streamed blocks arrive through their kind's GPU slots
//! ([`Flux::block`]).

use std::borrow::Cow;

use candle_core::{Device, Result, Tensor};

use super::block::{BlockInputs, FluxBlock};
use super::double_block::grad::DoubleTape;
use super::rope::Rope;
use super::single_block::grad::SingleTape;
use super::transformer::{Flux, FluxInputs, Prepared};
use crate::trainable::{BlockGrads, PreparedBatch, TrainableBlock, TrainableModel};
use framesmith_nn::attention::KeptBlock;

/// The tape of either block kind.
pub enum FluxTape {
    Double(Box<DoubleTape>),
    Single(Box<SingleTape>),
}

impl FluxTape {
    /// What a recompute may reuse: the attention output and LSE, and with `projections` the outputs of the
    /// products that feed the gated residuals (a double-stream block's `proj` and `mlp.2`, image stream then
    /// text, `[b, tokens, dim]` each; a single-stream block's `linear2`).
    pub fn kept(&self, projections: bool) -> KeptBlock {
        let outputs: &[&Tensor] = match (self, projections) {
            (_, false) => &[],
            (Self::Double(t), true) => &t.projections(),
            (Self::Single(t), true) => &[t.projection()],
        };
        let outputs = outputs.iter().map(|&t| t.clone()).collect();
        let attention = match self {
            Self::Double(t) => t.attention().kept(),
            Self::Single(t) => t.attention().kept(),
        };
        KeptBlock::new(attention, outputs)
    }
}

impl FluxBlock {
    /// The forward without a graph, keeping its tape; `kept`: this block's values from an earlier pass on the
    /// same input, whose attention (and kept products) are then not run again.
    pub fn forward_with_tape(
        &self,
        xs: &Tensor,
        shared: &BlockInputs,
        kept: Option<&KeptBlock>,
    ) -> Result<(Tensor, FluxTape)> {
        let attention = kept.map(KeptBlock::attention);
        let outputs = kept.map_or(&[][..], KeptBlock::outputs);
        Ok(match self {
            Self::Double(b) => {
                let kept_out = match outputs {
                    [] => None,
                    [a, b, c, d] => Some([a, b, c, d]),
                    other => candle_core::bail!(
                        "a double-stream block keeps 4 branch outputs, not {}",
                        other.len()
                    ),
                };
                let (out, tape) = b.forward_with_tape(xs, shared, attention, kept_out)?;
                (out, FluxTape::Double(Box::new(tape)))
            }
            Self::Single(b) => {
                let kept_out = match outputs {
                    [] => None,
                    [a] => Some(a),
                    other => candle_core::bail!(
                        "a single-stream block keeps 1 branch output, not {}",
                        other.len()
                    ),
                };
                let (out, tape) = b.forward_with_tape(xs, shared, attention, kept_out)?;
                (out, FluxTape::Single(Box::new(tape)))
            }
        })
    }

    /// The hand-written backward through a tape of this block.
    pub fn backward(&self, tape: FluxTape, grad: &Tensor) -> Result<BlockGrads> {
        match (self, tape) {
            (Self::Double(b), FluxTape::Double(t)) => b.backward(*t, grad),
            (Self::Single(b), FluxTape::Single(t)) => b.backward(*t, grad),
            _ => candle_core::bail!("FLUX block backward: the tape is of the other block kind"),
        }
    }
}

impl TrainableBlock for FluxBlock {
    type Shared = BlockInputs;
    type Kept = KeptBlock;
    type Tape = FluxTape;

    fn forward(&self, xs: &Tensor, shared: &BlockInputs) -> Result<Tensor> {
        FluxBlock::forward(self, xs, shared)
    }

    fn forward_untracked(
        &self,
        xs: &Tensor,
        shared: &BlockInputs,
        keep_projection: bool,
    ) -> Result<(Tensor, KeptBlock)> {
        let (out, tape) = FluxBlock::forward_with_tape(self, xs, shared, None)?;
        Ok((out, tape.kept(keep_projection)))
    }

    fn forward_with_tape(&self, xs: &Tensor, shared: &BlockInputs) -> Result<(Tensor, FluxTape)> {
        FluxBlock::forward_with_tape(self, xs, shared, None)
    }

    fn recompute(
        &self,
        xs: &Tensor,
        shared: &BlockInputs,
        kept: Option<&KeptBlock>,
    ) -> Result<FluxTape> {
        Ok(FluxBlock::forward_with_tape(self, xs, shared, kept)?.1)
    }

    fn backward(&self, tape: FluxTape, grad: &Tensor) -> Result<BlockGrads> {
        FluxBlock::backward(self, tape, grad)
    }
}

impl PreparedBatch for Prepared {
    type Shared = BlockInputs;

    fn block_input(&self) -> &Tensor {
        &self.xs
    }

    fn shared(&self) -> &BlockInputs {
        &self.blocks
    }

    fn detached(&self) -> Self {
        let b = &self.blocks;
        Prepared {
            xs: self.xs.detach(),
            blocks: BlockInputs {
                vec: b.vec.detach(),
                rope: Rope {
                    cos: b.rope.cos.detach(),
                    sin: b.rope.sin.detach(),
                },
                txt_len: b.txt_len,
            },
            target_len: self.target_len,
        }
    }
}

impl TrainableModel for Flux {
    type Inputs = FluxInputs;
    type Prepared = Prepared;
    type Block = FluxBlock;
    const LORA_FAMILY: framesmith_nn::lora::LoraFamily = framesmith_nn::lora::LoraFamily::Flux;

    fn lora_linears(&mut self) -> Vec<(String, &mut framesmith_nn::linear::Linear)> {
        Flux::linears_mut(self)
    }

    fn prepare(&self, inputs: &FluxInputs) -> Result<Prepared> {
        Flux::prepare(self, inputs)
    }

    fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    fn begin_blocks(&self, order: &[usize], cyclic: bool) -> Result<()> {
        Flux::begin_blocks(self, order, cyclic)
    }

    fn block(&self, i: usize) -> Result<Cow<'_, FluxBlock>> {
        Flux::block(self, i)
    }

    /// The prediction for the image being denoised only: Kontext's conditioning tokens are input, never target.
    fn finish(&self, xs: &Tensor, prepared: &Prepared) -> Result<Vec<Tensor>> {
        let out = Flux::finish(self, xs, prepared)?.narrow(1, 0, prepared.target_len)?;
        (0..out.dim(0)?).map(|i| out.get(i)).collect()
    }

    fn device(&self) -> &Device {
        self.img_in.base().device()
    }

    fn latents<'a>(&self, inputs: &'a FluxInputs) -> &'a [Tensor] {
        std::slice::from_ref(&inputs.img)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flux::testkit::Case;
    use crate::flux::FluxConfig;
    use crate::trainable::testing::{check_blocks, random_loras};
    use candle_core::{DType, Var};
    use framesmith_nn::adapter::AdapterKind;
    use framesmith_nn::testing::attach_random_adapters;
    use framesmith_nn::vb::Vb;

    /// The fixture's model with LoRAs (random, non-zero `up`, multiplier ≠ 1) on every block linear.
    fn model_with_loras(case: &Case) -> anyhow::Result<(Flux, Vec<Var>)> {
        let cfg = FluxConfig::from_json(&case.config["init"].to_string())?;
        let vb = Vb::from_tensors(case.weights.clone(), DType::F32, &Device::Cpu);
        let mut model = Flux::new(&cfg, &vb)?;
        let vars = random_loras(&mut model)?;
        Ok((model, vars))
    }

    /// Every block both ways: output, input gradient and every LoRA gradient against candle's autograd.
    fn check(case_name: &str) -> anyhow::Result<()> {
        let case = Case::load(case_name)?;
        let (model, vars) = model_with_loras(&case)?;
        check_model(&case, &model, &vars)
    }

    /// [`check`] for the fixture's model with `vars` attached: a double-stream block keeps four gated branches'
    /// outputs, a single-stream one its `linear2`'s.
    fn check_model(case: &Case, model: &Flux, vars: &[Var]) -> anyhow::Result<()> {
        let inputs = FluxInputs {
            img: case.input("img")?.clone(),
            img_ids: case.input("img_ids")?.clone(),
            txt: case.input("txt")?.clone(),
            txt_ids: case.input("txt_ids")?.clone(),
            timesteps: case.input("timesteps")?.clone(),
            y: case.input("y")?.clone(),
            guidance: case.inputs.get("guidance").cloned(),
        };
        let depth = model.config().depth;
        check_blocks(model, &inputs, vars, &|i| if i < depth { 4 } else { 1 })
    }

    #[test]
    fn hand_written_backward_matches_autograd_dev() -> anyhow::Result<()> {
        check("flux_dit")
    }

    /// LoKr, LoHa and DoRA through every block: the same checks as plain LoRA's.
    #[test]
    fn every_adapter_kind_matches_autograd() -> anyhow::Result<()> {
        let case = Case::load("flux_dit")?;
        let cfg = FluxConfig::from_json(&case.config["init"].to_string())?;
        let kinds = [
            AdapterKind::Lokr {
                factor: -1,
                decompose_both: false,
                full_matrix: false,
            },
            AdapterKind::Loha,
            AdapterKind::Dora,
        ];
        for kind in kinds {
            let vb = Vb::from_tensors(case.weights.clone(), DType::F32, &Device::Cpu);
            let mut model = Flux::new(&cfg, &vb)?;
            let vars = attach_random_adapters(model.linears_mut(), kind, 11)?;
            eprintln!("{kind:?}");
            check_model(&case, &model, &vars)?;
        }
        Ok(())
    }

    #[test]
    fn hand_written_backward_matches_autograd_kontext() -> anyhow::Result<()> {
        check("flux_dit_kontext")
    }
}
