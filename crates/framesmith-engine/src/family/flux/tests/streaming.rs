//! FLUX.1 block streaming through the checkpointed step: with blocks of either kind or both streamed (each
//! `memory.flux_stream_order`, dense and FP8 bases), the loss and every LoRA gradient are those of the resident
//! model, bit for bit (on the CPU the streamer copies host buffers synchronously, so nothing is rounded).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::family::flux::plan::flux_streamed_blocks;
use crate::parity::Fixture;
use crate::train::step::{checkpointed_step, LossTarget, StepOptions};
use framesmith_config::run::FluxStreamOrder;
use framesmith_models::flux::weights::official_shapes;
use framesmith_models::flux::{Flux, FluxConfig, FluxInputs};
use framesmith_nn::fp8::Fp8Scale;
use framesmith_nn::init::randn;
use framesmith_nn::lora::Lora;
use framesmith_nn::offload::{OffloadOptions, StreamMode};
use framesmith_nn::vb::Vb;

/// The fixture model's sizes with more blocks of each kind, so every order streams a different set.
pub(crate) fn config(fixture: &Fixture) -> anyhow::Result<FluxConfig> {
    Ok(FluxConfig {
        depth: 3,
        depth_single_blocks: 4,
        ..FluxConfig::from_json(&fixture.config["init"].to_string())?
    })
}

pub(crate) fn random_weights(cfg: &FluxConfig) -> anyhow::Result<HashMap<String, Tensor>> {
    let rng = &mut StdRng::seed_from_u64(21);
    official_shapes(cfg)
        .into_iter()
        .map(|(name, shape)| Ok((name, randn(rng, shape, 0.0, 0.1, &Device::Cpu)?)))
        .collect()
}

pub(crate) fn inputs(fixture: &Fixture) -> anyhow::Result<FluxInputs> {
    Ok(FluxInputs {
        img: fixture.input("img")?.clone(),
        img_ids: fixture.input("img_ids")?.clone(),
        txt: fixture.input("txt")?.clone(),
        txt_ids: fixture.input("txt_ids")?.clone(),
        timesteps: fixture.input("timesteps")?.clone(),
        y: fixture.input("y")?.clone(),
        guidance: fixture.inputs.get("guidance").cloned(),
    })
}

/// The model with `streamed` blocks streamed and the same LoRA (seeded by module) on every block linear.
pub(crate) fn model(
    cfg: &FluxConfig,
    weights: &HashMap<String, Tensor>,
    fp8: Option<Fp8Scale>,
    streamed: &[usize],
) -> anyhow::Result<(Flux, Vec<Var>)> {
    let vb = Vb::from_tensors(weights.clone(), DType::F32, &Device::Cpu).with_fp8(fp8);
    let offload = OffloadOptions {
        mode: StreamMode::Pinned,
        slots: 2,
        ..OffloadOptions::default()
    };
    let mut model = Flux::new_streamed(cfg, &vb, streamed, &offload)?;
    let mut vars = Vec::new();
    for (k, (_, linear)) in model.linears_mut().into_iter().enumerate() {
        let rng = &mut StdRng::seed_from_u64(100 + k as u64);
        let (i, o) = (linear.in_dim(), linear.out_dim());
        let down = randn(rng, (4, i), 0.0, 0.1, &Device::Cpu)?;
        let up = randn(rng, (o, 4), 0.0, 0.05, &Device::Cpu)?;
        let lora = Lora::from_tensors(&down, &up, 4.0)?;
        vars.extend([lora.down.clone(), lora.up.clone()]);
        linear.set_lora(Some(lora));
    }
    Ok((model, vars))
}

#[test]
fn a_streamed_flux_step_gives_the_resident_loss_and_lora_gradients_in_every_order(
) -> anyhow::Result<()> {
    let fixture = Fixture::load(&framesmith_models::fixtures::case_dir("flux", "flux_dit"))?;
    let cfg = config(&fixture)?;
    let weights = random_weights(&cfg)?;
    let inputs = inputs(&fixture)?;
    let (b, l, c) = inputs.img.dims3()?;
    let rng = &mut StdRng::seed_from_u64(4);
    let targets = (0..b)
        .map(|_| randn(rng, (l, c), 0.0, 1.0, &Device::Cpu))
        .collect::<candle_core::Result<Vec<Tensor>>>()?;
    let target = LossTarget {
        targets: &targets,
        weights: None,
        skip_frames: 0,
    };
    let options = StepOptions::default();
    for fp8 in [None, Some(Fp8Scale::Block64)] {
        let (resident, vars) = model(&cfg, &weights, fp8, &[])?;
        assert_eq!(resident.streamers().count(), 0);
        let want = checkpointed_step(&resident, &inputs, &target, &vars, &options)?;
        let want_out = resident.forward(&inputs)?;
        for order in [
            FluxStreamOrder::SingleFirst,
            FluxStreamOrder::DoubleFirst,
            FluxStreamOrder::Spread,
        ] {
            for count in [2, 5] {
                let streamed = flux_streamed_blocks(&cfg, count, order);
                assert_eq!(streamed.len(), count);
                let (m, vars) = model(&cfg, &weights, fp8, &streamed)?;
                let kinds = m.streamers().count();
                let expected_kinds = usize::from(streamed.iter().any(|&i| i < cfg.depth))
                    + usize::from(streamed.iter().any(|&i| i >= cfg.depth));
                assert_eq!(
                    kinds, expected_kinds,
                    "{order:?} {count}: one streamer per kind"
                );
                let total: usize = m.streamers().map(|s| s.count()).sum();
                assert_eq!(total, count);
                let case = format!("{order:?}, {count} blocks {streamed:?}, fp8 {fp8:?}");
                let got = checkpointed_step(&m, &inputs, &target, &vars, &options)?;
                assert_eq!(got.loss, want.loss, "{case}: loss");
                assert_eq!(got.grads.len(), want.grads.len());
                for (a, g) in want.grads.iter().zip(&got.grads) {
                    let diff = (a - g)?.abs()?.max_all()?.to_scalar::<f32>()?;
                    assert_eq!(diff, 0.0, "{case}: LoRA gradient differs by {diff}");
                }
                // The whole forward (sampling's path) walks the streamed blocks too, twice over the ring.
                for _ in 0..2 {
                    let out = m.forward(&inputs)?;
                    let diff = (&out - &want_out)?.abs()?.max_all()?.to_scalar::<f32>()?;
                    assert_eq!(diff, 0.0, "{case}: forward");
                }
                let loads: u64 = m
                    .streamers()
                    .map(|s| s.stats().map(|st| st.loads))
                    .sum::<candle_core::Result<u64>>()?;
                assert!(loads >= count as u64, "{case}: {loads} loads");
            }
        }
    }
    Ok(())
}

#[test]
fn streamed_block_indices_out_of_range_are_refused() -> anyhow::Result<()> {
    let fixture = Fixture::load(&framesmith_models::fixtures::case_dir("flux", "flux_dit"))?;
    let cfg = config(&fixture)?;
    let weights = random_weights(&cfg)?;
    let err = model(&cfg, &weights, None, &[1, 7])
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.contains("out of range")),
        "{err:?}"
    );
    Ok(())
}
