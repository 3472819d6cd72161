//! The LTX-2 blocks' hand-written backward against candle's autograd (both releases' fixtures, text-to-video and
//! joint audio-video, random LoRAs on every block linear), the joint loss view, and the LoRA targets' names.

use super::super::testkit;
use crate::ltx2::joint_loss_view;
use crate::trainable::testing::{check_blocks, random_loras};
use crate::trainable::TrainableModel;

#[test]
fn block_backward_matches_autograd_for_both_releases() -> anyhow::Result<()> {
    for name in ["ltx2_t2v", "ltx23_t2v", "ltx2_av", "ltx23_av"] {
        let case = testkit::load(name)?;
        let mut model = testkit::model(&case)?;
        let vars = random_loras(&mut model)?;
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
