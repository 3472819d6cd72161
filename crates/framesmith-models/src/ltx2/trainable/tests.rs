//! The LTX-2 blocks' hand-written backward against candle's autograd (both releases' fixtures, text-to-video and
//! joint audio-video, each with and without first-frame conditioning, random LoRAs on every block linear), the
//! loss views (the official masked loss), and the LoRA targets' names.

use super::super::block::grad::Ltx2Kept;
use super::super::testkit;
use crate::ltx2::{joint_loss_view, loss_views};
use crate::trainable::testing::{check_blocks, random_loras, random_loras_on, KeptOutputs};
use crate::trainable::{PreparedBatch, TrainableBlock, TrainableModel};
use framesmith_nn::offload::Stashable;

impl KeptOutputs for Ltx2Kept {
    fn output_count(&self) -> usize {
        0
    }
}

/// What a block keeps comes back from its tensors as it went in (the text keys and values, then the
/// self-attention when kept), as it does from host RAM; any other count is refused.
#[test]
fn kept_values_come_back_from_their_tensors() -> anyhow::Result<()> {
    let case = testkit::load("ltx23_t2v")?;
    let model = testkit::model(&case)?;
    let prepared = model.prepare(&testkit::inputs(&case)?)?.detached();
    let block = model.block(0)?;
    let (_, with_attention) =
        block.forward_untracked(prepared.block_input(), prepared.shared(), false)?;
    let (_, text_only) = block.forward_checkpointed(prepared.block_input(), prepared.shared())?;
    let text_only = text_only.ok_or_else(|| anyhow::anyhow!("nothing kept beside the input"))?;
    assert!(text_only.attention().is_none());
    for (kept, count) in [(with_attention, 4), (text_only, 2)] {
        let attention = kept.attention().is_some();
        let tensors = kept.into_tensors();
        assert_eq!(tensors.len(), count);
        let back = Ltx2Kept::from_tensors(tensors.clone())?;
        assert_eq!(back.attention().is_some(), attention);
        assert_eq!(back.into_tensors().len(), count);
        assert!(Ltx2Kept::from_tensors(tensors[..count - 1].to_vec()).is_err());
    }
    Ok(())
}

#[test]
fn block_backward_matches_autograd_for_both_releases() -> anyhow::Result<()> {
    let cases = [
        "ltx2_t2v",
        "ltx23_t2v",
        "ltx2_av",
        "ltx23_av",
        "ltx23_i2v",
        "ltx2_av_i2v",
    ];
    for name in cases {
        let case = testkit::load(name)?;
        let mut model = testkit::model(&case)?;
        let vars = random_loras(&mut model)?;
        check_blocks(&model, &testkit::inputs(&case)?, &vars, &|_| 0)?;
    }
    Ok(())
}

/// With LoRAs on the official trainer's targets only (the attentions' q, k, v and output), the linears without
/// an adapter (the feed-forward, the gates) still pass their input gradients on exactly.
#[test]
fn block_backward_matches_autograd_with_the_official_targets() -> anyhow::Result<()> {
    let targets = ["to_q", "to_k", "to_v", "to_out.0"];
    let official = |name: &str| targets.iter().any(|t| name.ends_with(&format!(".{t}")));
    for name in ["ltx23_t2v", "ltx2_t2v"] {
        let case = testkit::load(name)?;
        let mut model = testkit::model(&case)?;
        let vars = random_loras_on(&mut model, &official)?;
        check_blocks(&model, &testkit::inputs(&case)?, &vars, &|_| 0)?;
    }
    Ok(())
}

#[test]
fn lora_targets_are_the_video_linears_by_ltx_core_names() -> anyhow::Result<()> {
    let case = testkit::load("ltx23_t2v")?;
    let mut model = testkit::model(&case)?;
    let names: Vec<String> = model.lora_linears().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 2 * 12);
    for want in [
        "transformer_blocks.0.attn1.to_q",
        "transformer_blocks.0.attn1.to_out.0",
        "transformer_blocks.0.attn2.to_gate_logits",
        "transformer_blocks.1.ff.net.0.proj",
        "transformer_blocks.1.ff.net.2",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
    assert!(!names.iter().any(|n| n.contains("audio")));
    Ok(())
}

#[test]
fn joint_lora_targets_add_the_audio_stream_and_cross_attentions() -> anyhow::Result<()> {
    let case = testkit::load("ltx23_av")?;
    let mut model = testkit::model(&case)?;
    let names: Vec<String> = model.lora_linears().into_iter().map(|(n, _)| n).collect();
    // Per block: 12 video, 12 audio and 2 × 5 cross-attention linears (LTX-2.3's gates included).
    assert_eq!(names.len(), 2 * 34);
    for want in [
        "transformer_blocks.0.audio_attn1.to_q",
        "transformer_blocks.0.audio_attn2.to_gate_logits",
        "transformer_blocks.1.audio_ff.net.2",
        "transformer_blocks.0.audio_to_video_attn.to_k",
        "transformer_blocks.1.video_to_audio_attn.to_out.0",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing");
    }
    let known = crate::ltx2::lora_keys::modules();
    for name in &names {
        let module = name.splitn(3, '.').nth(2).unwrap_or_default();
        assert!(
            known.iter().any(|m| m == module),
            "{name} has no official key"
        );
    }
    Ok(())
}

