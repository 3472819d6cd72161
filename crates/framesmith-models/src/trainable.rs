//! What the engine's checkpointed training step needs from a model, whatever its family: the work before the
//! blocks (embeddings), the blocks as units (forward with and without a tape, recompute, hand-written backward),
//! and the work after them (the head). Wan implements it; a second family adds an implementation, not a branch
//! in the step.

use std::borrow::Cow;

use candle_core::{Device, Result, Tensor};

use framesmith_nn::linear::Linear;
pub use framesmith_nn::linear::ParamGrad;
use framesmith_nn::lora::{attach_family_loras, LoraError, LoraFamily, LoraSet, LoraSpec};

/// What a block's backward returns.
pub struct BlockGrads {
    /// Gradient of the block input, in its dtype (the residual dtype).
    pub input: Tensor,
    /// Gradients of the block's trainable tensors (two LoRA factors per adapted linear).
    pub params: Vec<ParamGrad>,
}

/// One block of a model, as the checkpointed step drives it.
pub trait TrainableBlock {
    /// What every block of one forward pass shares (time modulation, text context, RoPE tables, …).
    type Shared;
    /// What a forward without a graph can keep for the recompute (e.g. the self-attention output and LSE); it
    /// waits where the saved block inputs do.
    type Kept: framesmith_nn::offload::Stashable;
    /// Every intermediate the hand-written backward needs.
    type Tape;

    /// The forward with gradient tracking (candle's autograd).
    fn forward(&self, xs: &Tensor, shared: &Self::Shared) -> Result<Tensor>;
    /// The forward without an autograd graph, with what the recompute may reuse; `keep_projection` asks for
    /// the self-attention's projected output too, where the model has one to keep (Wan's `self_attn.o`; a model
    /// without one ignores it).
    fn forward_untracked(
        &self,
        xs: &Tensor,
        shared: &Self::Shared,
        keep_projection: bool,
    ) -> Result<(Tensor, Self::Kept)>;
    /// The forward under per-block checkpointing (nothing but the block's input is kept for it by default): its
    /// output, and what the block keeps beside its saved input for the recompute, small values only (never the
    /// attention): e.g. the keys and values of a short text context, which the recompute would otherwise project
    /// again. The default keeps nothing (`None`, and the recompute gets `None`). A block type keeps a value at
    /// every block of a pass or at none.
    fn forward_checkpointed(
        &self,
        xs: &Tensor,
        shared: &Self::Shared,
    ) -> Result<(Tensor, Option<Self::Kept>)> {
        Ok((self.forward_untracked(xs, shared, false)?.0, None))
    }
    /// The forward keeping its whole tape (no recompute needed before the backward).
    fn forward_with_tape(&self, xs: &Tensor, shared: &Self::Shared)
        -> Result<(Tensor, Self::Tape)>;
    /// The block run again from its saved input, recording the tape; `kept` skips what it holds.
    fn recompute(
        &self,
        xs: &Tensor,
        shared: &Self::Shared,
        kept: Option<&Self::Kept>,
    ) -> Result<Self::Tape>;
    /// The hand-written backward of the output gradient `grad` through a recorded tape.
    fn backward(&self, tape: Self::Tape, grad: &Tensor) -> Result<BlockGrads>;
}

/// The embeddings' results for one batch: the first block's input, what the blocks share, and what the head
/// needs after them.
pub trait PreparedBatch: Sized {
    /// What every block shares.
    type Shared;
    /// The first block's input [b, tokens, dim] in the residual dtype.
    fn block_input(&self) -> &Tensor;
    /// What every block shares, as the blocks take it.
    fn shared(&self) -> &Self::Shared;
    /// A copy cut from the autograd graph of the embeddings (the checkpointed step runs blocks and head on
    /// detached inputs and back-propagates into the embeddings separately).
    fn detached(&self) -> Self;
}

/// A model trained block by block: embeddings, blocks (resident or streamed), head.
pub trait TrainableModel {
    /// One batch's inputs (noisy latents, timesteps, conditioning).
    type Inputs;
    /// The embeddings' results.
    type Prepared: PreparedBatch<Shared = <Self::Block as TrainableBlock>::Shared>;
    /// One block.
    type Block: TrainableBlock + Clone;

    /// Runs the embeddings.
    fn prepare(&self, inputs: &Self::Inputs) -> Result<Self::Prepared>;
    /// The number of blocks.
    fn num_blocks(&self) -> usize;
    /// Tells block streaming the order the blocks will be asked for in (`cyclic`: the order repeats).
    fn begin_blocks(&self, order: &[usize], cyclic: bool) -> Result<()>;
    /// Block `i`, with its frozen tensors on the device (a streamed block's arrive through its GPU slot).
    fn block(&self, i: usize) -> Result<Cow<'_, Self::Block>>;
    /// Runs the head on the last block's output: one prediction per sample.
    fn finish(&self, xs: &Tensor, prepared: &Self::Prepared) -> Result<Vec<Tensor>>;
    /// The device the model computes on.
    fn device(&self) -> &Device;
    /// The inputs' latents, whose gradients a caller may ask for.
    fn latents<'a>(&self, inputs: &'a Self::Inputs) -> &'a [Tensor];
    /// How the family names its LoRA targets (block lists, default excludes, file keys).
    const LORA_FAMILY: LoraFamily;
    /// Every linear a LoRA may adapt, by module path (`blocks.0.self_attn.q`, `double_blocks.0.img_attn.qkv`).
    fn lora_linears(&mut self) -> Vec<(String, &mut Linear)>;
}

