//! The streaming check: streamed and resident LoRA gradients of a tiny config compared in each mode.

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};

use super::{build, offload_options, saved_inputs, StreamBench};
use crate::step::{flow_batch, latent_size};
use framesmith_engine::train::step::{checkpointed_step, LossTarget, StepOptions};
use framesmith_models::wan::config::WanConfig;
use framesmith_models::wan::random::random_weights;
use framesmith_nn::fp8::Fp8Scale;
use framesmith_nn::offload::StreamMode;

/// Streamed vs resident LoRA gradients of the tiny config on `dev`, for each streaming mode: the worst
/// max |streamed − resident| / max |resident| over the gradient tensors.
pub fn check_tiny(dev: &Device) -> Result<Vec<(String, f64)>> {
    let cfg = WanConfig::tiny(4);
    let opts = StreamBench {
        frames: 9,
        height: 32,
        width: 48,
        rank: 4,
        fp8: Some(Fp8Scale::Block64),
        residual: DType::F32,
        activations_on_host: false,
        keep_tapes: false,
        keep_attention: false,
        slots: 2,
        // Chunks far smaller than a block and cut off the 256-byte alignment, so the staged copy splits tensors
        // at odd places and wraps its ring many times per block.
        staging_slots: 3,
        staging_chunk_bytes: 3000,
        copy_threads: 3,
        copy_unit_bytes: framesmith_nn::offload::COPY_UNIT_BYTES,
        warmup: 0,
        iters: 1,
        seed: 3,
    };
    let host = random_weights(&cfg, 7, DType::BF16, &Device::Cpu)?;
    let weights = || -> Result<HashMap<String, Tensor>> {
        host.iter()
            .map(|(k, v)| Ok((k.clone(), v.to_device(dev)?)))
            .collect()
    };
    let latent = latent_size(&cfg, opts.frames, opts.height, opts.width);
    let (inputs, targets) = flow_batch(&cfg, latent, 5, 0.6, 11, dev)?;
    let target = LossTarget {
        targets: &targets,
        weights: None,
        skip_frames: 0,
    };
    let grads = |streamed: &[usize], mode: StreamMode, on_host: bool| -> Result<Vec<Tensor>> {
        let offload = offload_options(&opts, mode, opts.slots);
        let (model, loras) = build(&cfg, weights()?, dev, &opts, streamed, &offload)?;
        for (i, v) in loras.vars().iter().enumerate() {
            if i % 2 == 1 {
                v.set(&(v.as_tensor().ones_like()? * 0.01)?)?;
            }
        }
        let step_options = StepOptions {
            saved_inputs: saved_inputs(on_host, Some(mode)),
            ..StepOptions::default()
        };
        Ok(checkpointed_step(&model, &inputs, &target, &loras.vars(), &step_options)?.grads)
    };
    let reference = grads(&[], StreamMode::Pinned, false)?;
    let mut out = Vec::new();
    for (mode, on_host) in [
        (StreamMode::Pinned, false),
        (StreamMode::Staged, false),
        (StreamMode::Pinned, true),
        (StreamMode::Staged, true),
    ] {
        let got = grads(&[0, 2, 3], mode, on_host)?;
        let mut worst = 0f64;
        for (a, b) in reference.iter().zip(&got) {
            let scale = a
                .abs()?
                .max_all()?
                .to_dtype(DType::F32)?
                .to_scalar::<f32>()? as f64;
            let diff = (a - b)?
                .abs()?
                .max_all()?
                .to_dtype(DType::F32)?
                .to_scalar::<f32>()? as f64;
            let rel = if scale > 0.0 { diff / scale } else { diff };
            worst = if rel.is_finite() {
                worst.max(rel)
            } else {
                f64::INFINITY
            };
        }
        let act = if on_host { "host" } else { "device" };
        out.push((format!("{} activations={act}", mode.as_str()), worst));
    }
    Ok(out)
}
