//! Full-size equivalence with the PyTorch reference (`framesmith-bench equivalence`): one checkpointed LoRA step
//! of a Wan DiT at a real clip size, with everything it used written out — the weights (random, official layout,
//! drawn on the device), the flow-matching sample, text context and timestep, the LoRA factors — and the loss and
//! every LoRA gradient it produced. `bench/reference/equivalence.py` runs the same step from those files in
//! PyTorch (bf16 autocast, and in f32 for the yardstick) and compares.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Result, Tensor};
use rand::SeedableRng;

use crate::step::{build, flow_batch, latent_size, step, video_tokens, StepBench};
use framesmith_models::wan::config::WanConfig;
use framesmith_models::wan::random::random_weights_on_device;
use framesmith_nn::init::randn;

/// The noise level of the written sample (the timestep is `1000 σ`).
pub const SIGMA: f64 = 0.75;

/// What [`write`] ran.
#[derive(Clone, Debug)]
pub struct Equivalence {
    pub loss: f32,
    /// LoRA gradient tensors written (`down` and `up` of each module).
    pub tensors: usize,
    pub tokens: usize,
}

/// Runs the step of `cfg` at `opts`' clip size, rank, seed, mode and weight format on `dev`, and writes into
/// `out`: `weights.safetensors` (bf16, official names), `sample.safetensors` (`xt`, `target`, `context`,
/// `timestep`), `lora.safetensors` (`{module}.down` / `{module}.up`, f32) and `grads.safetensors` (the same
/// names, f32, and `loss`). Every LoRA `up` starts non-zero, so every `down` gradient is non-zero too.
pub fn write(dev: &Device, cfg: &WanConfig, opts: &StepBench, out: &Path) -> Result<Equivalence> {
    std::fs::create_dir_all(out)?;
    let latent = latent_size(cfg, opts.frames, opts.height, opts.width);
    let weights = random_weights_on_device(cfg, opts.seed, DType::BF16, dev)?;
    save(&weights, &out.join("weights.safetensors"))?;
    let (model, loras) = build(cfg, weights, dev, opts.fp8, opts.rank, opts.seed)?;
    let rng = &mut rand::rngs::StdRng::seed_from_u64(opts.seed.wrapping_add(17));
    let mut factors = HashMap::new();
    for (path, adapter) in loras.iter() {
        let lora = adapter
            .as_lora()
            .ok_or_else(|| candle_core::Error::msg("the equivalence step trains plain LoRA"))?;
        let up = randn(rng, lora.up.shape(), 0.0, 0.02, &Device::Cpu)?.to_dtype(lora.up.dtype())?;
        lora.up.set(&up.to_device(dev)?)?;
        factors.insert(format!("{path}.down"), lora.down.as_tensor().clone());
        factors.insert(format!("{path}.up"), up);
    }
    save(&factors, &out.join("lora.safetensors"))?;
    let (inputs, targets) = flow_batch(cfg, latent, opts.text_tokens, SIGMA, opts.seed, dev)?;
    let sample = HashMap::from([
        ("xt".to_string(), inputs.latents[0].clone()),
        ("target".to_string(), targets[0].clone()),
        ("context".to_string(), inputs.context[0].clone()),
        (
            "timestep".to_string(),
            Tensor::new(&[(1000.0 * SIGMA) as f32], &Device::Cpu)?,
        ),
    ]);
    save(&sample, &out.join("sample.safetensors"))?;
    let result = step(&model, &inputs, &targets, &loras, opts.mode)?;
    let names = loras
        .iter()
        .flat_map(|(path, _)| [format!("{path}.down"), format!("{path}.up")]);
    let mut grads = names
        .zip(&result.grads)
        .map(|(name, g)| Ok((name, g.to_dtype(DType::F32)?)))
        .collect::<Result<HashMap<_, _>>>()?;
    let tensors = grads.len();
    grads.insert(
        "loss".to_string(),
        Tensor::new(&[result.loss], &Device::Cpu)?,
    );
    save(&grads, &out.join("grads.safetensors"))?;
    Ok(Equivalence {
        loss: result.loss,
        tensors,
        tokens: video_tokens(cfg, latent),
    })
}

/// Writes `tensors` (from any device) to a safetensors file, through host memory.
fn save(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    let on_host = tensors
        .iter()
        .map(|(k, t)| Ok((k.clone(), t.to_device(&Device::Cpu)?)))
        .collect::<Result<HashMap<_, _>>>()?;
    candle_core::safetensors::save(&on_host, path)
        .map_err(|e| candle_core::Error::msg(format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::StepMode;

    /// The tiny config's files: every LoRA factor and gradient named, `up` non-zero, the loss finite and equal to
    /// the one in the file, and the weights readable back under the official names.
    #[test]
    fn writes_every_input_and_gradient() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let cfg = WanConfig::tiny(2);
        let opts = StepBench {
            frames: 5,
            height: 32,
            width: 48,
            rank: 4,
            text_tokens: 5,
            mode: StepMode::default(),
            ..StepBench::default()
        };
        let run = write(&Device::Cpu, &cfg, &opts, dir.path())?;
        assert!(run.loss.is_finite() && run.tensors > 0);
        let grads =
            candle_core::safetensors::load(dir.path().join("grads.safetensors"), &Device::Cpu)?;
        let lora =
            candle_core::safetensors::load(dir.path().join("lora.safetensors"), &Device::Cpu)?;
        assert_eq!(grads.len(), run.tensors + 1);
        assert_eq!(lora.len(), run.tensors);
        for name in lora.keys() {
            let g = &grads[name];
            assert_eq!(g.dims(), lora[name].dims(), "{name}");
            let norm = g.sqr()?.sum_all()?.to_scalar::<f32>()?;
            assert!(
                norm > 0.0 && norm.is_finite(),
                "{name}: gradient norm {norm}"
            );
        }
        let loss = grads["loss"].to_vec1::<f32>()?[0];
        assert_eq!(loss, run.loss);
        let weights =
            candle_core::safetensors::load(dir.path().join("weights.safetensors"), &Device::Cpu)?;
        assert!(weights.contains_key("blocks.1.self_attn.q.weight"));
        let sample =
            candle_core::safetensors::load(dir.path().join("sample.safetensors"), &Device::Cpu)?;
        assert_eq!(sample["xt"].dims(), sample["target"].dims());
        Ok(())
    }
}
