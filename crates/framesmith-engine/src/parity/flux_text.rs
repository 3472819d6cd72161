//! Parity for the text encoders FLUX.1 uses: fixture kinds `clip_text` (CLIP-L: last hidden state and pooled
//! output) and `t5_encoder` (T5 v1.1: with the attention mask and without, as FLUX calls it).

use anyhow::Context;
use candle_core::{DType, Device};

use super::{compare, Fixture, ParityRow, OUTPUT_REL_TOL};
use framesmith_models::flux::clip_text::{text_model_prefix, ClipTextConfig, ClipTextModel};
use framesmith_models::t5::v1_1::{t5_config_from_hf_json, t5_from_tensors};
use framesmith_nn::vb::Vb;

/// Runs the CLIP text model of a `clip_text` fixture.
pub fn check_clip(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let cfg = ClipTextConfig::from_json(&fixture.config["init"].to_string())
        .context("config.json `init` is not a CLIPTextConfig")?;
    let vb = Vb::from_tensors(fixture.weights.clone(), DType::F32, &Device::Cpu);
    let model = ClipTextModel::new(&cfg, &text_model_prefix(&vb))?;
    let out = model.forward(fixture.input("input_ids")?)?;
    Ok(vec![
        compare(
            "last_hidden_state",
            &out.last_hidden_state,
            fixture.expected("last_hidden_state")?,
            OUTPUT_REL_TOL,
        )?,
        compare(
            "pooler_output",
            &out.pooler_output,
            fixture.expected("pooler_output")?,
            OUTPUT_REL_TOL,
        )?,
    ])
}

/// Runs the T5 encoder of a `t5_encoder` fixture.
pub fn check_t5(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let cfg = t5_config_from_hf_json(&fixture.config["init"].to_string())?;
    let encoder = t5_from_tensors(fixture.weights.clone(), &cfg, DType::F32, &Device::Cpu)?;
    let ids = fixture.input("input_ids")?;
    let mut rows = Vec::new();
    if let (Ok(mask), Some(expected)) = (
        fixture.input("attention_mask"),
        fixture.expected.get("hidden"),
    ) {
        rows.push(compare(
            "hidden",
            &encoder.encode(ids, mask)?,
            expected,
            OUTPUT_REL_TOL,
        )?);
    }
    if let Some(expected) = fixture.expected.get("hidden_nomask") {
        let all = ids.ones_like()?;
        rows.push(compare(
            "hidden_nomask",
            &encoder.encode(ids, &all)?,
            expected,
            OUTPUT_REL_TOL,
        )?);
    }
    Ok(rows)
}
