//! Block streaming through the whole model: a streamed model computes what a resident one does, in the
//! forward and in the checkpointed step's LoRA gradients.

use candle_core::{DType, Device, Result, Tensor};

use crate::train::step::{checkpointed_step, LossTarget, StepOptions};
use framesmith_models::wan::config::WanConfig;
use framesmith_models::wan::random::{random_inputs, random_weights};
use framesmith_models::wan::transformer::{ModelOptions, WanModel};
use framesmith_nn::fp8::Fp8Scale;
use framesmith_nn::lora::Lora;
use framesmith_nn::offload::{OffloadOptions, SavedPlacement, StreamMode};
use framesmith_nn::vb::Vb;

fn randn(seed: u64, shape: &candle_core::Shape) -> Result<Tensor> {
    use rand::SeedableRng;
    let rng = &mut rand::rngs::StdRng::seed_from_u64(seed);
    framesmith_nn::init::randn(rng, shape, 0.0, 0.1, &Device::Cpu)
}

fn model(fp8: Option<Fp8Scale>, streamed: &[usize]) -> Result<WanModel> {
    let dev = Device::Cpu;
    let cfg = WanConfig::tiny(4);
    let weights = random_weights(&cfg, 11, DType::F32, &dev)?;
    let options = ModelOptions {
        residual_dtype: DType::F32,
        blocks_fp8: fp8,
        fp8_products: false,
    };
    let vb = Vb::from_tensors(weights, DType::F32, &dev);
    if streamed.is_empty() {
        WanModel::new(&cfg, vb, &options)
    } else {
        let offload = OffloadOptions {
            mode: StreamMode::Pinned,
            slots: 2,
            ..OffloadOptions::default()
        };
        WanModel::new_streamed(&cfg, vb, &options, streamed, &offload)
    }
}

#[test]
fn a_streamed_model_gives_the_same_outputs() -> Result<()> {
    let cfg = WanConfig::tiny(4);
    let inputs = random_inputs(&cfg, &[[2, 4, 4]], 4, &Device::Cpu)?;
    for fp8 in [None, Some(Fp8Scale::Block64)] {
        let plain = model(fp8, &[])?.forward(&inputs)?;
        let streamed_model = model(fp8, &[1, 2, 3])?;
        let streamer = streamed_model.streamer().expect("streams");
        assert_eq!(streamer.count(), 3);
        assert_eq!(streamer.mode(), StreamMode::Host);
        // Two passes: the second reuses what the first left in the ring (cyclic order).
        for _ in 0..2 {
            let streamed = streamed_model.forward(&inputs)?;
            for (a, b) in plain.iter().zip(&streamed) {
                let diff = (a - b)?.abs()?.max_all()?.to_scalar::<f32>()?;
                assert_eq!(diff, 0.0, "streamed output differs by {diff}");
            }
        }
        let stats = streamer.stats()?;
        assert!(stats.loads >= 3 && stats.hits >= 1, "{stats:?}");
    }
    Ok(())
}

#[test]
fn streamed_and_host_activation_steps_give_the_same_lora_gradients() -> Result<()> {
    let cfg = WanConfig::tiny(4);
    let dev = Device::Cpu;
    let inputs = random_inputs(&cfg, &[[2, 4, 4], [1, 2, 4]], 4, &dev)?;
    let targets: Vec<Tensor> = inputs
        .latents
        .iter()
        .map(|l| l.ones_like())
        .collect::<Result<_>>()?;
    let target = LossTarget {
        targets: &targets,
        weights: None,
        skip_frames: 0,
    };
    let run = |streamed: &[usize], saved: SavedPlacement| -> Result<(f32, Vec<Tensor>)> {
        let mut m = model(None, streamed)?;
        let mut vars = Vec::new();
        for (k, (_, linear)) in m.linears_mut().into_iter().enumerate() {
            let seed = k as u64;
            let (inp, out) = (linear.in_dim(), linear.out_dim());
            let lora = Lora::from_tensors(
                &randn(seed, &(4, inp).into())?,
                &randn(seed + 1000, &(out, 4).into())?,
                4.0,
            )?;
            vars.push(lora.down.clone());
            vars.push(lora.up.clone());
            linear.set_lora(Some(lora));
        }
        let options = StepOptions {
            saved_inputs: saved,
            ..StepOptions::default()
        };
        let out = checkpointed_step(&m, &inputs, &target, &vars, &options)?;
        Ok((out.loss, out.grads))
    };
    let (loss_a, grads_a) = run(&[], SavedPlacement::Device)?;
    for (streamed, saved) in [
        (&[0, 2, 3][..], SavedPlacement::Device),
        (&[], SavedPlacement::PageLocked),
        (&[1, 3], SavedPlacement::PageLocked),
        (&[0, 3], SavedPlacement::Pageable),
    ] {
        let (loss_b, grads_b) = run(streamed, saved)?;
        assert_eq!(
            loss_a, loss_b,
            "streamed {streamed:?}, saved inputs {saved:?}"
        );
        for (a, b) in grads_a.iter().zip(&grads_b) {
            let diff = (a - b)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert_eq!(diff, 0.0, "streamed {streamed:?}, saved inputs {saved:?}");
        }
    }
    Ok(())
}

#[test]
fn streaming_an_existing_model_frees_nothing_it_needs() -> Result<()> {
    let cfg = WanConfig::tiny(4);
    let inputs = random_inputs(&cfg, &[[1, 4, 4]], 4, &Device::Cpu)?;
    let plain = model(None, &[])?;
    let expected = plain.forward(&inputs)?;
    let mut m = plain.clone();
    m.stream_blocks(&[0, 3], &OffloadOptions::default())?;
    assert!(m.stream_blocks(&[1], &OffloadOptions::default()).is_err());
    let got = m.forward(&inputs)?;
    for (a, b) in expected.iter().zip(&got) {
        assert_eq!((a - b)?.abs()?.max_all()?.to_scalar::<f32>()?, 0.0);
    }
    let mut bad = plain.clone();
    assert!(bad
        .stream_blocks(&[3, 1], &OffloadOptions::default())
        .is_err());
    assert!(bad.stream_blocks(&[9], &OffloadOptions::default()).is_err());
    Ok(())
}

#[test]
fn the_configs_staging_default_is_the_streamers() {
    assert_eq!(
        framesmith_config::training::STAGING_SLOTS,
        framesmith_nn::offload::STAGING_SLOTS
    );
}

#[test]
fn every_catalogued_variant_is_a_wan_model_with_its_blocks_start_image_and_pixel_step() {
    let named = WanConfig::named_variants();
    assert_eq!(named.len(), framesmith_config::catalog::VARIANTS.len());
    for (name, cfg) in named {
        let listed = framesmith_config::catalog::variant(name);
        assert_eq!(listed.map(|v| v.blocks), Some(cfg.num_layers), "{name}");
        assert_eq!(
            listed.map(|v| v.start_image),
            Some(crate::family::wan::mode::start_image(&cfg)),
            "{name}"
        );
        let (spatial, _) = crate::family::wan::plan::latent_factors(&cfg);
        assert_eq!(
            listed.map(|v| v.pixel_step),
            Some(spatial * cfg.patch_size[1]),
            "{name}"
        );
    }
}