/// Attaches fresh LoRAs to the linears of `model` that `spec` targets, named as its family names them.
pub fn attach_model_loras<M: TrainableModel>(
    model: &mut M,
    spec: &LoraSpec,
) -> std::result::Result<LoraSet, LoraError> {
    attach_family_loras(model.lora_linears(), spec, M::LORA_FAMILY)
}

/// What every family's tests of its hand-written block backward share: random LoRAs on every block linear, and
/// each block checked both ways against candle's autograd.
#[cfg(test)]
pub(crate) mod testing {
    use std::collections::HashMap;

    use candle_core::{DType, Device, Tensor, TensorId, Var};
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::{BlockGrads, PreparedBatch, TrainableBlock, TrainableModel};
    use framesmith_nn::attention::KeptBlock;
    use framesmith_nn::init::randn;
    use framesmith_nn::lora::Lora;
    use framesmith_nn::testing::rel;

    /// LoRAs (rank 4, random non-zero `up`, multiplier 0.7, the same for the same model) on every linear `model`
    /// trains; returns their factors.
    pub(crate) fn random_loras<M: TrainableModel>(model: &mut M) -> anyhow::Result<Vec<Var>> {
        random_loras_on(model, &|_| true)
    }

    /// The gradients of `(head(last block output) · probe).sum()` as the checkpointed step finds them: every block
    /// of `model` run untracked on the detached embeddings of `inputs`, the head back-propagated by autograd, each
    /// block recomputed from its saved input and back-propagated by hand, and the embeddings by autograd again.
    /// Returns every LoRA gradient and the gradients of those of `input_vars` (tensors of `inputs`) that get one, by
    /// tensor id.
    pub(crate) fn checkpointed_grads<M: TrainableModel>(
        model: &M,
        inputs: &M::Inputs,
        head: impl Fn(&Tensor, &M::Prepared) -> anyhow::Result<Tensor>,
        probe: &Tensor,
        input_vars: &[&Tensor],
    ) -> anyhow::Result<HashMap<TensorId, Tensor>> {
        let prepared = model.prepare(inputs)?;
        let detached = prepared.detached();
        let mut saved = Vec::new();
        let mut xs = detached.block_input().clone();
        for i in 0..model.num_blocks() {
            let block = model.block(i)?;
            let (out, _) = block.forward_untracked(&xs, detached.shared(), false)?;
            saved.push(std::mem::replace(&mut xs, out));
        }
        let last = Var::from_tensor(&xs)?;
        let out = head(last.as_tensor(), &detached)?;
        let head_grads = (&out * probe)?.sum_all()?.backward()?;
        let mut grad = head_grads
            .get(last.as_tensor())
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no gradient of the last block's output"))?;
        let mut found = HashMap::new();
        for (i, input) in saved.iter().enumerate().rev() {
            let block = model.block(i)?;
            let tape = block.recompute(input, detached.shared(), None)?;
            let grads = TrainableBlock::backward(block.as_ref(), tape, &grad)?;
            for p in grads.params {
                found.insert(p.var.as_tensor().id(), p.grad);
            }
            grad = grads.input;
        }
        let embedding_grads = (prepared.block_input() * &grad)?.sum_all()?.backward()?;
        for var in input_vars {
            if let Some(g) = embedding_grads.get(var) {
                found.insert(var.id(), g.clone());
            }
        }
        Ok(found)
    }

    /// [`random_loras`] on the linears whose names `keep` takes only (the others without an adapter).
    pub(crate) fn random_loras_on<M: TrainableModel>(
        model: &mut M,
        keep: &dyn Fn(&str) -> bool,
    ) -> anyhow::Result<Vec<Var>> {
        let mut vars = Vec::new();
        let rng = &mut StdRng::seed_from_u64(11);
        for (_, linear) in model.lora_linears().into_iter().filter(|(n, _)| keep(n)) {
            let dims = [linear.in_dim(), linear.out_dim(), 4];
            let mut lora = Lora::new(dims, 8.0, DType::F32, &Device::Cpu, rng)?;
            lora.up
                .set(&randn(rng, lora.up.shape(), 0.0, 0.1, &Device::Cpu)?)?;
            lora.multiplier = 0.7;
            vars.extend([lora.down.clone(), lora.up.clone()]);
            linear.set_lora(Some(lora));
        }
        Ok(vars)
    }

