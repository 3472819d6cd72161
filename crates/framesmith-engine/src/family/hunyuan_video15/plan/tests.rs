use super::*;
use crate::family::testkit::plan::{
    assert_auto_streams_within, assert_blocks_hold_every_weight, assert_presets_fit,
    assert_streamed_blocks_spread, variant_input,
};
use crate::plan::{plan, ClipShape, PlanModel, DEFAULT_CLIP};
use framesmith_config::run::BaseDtype;
use framesmith_config::ModelFamily;

/// HunyuanVideo 1.5 at 848×480 × `frames`, rank 32, with `base`, planned as `framesmith plan --variant
/// hunyuan-video15` does.
fn input(frames: usize, base: BaseDtype) -> PlanInput {
    let clip = ClipShape {
        width: 848,
        height: 480,
        frames,
        ..DEFAULT_CLIP
    };
    let i = variant_input("hunyuan-video15", 32, base, clip).unwrap();
    assert!(i.model.downcast_ref::<Hv15PlanModel>().is_some());
    i
}

#[test]
fn the_released_model_is_54_blocks_of_its_8_3b_parameters() {
    let i = input(121, BaseDtype::F32);
    let s = i.model.describe(&i).unwrap();
    let cfg = HunyuanVideo15Config::hunyuan_video15();
    let params = assert_blocks_hold_every_weight(&s, 54, &official_shapes(&cfg));
    assert!((8_200_000_000..8_500_000_000).contains(&params), "{params}");
    // Every linear of both streams of every block: 14 per block (musubi-tuner's targets).
    assert_eq!(s.lora.modules, 54 * 14);
    // 480p × 121 frames: 31 latent frames of 30 × 53 tokens, and the 256 text tokens the plan counts.
    assert_eq!(s.shape.tokens, 31 * 30 * 53 + 256);
    assert_eq!((s.pixel_multiple, s.frame_step), (16, 4));
    // Image-to-video: the first frame's 729 SigLIP tokens join the text.
    let mut i2v = input(121, BaseDtype::F32);
    if let Some(m) = i2v.model.downcast_ref::<Hv15PlanModel>() {
        i2v.model = PlanModel::new(Hv15PlanModel {
            i2v: true,
            ..m.clone()
        });
    }
    let s = i2v.model.describe(&i2v).unwrap();
    assert_eq!(s.shape.tokens, 31 * 30 * 53 + 256 + 729);
    assert!(input(120, BaseDtype::Bf16)
        .model
        .describe(&input(120, BaseDtype::Bf16))
        .is_err());
}

#[test]
fn peaks_grow_with_the_frames_and_auto_streams_within_budgets() {
    let peaks: Vec<u64> = [1, 61, 121]
        .into_iter()
        .map(|frames| {
            plan(&input(frames, BaseDtype::Fp8))
                .unwrap()
                .peak_vram_bytes
        })
        .collect();
    assert!(peaks.windows(2).all(|w| w[0] < w[1]), "{peaks:?}");
    let reports = assert_auto_streams_within(|| input(121, BaseDtype::Fp8), &[24, 16], false);
    for r in &reports {
        assert!(r.model.starts_with("HunyuanVideo 1.5"), "{}", r.model);
    }
    assert!(reports[1].blocks_to_swap > 0, "16 GiB streams blocks");
}

#[test]
fn streamed_blocks_spread_and_leave_one_resident() {
    assert_streamed_blocks_spread(HunyuanVideo15Config::hunyuan_video15().num_layers, 44);
}

/// The HunyuanVideo 1.5 presets at 480p × 121 frames, planned as `framesmith plan --variant hunyuan-video15
/// --preset …` does: each fits its card.
#[test]
fn the_presets_fit_their_cards_at_480p_and_121_frames() {
    assert_presets_fit(
        &[("hunyuan-video15-24gb", 24), ("hunyuan-video15-16gb", 16)],
        (ModelFamily::HunyuanVideo15, "hunyuan-video15"),
        (848, 480, Some(121)),
    );
}
