use super::*;
use crate::family::testkit::plan::{
    assert_auto_streams_within, assert_blocks_hold_every_weight, assert_presets_fit,
    assert_streamed_blocks_spread, variant_input, GIB,
};
use crate::plan::{plan, DEFAULT_CLIP};
use framesmith_config::plan::FloatDtype;
use framesmith_config::run::BaseDtype;
use framesmith_config::ModelFamily;

/// Qwen-Image at `side`², rank 16, with `base`, planned as `framesmith plan --variant qwen-image` does.
fn input(side: usize, base: BaseDtype) -> PlanInput {
    let clip = ClipShape {
        width: side,
        height: side,
        ..DEFAULT_CLIP
    };
    let i = variant_input("qwen-image", 16, base, clip).unwrap();
    assert!(i.model.downcast_ref::<QwenImagePlanModel>().is_some());
    i
}

#[test]
fn the_released_model_is_60_blocks_of_its_parameters_and_fp8_halves_them() {
    let i = input(1024, BaseDtype::F32);
    let s = i.model.describe(&i).unwrap();
    let cfg = QwenImageConfig::qwen_image();
    let params = assert_blocks_hold_every_weight(&s, 60, &official_shapes(&cfg));
    // Qwen-Image is a 20 B-parameter MMDiT.
    assert!(
        (20_000_000_000..20_600_000_000).contains(&params),
        "{params}"
    );
    // rank 16 on the attention, MLP and modulation linears of both streams (musubi-tuner's targets).
    assert!(s.lora.modules > 60 * 10, "{}", s.lora.modules);
    let (bf16, fp8) = (input(1024, BaseDtype::Bf16), input(1024, BaseDtype::Fp8));
    let (b, f) = (
        bf16.model.describe(&bf16).unwrap(),
        fp8.model.describe(&fp8).unwrap(),
    );
    let half = b.kinds[0].data_bytes / 2;
    assert!(
        f.kinds[0].data_bytes > half && f.kinds[0].data_bytes < half + half / 10,
        "fp8 {} bf16 {}",
        f.kinds[0].data_bytes,
        b.kinds[0].data_bytes
    );
    assert_eq!(fp8.compute, FloatDtype::Bf16);
}

#[test]
fn peaks_grow_with_the_resolution_and_auto_streams_within_budgets() {
    let peaks: Vec<u64> = [512, 768, 1024]
        .into_iter()
        .map(|side| {
            let r = plan(&input(side, BaseDtype::Fp8)).unwrap();
            assert!(r.model.starts_with("Qwen-Image ("), "{}", r.model);
            // 1024²: 4096 image tokens (8× VAE, 2×2 packing) and the 256 text tokens the plan counts.
            assert_eq!(r.tokens, ((side / 16) * (side / 16)) as u64 + 256);
            r.peak_vram_bytes
        })
        .collect();
    assert!(peaks.windows(2).all(|w| w[0] < w[1]), "{peaks:?}");
    // 20 B parameters: neither bf16 (~41 GB) nor FP8 (~21 GB of blocks) fits 24 GB whole.
    assert!(plan(&input(1024, BaseDtype::Fp8)).unwrap().peak_vram_bytes > 20 * GIB);
    assert_auto_streams_within(|| input(1024, BaseDtype::Fp8), &[24, 16], true);
    assert!(input(1000, BaseDtype::Fp8)
        .model
        .describe(&input(1000, BaseDtype::Fp8))
        .is_err());
}

#[test]
fn streamed_blocks_spread_and_leave_one_resident() {
    assert_streamed_blocks_spread(QwenImageConfig::qwen_image().num_layers, 50);
}

/// The Qwen-Image presets at 1024², planned as `framesmith plan --variant qwen-image --preset …` does: each fits
/// its card by streaming blocks, the 16 GB card more of them.
#[test]
fn the_qwen_image_presets_fit_their_cards_at_1024() {
    let reports = assert_presets_fit(
        &[("qwen-image-24gb", 24), ("qwen-image-16gb", 16)],
        (ModelFamily::QwenImage, "qwen-image"),
        (1024, 1024, None),
    );
    let streamed: Vec<usize> = reports.iter().map(|r| r.blocks_to_swap).collect();
    for r in &reports {
        assert!(r.blocks_to_swap > 0, "{}", r.verdict_line());
    }
    assert!(streamed[1] > streamed[0], "{streamed:?}");
}

#[test]
fn saved_block_inputs_are_in_the_compute_dtype() {
    let bf16 = input(1024, BaseDtype::Fp8);
    assert_eq!(bf16.compute, FloatDtype::Bf16);
    let s = bf16.model.describe(&bf16).unwrap();
    assert_eq!(s.saved_input_bytes, s.shape.tokens * 3072 * 2);
    assert_eq!(s.shape.residual_bytes, 2);
    let f32 = input(1024, BaseDtype::F32);
    let s = f32.model.describe(&f32).unwrap();
    assert_eq!(s.saved_input_bytes, s.shape.tokens * 3072 * 4);
}

/// Qwen-Image's samples: the Wan 2.1-architecture VAE and each prompt's hidden states, twice with true CFG (the
/// negative prompt's too), stay on the device; a larger sample needs a larger decode.
#[test]
fn samples_hold_the_vae_and_both_prompts_hidden_states() {
    let sample = |side: usize, guided: bool| SampleShape {
        width: side,
        height: side,
        frames: 1,
        steps: 8,
        guided,
        prompts: 1,
    };
    let mut i = input(1024, BaseDtype::Fp8);
    let phase = |i: &PlanInput, s: SampleShape| {
        i.model
            .sampling(i, &s)
            .unwrap()
            .expect("Qwen-Image samples")
    };
    let guided = phase(&i, sample(1024, true));
    let plain = phase(&i, sample(1024, false));
    assert_eq!(guided.held[1].1, 2 * plain.held[1].1);
    assert_eq!(guided.held[1].1, 2 * 256 * 3584 * 2);
    // The VAE: about 127 M parameters in bf16.
    let vae = guided.held[0].1;
    assert!((200 << 20..300 << 20).contains(&vae), "{vae}");
    assert!(phase(&i, sample(1328, true)).decode_bytes > guided.decode_bytes);
    i.sampling = Some(sample(1024, true));
    let r = plan(&i).unwrap();
    assert!(r.sampling.is_some(), "{r}");
    assert!(
        r.to_string()
            .contains("sampling during training — 1024x1024, 1 frame, 8 steps with CFG"),
        "{r}"
    );
}
