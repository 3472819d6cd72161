//! First-frame conditioning (the official trainer's image-to-video) on the CPU with the tiny model: the first
//! frame clean and out of the loss, a conditioned batch learns (with audio too, and mixed with plain clips), a run
//! trains and resumes with it, and with its probability 0 the batch is text-to-video's.

use crate::train::noise::StepRng;
use candle_core::{DType, Device};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::super::items::load_ltx2_items;
use super::super::testkit::{dataset, dataset_with, tiny_config, tiny_dit_with, AUDIO_FRAMES};
use super::super::train::{first_frame_conditioning_p, ltx2_batch, FIRST_FRAME_CONDITIONING_P};
use super::{config, tiny_model_with_lora, T2V};
use crate::family::image::run::BatchOptions;
use crate::family::testkit::run::{
    assert_a_fixed_batch_learns, assert_trains_and_resumes, fixed_draws, tiny_lora_spec,
};
use crate::train::optimizer::AdamW;
use framesmith_config::RunConfig;
use framesmith_data::Unreadable;
use framesmith_models::ltx2::weights::load_streamed_av;
use framesmith_nn::lora::{attach_family_loras, LoraFamily};
use framesmith_nn::lora_file::LoraFile;
use framesmith_nn::offload::OffloadOptions;
use framesmith_nn::testing::rel;

/// Every clip conditioned on its first frame.
const I2V: BatchOptions = BatchOptions {
    first_frame_conditioning_p: 1.0,
};

/// With probability 0 the batch is text-to-video's exactly: every token `(1 − σ)·x + σ·noise` with the noise drawn
/// item by item from the step's generator and nothing else drawn, the targets `noise − x`. With probability 1 the
/// same noise, every clip's first latent frame (its 2 × 3 leading tokens) the cached latents, the targets without
/// those tokens.
#[test]
fn first_frame_conditioning_keeps_the_first_frame_clean_and_out_of_the_loss() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let toml = dataset(dir.path(), 1)?;
    let items = load_ltx2_items((&toml, Unreadable::Refuse), &tiny_config(), &Device::Cpu)?.items;
    let batch: Vec<_> = items.iter().map(|(i, _)| i).collect();
    let draws = fixed_draws(batch.len(), 0.6, 601.0);
    let rng = &mut StepRng::seeded(9);
    let (t2v, t2v_targets) = ltx2_batch(&batch, &draws, rng, DType::F32, &T2V)?;
    let after_t2v = rand::Rng::random::<u64>(rng);
    assert!(t2v.conditioned_tokens.is_empty());
    let by_hand = &mut StdRng::seed_from_u64(9);
    for (i, item) in batch.iter().enumerate() {
        let x = item
            .latents
            .to_dtype(DType::F32)?
            .permute((1, 2, 3, 0))?
            .reshape((18, 4))?;
        let noise = framesmith_nn::init::randn(by_hand, (18, 4), 0.0, 1.0, &Device::Cpu)?;
        let noisy = ((&x * 0.4)? + (&noise * 0.6)?)?;
        assert_eq!(rel(&t2v.latents.get(i)?, &noisy)?, 0.0, "{i}");
        assert_eq!(rel(&t2v_targets[i], &(noise - &x)?)?, 0.0, "{i}");
    }
    assert_eq!(
        after_t2v,
        rand::Rng::random::<u64>(by_hand),
        "nothing else drawn"
    );

    let (i2v, targets) = ltx2_batch(&batch, &draws, &mut StepRng::seeded(9), DType::F32, &I2V)?;
    assert_eq!(i2v.conditioned_tokens, [6, 6, 6]);
    for (i, item) in batch.iter().enumerate() {
        let x = item
            .latents
            .to_dtype(DType::F32)?
            .permute((1, 2, 3, 0))?
            .reshape((18, 4))?;
        let got = i2v.latents.get(i)?;
        assert_eq!(
            rel(&got.narrow(0, 0, 6)?, &x.narrow(0, 0, 6)?)?,
            0.0,
            "clean first frame"
        );
        let rest = t2v.latents.get(i)?.narrow(0, 6, 12)?;
        assert_eq!(
            rel(&got.narrow(0, 6, 12)?, &rest)?,
            0.0,
            "the same noise elsewhere"
        );
        assert_eq!(rel(&targets[i], &t2v_targets[i].narrow(0, 6, 12)?)?, 0.0);
    }
    Ok(())
}