#[test]
fn the_joint_loss_view_sums_both_streams_means() -> anyhow::Result<()> {
    let dev = candle_core::Device::Cpu;
    let (v, tv) = (
        candle_core::Tensor::randn(0f32, 1.0, (6, 4), &dev)?,
        candle_core::Tensor::randn(0f32, 1.0, (6, 4), &dev)?,
    );
    let (a, ta) = (
        candle_core::Tensor::randn(0f32, 1.0, (3, 2), &dev)?,
        candle_core::Tensor::randn(0f32, 1.0, (3, 2), &dev)?,
    );
    let mse = |x: &candle_core::Tensor, y: &candle_core::Tensor| -> anyhow::Result<f32> {
        Ok((x - y)?.sqr()?.mean_all()?.to_scalar::<f32>()?)
    };
    let joint = mse(&joint_loss_view(&v, &a)?, &joint_loss_view(&tv, &ta)?)?;
    let want = mse(&v, &tv)? + mse(&a, &ta)?;
    assert!((joint - want).abs() < 1e-5 * want, "{joint} vs {want}");
    Ok(())
}

/// The step's loss over views: one mean over every element of every view.
fn step_loss(outs: &[candle_core::Tensor], targets: &[candle_core::Tensor]) -> anyhow::Result<f64> {
    let mut sum = 0f64;
    let mut count = 0usize;
    for (o, t) in outs.iter().zip(targets) {
        sum += f64::from((o - t)?.sqr()?.sum_all()?.to_scalar::<f32>()?);
        count += o.elem_count();
    }
    Ok(sum / count as f64)
}

#[test]
fn loss_views_give_the_official_masked_loss() -> anyhow::Result<()> {
    // ltx-trainer's `compute_loss`: per sample the mean over the tokens its loss mask keeps (plus the audio mean
    // in a joint pass), then `loss.mean()` over the batch. Sample 0 keeps every token, sample 1 drops 4.
    let dev = candle_core::Device::Cpu;
    let rand = |shape: (usize, usize)| candle_core::Tensor::randn(0f32, 1.0, shape, &dev);
    let (out, target) = (
        [rand((10, 3))?, rand((10, 3))?],
        [rand((10, 3))?, rand((10, 3))?],
    );
    let (aout, atarget) = (
        [rand((5, 2))?, rand((5, 2))?],
        [rand((5, 2))?, rand((5, 2))?],
    );
    let conditioned = [0, 4];
    let mse = |x: &candle_core::Tensor, y: &candle_core::Tensor| -> anyhow::Result<f64> {
        Ok(f64::from((x - y)?.sqr()?.mean_all()?.to_scalar::<f32>()?))
    };
    let kept = |t: &candle_core::Tensor, i: usize| t.narrow(0, conditioned[i], 10 - conditioned[i]);
    for joint in [false, true] {
        let mut want = 0f64;
        for i in 0..2 {
            want += mse(&kept(&out[i], i)?, &kept(&target[i], i)?)? / 2.0;
            if joint {
                want += mse(&aout[i], &atarget[i])? / 2.0;
            }
        }
        let audio = |a: &[candle_core::Tensor; 2]| joint.then(|| a.to_vec());
        let o = loss_views(out.to_vec(), audio(&aout), &conditioned)?;
        let t = loss_views(target.to_vec(), audio(&atarget), &conditioned)?;
        let got = step_loss(&o, &t)?;
        assert!(
            (got - want).abs() < 1e-5 * want,
            "joint {joint}: {got} vs {want}"
        );
    }
    // Without conditioning the views are the outputs themselves.
    let views = loss_views(out.to_vec(), None, &[])?;
    assert_eq!(framesmith_nn::testing::rel(&views[1], &out[1])?, 0.0);
    assert!(loss_views(out.to_vec(), None, &[10, 0]).is_err());
    Ok(())
}

#[test]
fn per_token_rows_equal_to_the_samples_rows_give_the_same_block_bit_for_bit() -> anyhow::Result<()>
{
    // The per-token machinery with every token picking its sample's one row (σ) computes exactly what the
    // per-sample path does: the forward, the input gradient and every LoRA gradient of the hand-written backward.
    for name in ["ltx23_t2v", "ltx2_av"] {
        let case = testkit::load(name)?;
        let mut model = testkit::model(&case)?;
        random_loras(&mut model)?;
        let prepared = model.prepare(&testkit::inputs(&case)?)?;
        let shared = &prepared.blocks;
        let (b, tokens) = (prepared.embedded.dim(0)?, shared.rope.cos()?.dim(1)?);
        let index: Vec<u32> = (0..b as u32)
            .flat_map(|i| std::iter::repeat_n(i, tokens))
            .collect();
        let picked = super::BlockInputs {
            pick: Some(candle_core::Tensor::from_vec(
                index,
                b * tokens,
                &candle_core::Device::Cpu,
            )?),
            ..shared.clone()
        };
        let xs = &prepared.xs;
        let block = &model.transformer_blocks[0];
        let (out, tape) = block.forward_with_tape(xs, shared)?;
        let (out_p, tape_p) = block.forward_with_tape(xs, &picked)?;
        assert_eq!(framesmith_nn::testing::rel(&out, &out_p)?, 0.0, "{name}");
        let grad = out.ones_like()?;
        let (g, g_p) = (block.backward(tape, &grad)?, block.backward(tape_p, &grad)?);
        assert_eq!(
            framesmith_nn::testing::rel(&g.input, &g_p.input)?,
            0.0,
            "{name}"
        );
        assert_eq!(g.params.len(), g_p.params.len());
        for (a, c) in g.params.iter().zip(&g_p.params) {
            assert_eq!(
                framesmith_nn::testing::rel(&a.grad, &c.grad)?,
                0.0,
                "{name}"
            );
        }
    }
    Ok(())
}
