//! Fixture cases of `tests/fixtures/ltx2` (made by `bench/reference/ltx2.py` and `ltx2_av.py` from ltx-core) for the LTX-2 tests:
//! the model built from a case's weights in the case's layout, and its inputs as the model takes them.

use std::path::PathBuf;

use candle_core::DType;

use super::config::Ltx2Config;
use super::transformer::{Ltx2AudioInputs, Ltx2Inputs, Ltx2Transformer};
use crate::fixtures::FixtureCase;
use framesmith_nn::vb::Vb;

/// The folder of the LTX-2 fixtures, in this crate.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ltx2")
}

/// Reads case `name`.
pub fn load(name: &str) -> anyhow::Result<FixtureCase> {
    FixtureCase::load_dir(&fixtures_dir().join(name))
}

/// The case's transformer config (`init`).
pub fn config(case: &FixtureCase) -> anyhow::Result<Ltx2Config> {
    Ok(Ltx2Config::from_transformer_json(&case.config["init"])?)
}

/// The case's weights as a [`Vb`] at the model's root, in `dtype` (the single-file layout under
/// `model.diffusion_model.`).
pub fn vb(case: &FixtureCase, dtype: DType) -> Vb {
    let vb = Vb::from_tensors(case.weights.clone(), dtype, &candle_core::Device::Cpu);
    if case.config["call"]["layout"] == "single_file" {
        vb.pp("model.diffusion_model")
    } else {
        vb
    }
}

/// Whether the case runs both streams (`bench/reference/ltx2_av.py`'s cases).
pub fn is_joint(case: &FixtureCase) -> bool {
    case.config["call"].get("audio_frames").is_some()
}

/// The case's model in f32 (with its audio stream for a joint case).
pub fn model(case: &FixtureCase) -> anyhow::Result<Ltx2Transformer> {
    let (vb, cfg) = (vb(case, DType::F32), config(case)?);
    Ok(if is_joint(case) {
        Ltx2Transformer::load_av(&vb, &cfg)?
    } else {
        Ltx2Transformer::load(&vb, &cfg)?
    })
}

/// The case's inputs.
pub fn inputs(case: &FixtureCase) -> anyhow::Result<Ltx2Inputs> {
    let lens: Vec<usize> = serde_json::from_value(case.config["call"]["txt_lens"].clone())?;
    Ok(Ltx2Inputs {
        latents: case.input("latent")?.clone(),
        sigmas: case.input("sigma")?.to_vec1::<f32>()?,
        positions: case.input("positions")?.clone(),
        context: case.input("context")?.clone(),
        context_lens: Some(lens),
        audio: if is_joint(case) {
            Some(Ltx2AudioInputs {
                latents: case.input("audio_latent")?.clone(),
                positions: case.input("audio_positions")?.clone(),
                context: case.input("audio_context")?.clone(),
            })
        } else {
            None
        },
        conditioned_tokens: conditioned_tokens(case)?,
    })
}

/// The leading clean tokens of each sample of a first-frame conditioned case (`call.conditioned`); empty for the
/// others.
pub fn conditioned_tokens(case: &FixtureCase) -> anyhow::Result<Vec<usize>> {
    match case.config["call"].get("conditioned") {
        Some(v) => Ok(serde_json::from_value(v.clone())?),
        None => Ok(Vec::new()),
    }
}