/// A fixed batch whose clips are conditioned on their first frame learns through the per-token timesteps, video
/// only and jointly with audio; a batch mixing conditioned and plain clips too (the loss per clip, then their mean).
#[test]
fn a_first_frame_conditioned_batch_learns() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = dataset(dir.path(), 1)?;
    let items = load_ltx2_items((&toml, Unreadable::Refuse), &tiny_config(), &Device::Cpu)?.items;
    let batch: Vec<_> = items.iter().map(|(i, _)| i).collect();
    let draws = fixed_draws(batch.len(), 0.6, 601.0);
    // A seed whose draws at 0.5 condition some clips and not others.
    let half = BatchOptions {
        first_frame_conditioning_p: 0.5,
    };
    let mixed_seed = (0..64u64)
        .find(|&seed| {
            ltx2_batch(
                &batch,
                &draws,
                &mut StepRng::seeded(seed),
                DType::F32,
                &half,
            )
            .is_ok_and(|(inputs, _)| {
                let c = &inputs.conditioned_tokens;
                c.contains(&0) && c.contains(&6)
            })
        })
        .ok_or_else(|| anyhow::anyhow!("no mixed draw"))?;
    for (options, seed) in [(I2V, 9), (half, mixed_seed)] {
        let (model, loras, mut optimizer) = tiny_model_with_lora(&dir.path().join("dit"))?;
        assert_a_fixed_batch_learns(&model, &loras, &mut optimizer, || {
            let rng = &mut StepRng::seeded(seed);
            ltx2_batch(&batch, &draws, rng, DType::F32, &options)
        })?;
    }

    let joint = dir.path().join("joint");
    let toml = dataset_with(&joint, 1, true)?;
    let items = load_ltx2_items((&toml, Unreadable::Refuse), &tiny_config(), &Device::Cpu)?.items;
    let batch: Vec<_> = items.iter().map(|(i, _)| i).collect();
    let dit = tiny_dit_with(&joint.join("dit"), true)?;
    let (_, mut model) = load_streamed_av(
        &dit,
        (DType::F32, &Device::Cpu),
        (None, false),
        (&[], &OffloadOptions::default()),
        true,
    )?;
    let loras = attach_family_loras(model.linears_mut(), &tiny_lora_spec(), LoraFamily::Ltx2)?;
    let mut optimizer = AdamW::new(crate::train::setup::named_vars(&loras), Default::default())?;
    assert_a_fixed_batch_learns(&model, &loras, &mut optimizer, || {
        let (inputs, targets) =
            ltx2_batch(&batch, &draws, &mut StepRng::seeded(9), DType::F32, &I2V)?;
        // 12 of 18 video tokens and every audio frame in the loss.
        assert_eq!(targets[0].dims(), &[12 * 4 + AUDIO_FRAMES * 4, 1]);
        Ok((inputs, targets))
    })
}

/// A run that conditions every clip on its first frame trains, resumes bit-identically and records its
/// probability; without the key a run uses the official default.
#[test]
fn a_first_frame_conditioned_run_trains_and_resumes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let steps = 3;
    let conditioned = |sub: &str| -> anyhow::Result<RunConfig> {
        let mut config = config(&dir.path().join(sub), steps)?;
        config.training.first_frame_conditioning_p = Some(1.0);
        Ok(config)
    };
    let (_, lora) = assert_trains_and_resumes(&conditioned("a")?, &conditioned("b")?, steps)?;
    let file = LoraFile::load(&lora, &Device::Cpu)?;
    let p = file.metadata.get("framesmith.first_frame_conditioning_p");
    assert_eq!(p.map(String::as_str), Some("1"));
    let plain = config(&dir.path().join("c"), steps)?;
    assert_eq!(
        first_frame_conditioning_p(&plain),
        FIRST_FRAME_CONDITIONING_P
    );
    Ok(())
}
