use super::*;
use crate::plan::{plan, DEFAULT_CLIP};
use framesmith_config::run::{
    ActivationPlacement, AutoKeyword, BaseDtype, BlocksToSwap, StreamingMode,
};
use framesmith_config::RunConfig;

const GIB: u64 = 1 << 30;

/// HunyuanVideo 1.5 at 848×480 × `frames`, rank 32, with `base`, planned as `framesmith plan --variant
/// hunyuan-video15` does.
fn input(frames: usize, base: BaseDtype) -> PlanInput {
    let mut cfg = RunConfig::default();
    cfg.model.variant = "hunyuan-video15".into();
    cfg.model.base_dtype = base;
    cfg.lora.rank = 32;
    let model = crate::plan::model_for_config(&cfg).unwrap();
    assert!(model.downcast_ref::<Hv15PlanModel>().is_some());
    let clip = ClipShape {
        width: 848,
        height: 480,
        frames,
        ..DEFAULT_CLIP
    };
    PlanInput::from_config(&cfg, model, clip)
}

#[test]
fn the_released_model_is_54_blocks_of_its_8_3b_parameters() {
    let i = input(121, BaseDtype::F32);
    let s = i.model.describe(&i).unwrap();
    assert_eq!(s.num_blocks(), 54);
    assert_eq!(s.kind_counts(), [54]);
    let cfg = HunyuanVideo15Config::hunyuan_video15();
    let params: u64 = official_shapes(&cfg)
        .iter()
        .map(|(_, shape)| shape.iter().map(|&n| n as u64).product::<u64>())
        .sum();
    let resident: u64 = s.resident.iter().map(|(_, b)| b).sum();
    assert_eq!(54 * s.kinds[0].data_bytes + resident, 4 * params);
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
    let mut last = 0;
    for budget_gib in [24, 16] {
        let mut i = input(121, BaseDtype::Fp8);
        i.streaming.mode = StreamingMode::Pinned;
        i.streaming.blocks_to_swap = BlocksToSwap::Auto(AutoKeyword::Auto);
        i.streaming.activations = ActivationPlacement::Host;
        i.vram_budget_bytes = Some(budget_gib * GIB);
        let r = plan(&i).unwrap();
        assert!(r.model.starts_with("HunyuanVideo 1.5"), "{}", r.model);
        assert!(
            r.fits() && r.blocks_chosen,
            "{budget_gib} GiB: {}",
            r.verdict_line()
        );
        assert!(r.peak_vram_bytes <= budget_gib * GIB);
        assert!(
            r.blocks_to_swap >= last,
            "{budget_gib} GiB streams {}",
            r.blocks_to_swap
        );
        last = r.blocks_to_swap;
    }
    assert!(last > 0, "16 GiB streams blocks");
}

#[test]
fn streamed_blocks_spread_and_leave_one_resident() {
    let cfg = HunyuanVideo15Config::hunyuan_video15();
    assert!(hv15_streamed_blocks(&cfg, 0).is_empty());
    let ten = hv15_streamed_blocks(&cfg, 10);
    assert_eq!(ten.len(), 10);
    assert!(ten[0] < 10 && ten[9] > 44, "{ten:?}");
    assert_eq!(hv15_streamed_blocks(&cfg, 100).len(), 53);
}

/// The HunyuanVideo 1.5 presets at 480p × 121 frames, planned as `framesmith plan --variant hunyuan-video15
/// --preset …` does: each fits its card.
#[test]
fn the_presets_fit_their_cards_at_480p_and_121_frames() {
    for (name, gib) in [("hunyuan-video15-24gb", 24), ("hunyuan-video15-16gb", 16)] {
        let preset = framesmith_config::presets::builtin(name).unwrap();
        assert_eq!(
            preset.family,
            Some(framesmith_config::ModelFamily::HunyuanVideo15),
            "{name}"
        );
        let mut cfg = preset.apply(&RunConfig::default()).unwrap().config;
        cfg.model.variant = "hunyuan-video15".into();
        let model = crate::plan::model_for_config(&cfg).unwrap();
        let (clip, _) = crate::plan::clip_for_config(&cfg);
        assert_eq!(
            (clip.width, clip.height, clip.frames),
            (848, 480, 121),
            "{name}"
        );
        let mut i = PlanInput::from_config(&cfg, model, clip);
        i.free_vram_bytes = Some(gib * GIB);
        let r = plan(&i).unwrap();
        assert!(r.fits(), "{name}: {}", r.verdict_line());
    }
}