    /// Every block of `model` for `inputs` both ways: the untracked forward's output, and the hand-written
    /// backward's input gradient and every LoRA gradient (of `vars`, which must all get one) against candle's
    /// autograd; the same gradients after recomputes that reuse the kept attention, what the block keeps under
    /// per-block checkpointing, and the kept gated branches' outputs (`kept_outputs(i)` of them for block `i`).
    pub(crate) fn check_blocks<M>(
        model: &M,
        inputs: &M::Inputs,
        vars: &[Var],
        kept_outputs: &dyn Fn(usize) -> usize,
    ) -> anyhow::Result<()>
    where
        M: TrainableModel,
        <M::Block as TrainableBlock>::Kept: KeptOutputs,
    {
        let prepared = model.prepare(inputs)?.detached();
        let shared = prepared.shared();
        let rng = &mut StdRng::seed_from_u64(5);
        let mut xs = prepared.block_input().clone();
        let mut checked = 0;
        for i in 0..model.num_blocks() {
            let block = model.block(i)?;
            let block = &*block;
            let grad = randn(rng, xs.shape(), 0.0, 1.0, xs.device())?;
            let x = Var::from_tensor(&xs)?;
            let out_ref = TrainableBlock::forward(block, x.as_tensor(), shared)?;
            let store = (&out_ref * &grad)?.sum_all()?.backward()?;
            let (out, kept) = block.forward_untracked(&xs, shared, false)?;
            assert!(
                !out.track_op(),
                "block {i}: the untracked forward built a graph"
            );
            assert!(rel(&out, &out_ref)? <= 1e-6, "block {i} output");
            // The hand-written backward after a recompute that reuses `kept` (nothing with `None`).
            let backward_with = |kept: Option<&<M::Block as TrainableBlock>::Kept>| {
                TrainableBlock::backward(block, block.recompute(&xs, shared, kept)?, &grad)
            };
            let grads = backward_with(None)?;
            let want = store
                .get(x.as_tensor())
                .ok_or_else(|| anyhow::anyhow!("no input gradient"))?;
            let r = rel(&grads.input, want)?;
            eprintln!(
                "block {i}: input gradient rel {r:.2e}, {} LoRA factors",
                grads.params.len()
            );
            assert!(r <= 1e-5, "block {i} input gradient: rel {r}");
            for p in &grads.params {
                let want = store
                    .get(p.var.as_tensor())
                    .ok_or_else(|| anyhow::anyhow!("no LoRA gradient"))?;
                let r = rel(&p.grad, want)?;
                assert!(r <= 1e-5, "block {i}: LoRA gradient rel {r}");
                checked += 1;
            }
            // Selective checkpointing: the recompute that reuses the kept attention gives the same gradients.
            same_grads(
                i,
                &backward_with(Some(&kept))?,
                &grads,
                (0.0, "kept attention"),
            )?;
            // Per-block checkpointing: what the block keeps beside its input (if anything) changes nothing either.
            let (out_checkpointed, beside_input) = block.forward_checkpointed(&xs, shared)?;
            assert_eq!(
                rel(&out_checkpointed, &out)?,
                0.0,
                "block {i}: the checkpointed forward changed the output"
            );
            if let Some(beside_input) = &beside_input {
                same_grads(
                    i,
                    &backward_with(Some(beside_input))?,
                    &grads,
                    (0.0, "kept beside the input"),
                )?;
            }
            // And with the gated branches' outputs kept too (`checkpointing = "attention_projection"`).
            assert_eq!(kept.output_count(), 0);
            let (out_kept, with_outputs) = block.forward_untracked(&xs, shared, true)?;
            assert_eq!(with_outputs.output_count(), kept_outputs(i), "block {i}");
            assert_eq!(
                rel(&out_kept, &out)?,
                0.0,
                "block {i}: keeping changed the output"
            );
            let ours = backward_with(Some(&with_outputs))?;
            same_grads(i, &ours, &grads, (1e-7, "kept projections"))?;
            xs = out;
        }
        assert_eq!(checked, vars.len(), "every LoRA factor got a gradient");
        Ok(())
    }

    /// How many branch outputs a block's kept value holds (the shared checks read no more of it).
    pub(crate) trait KeptOutputs {
        fn output_count(&self) -> usize;
    }

    impl KeptOutputs for KeptBlock {
        fn output_count(&self) -> usize {
            self.outputs().len()
        }
    }

    /// Block `i`'s gradients after a recompute that reused kept values (`what`) against the plain recompute's,
    /// within `tol`.
    fn same_grads(
        i: usize,
        ours: &BlockGrads,
        plain: &BlockGrads,
        (tol, what): (f64, &str),
    ) -> anyhow::Result<()> {
        let r = rel(&ours.input, &plain.input)?;
        assert!(r <= tol, "block {i}: {what}: input gradient rel {r}");
        assert_eq!(ours.params.len(), plain.params.len());
        for (a, b) in ours.params.iter().zip(&plain.params) {
            assert_eq!(a.var.as_tensor().id(), b.var.as_tensor().id());
            let r = rel(&a.grad, &b.grad)?;
            assert!(r <= tol, "block {i}: {what}: LoRA gradient rel {r}");
        }
        Ok(())
    }
}
