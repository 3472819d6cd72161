//! The LTX-2 blocks' hand-written backward against candle's autograd (both releases' fixtures, random LoRAs on
//! every video linear), and the LoRA targets' names.

use super::super::testkit;
use crate::trainable::testing::{check_blocks, random_loras};
use crate::trainable::TrainableModel;

#[test]
fn block_backward_matches_autograd_for_both_releases() -> anyhow::Result<()> {
    for name in ["ltx2_t2v", "ltx23_t2v"] {
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
