use super::*;
use crate::plan::{plan, DEFAULT_CLIP};
use framesmith_config::run::{
    ActivationPlacement, AutoKeyword, BaseDtype, BlocksToSwap, StreamingMode,
};
use framesmith_config::RunConfig;

const GIB: u64 = 1 << 30;

/// LTX-2.3 at 768×512 × `frames`, rank 32, with `base`, planned as `framesmith plan --variant ltx-2.3` does.
fn input(frames: usize, base: BaseDtype) -> PlanInput {
    let mut cfg = RunConfig::default();
    cfg.model.variant = "ltx-2.3".into();
    cfg.model.base_dtype = base;
    cfg.lora.rank = 32;
    let model = crate::plan::model_for_config(&cfg).unwrap();
    assert!(model.downcast_ref::<Ltx2PlanModel>().is_some());
    let clip = ClipShape {
        width: 768,
        height: 512,
        frames,
        ..DEFAULT_CLIP
    };
    PlanInput::from_config(&cfg, model, clip)
}

#[test]
fn the_video_stream_of_ltx23_is_48_blocks_of_its_tensors() {
    let i = input(121, BaseDtype::F32);
    let s = i.model.describe(&i).unwrap();
    assert_eq!(s.num_blocks(), 48);
    assert_eq!(s.kind_counts(), [48]);
    let cfg = Ltx2Config::ltx23_22b();
    let params: u64 = video_stream_shapes(&cfg)
        .iter()
        .filter(|(name, _)| !name.starts_with("audio_"))
        .map(|(_, shape)| shape.iter().map(|&n| n as u64).product::<u64>())
        .sum();
    let resident: u64 = s.resident.iter().map(|(_, b)| b).sum();
    assert_eq!(48 * s.kinds[0].data_bytes + resident, 4 * params);
    // The video stream is 13.1B of the 22B (48 blocks of 16·4096² and the embeddings); the audio stream, the
    // audio-video cross-attentions and the connectors make the rest.
    assert!(
        (12_500_000_000..14_000_000_000).contains(&params),
        "{params}"
    );
    // q, k, v and out of both attentions of every block (the official trainer's targets).
    assert_eq!(s.lora.modules, 48 * 8);
    // 768×512 × 121 frames: 16 latent frames of 16 × 24 tokens, and the 1024 text tokens the plan counts.
    assert_eq!(s.shape.tokens, 16 * 16 * 24 + 1024);
    assert_eq!((s.pixel_multiple, s.frame_step), (32, 8));
    assert!(s.name.starts_with("LTX-2.3 (22B)"), "{}", s.name);
    assert!(input(120, BaseDtype::Bf16)
        .model
        .describe(&input(120, BaseDtype::Bf16))
        .is_err());
}

#[test]
fn auto_streams_more_blocks_within_smaller_budgets() {
    let mut last = 0;
    for budget_gib in [24, 16, 12] {
        let mut i = input(121, BaseDtype::Fp8);
        i.streaming.mode = StreamingMode::Pinned;
        i.streaming.blocks_to_swap = BlocksToSwap::Auto(AutoKeyword::Auto);
        i.streaming.activations = ActivationPlacement::Host;
        i.vram_budget_bytes = Some(budget_gib * GIB);
        let r = plan(&i).unwrap();
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
    // The FP8 video stream alone (about 13 GB) does not fit 12 GiB with the step.
    assert!(last > 0, "12 GiB streams blocks");
}

#[test]
fn streamed_blocks_spread_and_leave_one_resident() {
    let cfg = Ltx2Config::ltx23_22b();
    assert!(ltx2_streamed_blocks(&cfg, 0).is_empty());
    let ten = ltx2_streamed_blocks(&cfg, 10);
    assert_eq!(ten.len(), 10);
    assert!(ten[0] < 10 && ten[9] > 38, "{ten:?}");
    assert_eq!(ltx2_streamed_blocks(&cfg, 100).len(), 47);
}

/// The LTX-2 presets at 768×512 × 121 frames, planned as `framesmith plan --variant ltx-2.3 --preset …` does:
/// each fits its card.
#[test]
fn the_presets_fit_their_cards_at_768x512_and_121_frames() {
    for (name, gib) in [("ltx2-24gb", 24), ("ltx2-16gb", 16)] {
        let preset = framesmith_config::presets::builtin(name).unwrap();
        assert_eq!(
            preset.family,
            Some(framesmith_config::ModelFamily::Ltx2),
            "{name}"
        );
        let mut cfg = preset.apply(&RunConfig::default()).unwrap().config;
        cfg.model.variant = "ltx-2.3".into();
        let model = crate::plan::model_for_config(&cfg).unwrap();
        let (clip, _) = crate::plan::clip_for_config(&cfg);
        assert_eq!(
            (clip.width, clip.height, clip.frames),
            (768, 512, 121),
            "{name}"
        );
        let mut i = PlanInput::from_config(&cfg, model, clip);
        i.free_vram_bytes = Some(gib * GIB);
        let r = plan(&i).unwrap();
        assert!(r.fits(), "{name}: {}", r.verdict_line());
    }
}
