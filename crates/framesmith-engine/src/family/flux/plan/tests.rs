use super::*;
use crate::plan::{plan, DEFAULT_CLIP};
use framesmith_config::plan::FloatDtype;
use framesmith_config::protocol::memory::Phase;
use framesmith_config::run::{
    ActivationPlacement, AutoKeyword, BaseDtype, BlocksToSwap, Checkpointing, StreamingMode,
};
use framesmith_config::RunConfig;

const GIB: u64 = 1 << 30;

/// FLUX.1 dev at `side`², rank 16, with `base`, planned as `framesmith plan --variant flux-dev` does.
fn input(side: usize, base: BaseDtype, order: FluxStreamOrder) -> PlanInput {
    let mut cfg = RunConfig::default();
    cfg.model.variant = "flux-dev".into();
    cfg.model.base_dtype = base;
    cfg.lora.rank = 16;
    cfg.memory.flux_stream_order = order;
    let model = crate::plan::model_for_config(&cfg).unwrap();
    assert!(model.downcast_ref::<FluxPlanModel>().is_some());
    let clip = crate::plan::ClipShape {
        width: side,
        height: side,
        ..DEFAULT_CLIP
    };
    PlanInput::from_config(&cfg, model, clip)
}

fn cfg(depth: usize, single: usize) -> FluxConfig {
    FluxConfig {
        depth,
        depth_single_blocks: single,
        ..FluxConfig::dev()
    }
}

#[test]
fn each_order_takes_its_kind_first_and_spreads_within_it() {
    let c = cfg(19, 38);
    let s = flux_streamed_blocks(&c, 10, FluxStreamOrder::SingleFirst);
    assert_eq!(s.len(), 10);
    assert!(s.iter().all(|&i| i >= 19), "{s:?}");
    // Spread through the single-stream blocks, not bunched at their end.
    assert!(s[0] < 19 + 10, "{s:?}");
    let s = flux_streamed_blocks(&c, 40, FluxStreamOrder::SingleFirst);
    assert_eq!(s.iter().filter(|&&i| i >= 19).count(), 38);
    assert_eq!(s.iter().filter(|&&i| i < 19).count(), 2);

    let d = flux_streamed_blocks(&c, 10, FluxStreamOrder::DoubleFirst);
    assert!(d.iter().all(|&i| i < 19), "{d:?}");
    let d = flux_streamed_blocks(&c, 25, FluxStreamOrder::DoubleFirst);
    assert_eq!(d.iter().filter(|&&i| i < 19).count(), 19);
    assert_eq!(d.len(), 25);

    let sp = flux_streamed_blocks(&c, 19, FluxStreamOrder::Spread);
    assert_eq!(sp.len(), 19);
    assert!(sp.iter().any(|&i| i < 19) && sp.iter().any(|&i| i >= 19));

    for order in [
        FluxStreamOrder::SingleFirst,
        FluxStreamOrder::DoubleFirst,
        FluxStreamOrder::Spread,
    ] {
        assert!(flux_streamed_blocks(&c, 0, order).is_empty());
        let all = flux_streamed_blocks(&c, 100, order);
        assert_eq!(all.len(), 56, "{order:?}: at most every block but one");
        assert!(all.windows(2).all(|w| w[0] < w[1]));
    }
}

#[test]
fn flux_dev_weights_are_its_parameters_and_fp8_halves_the_blocks() {
    let i = input(1024, BaseDtype::F32, FluxStreamOrder::SingleFirst);
    let s = i.model.describe(&i).unwrap();
    assert_eq!(s.num_blocks(), 57);
    assert_eq!(s.kind_counts(), [19, 38]);
    let cfg = FluxConfig::dev();
    let params: u64 = official_shapes(&cfg)
        .iter()
        .map(|(_, shape)| shape.iter().map(|&n| n as u64).product::<u64>())
        .sum();
    let blocks: u64 = 19 * s.kinds[0].data_bytes + 38 * s.kinds[1].data_bytes;
    let resident: u64 = s.resident.iter().map(|(_, b)| b).sum();
    assert_eq!(blocks + resident, 4 * params);
    // FLUX.1 dev: about 11.9 B parameters, a double-stream block about 2.4 single-stream ones.
    assert!(
        (11_800_000_000..12_000_000_000).contains(&params),
        "{params}"
    );
    let ratio = s.kinds[0].data_bytes as f64 / s.kinds[1].data_bytes as f64;
    assert!((2.3..2.5).contains(&ratio), "{ratio}");
    let bf16 = input(1024, BaseDtype::Bf16, FluxStreamOrder::SingleFirst);
    let fp8 = input(1024, BaseDtype::Fp8, FluxStreamOrder::SingleFirst);
    let (b, f) = (
        bf16.model.describe(&bf16).unwrap(),
        fp8.model.describe(&fp8).unwrap(),
    );
    for k in 0..2 {
        // A code byte per weight, and block-64's f32 scale per 64 weights (1/16 more).
        let half = b.kinds[k].data_bytes / 2;
        assert!(
            f.kinds[k].data_bytes > half + half / 17 && f.kinds[k].data_bytes < half + half / 15,
            "kind {k}: fp8 {} bf16 {}",
            f.kinds[k].data_bytes,
            b.kinds[k].data_bytes
        );
        assert!(f.kinds[k].packed_bytes >= f.kinds[k].data_bytes);
    }
    assert_eq!(fp8.compute, FloatDtype::Bf16);
}

/// FP8 products hold the widest block linear's input (`linear2`'s, `d + f` wide) quantised, per token.
#[test]
fn fp8_products_add_the_quantised_linear2_input() {
    let plain = input(1024, BaseDtype::Fp8, FluxStreamOrder::SingleFirst);
    let products = PlanInput {
        fp8_products: true,
        ..plain.clone()
    };
    let working = crate::plan::tests::working_set_line;
    let tokens = 4096 + 512;
    assert_eq!(
        working(&products) - working(&plain),
        tokens * (3072 + 12288 + 4)
    );
}

/// The kept attention (`checkpointing = "attention"`) is each block's joint attention output and LSE: at
/// 1024² (4,096 image and 512 text tokens), bf16 [4608, 3072] and 24 heads of f32 per block, 57 blocks;
/// `"attention_projection"` adds two bf16 [4608, 3072] per double-stream block (19) and one per single (38).
#[test]
fn kept_attention_costs_an_output_and_lse_per_flux_block() {
    let blocks = input(1024, BaseDtype::Bf16, FluxStreamOrder::SingleFirst);
    let peak = |c| {
        let i = PlanInput {
            checkpointing: c,
            ..blocks.clone()
        };
        plan(&i).unwrap().peak_vram_bytes
    };
    let tokens = 4096 + 512;
    let (output, lse) = (tokens * 3072 * 2, tokens * 24 * 4);
    let attention = peak(Checkpointing::Attention);
    assert_eq!(attention - peak(Checkpointing::Blocks), 57 * (output + lse));
    assert_eq!(
        peak(Checkpointing::AttentionProjection) - attention,
        (19 * 2 + 38) * output
    );
}

#[test]
fn flux_peaks_grow_with_the_resolution() {
    for base in [BaseDtype::Bf16, BaseDtype::Fp8] {
        let peaks: Vec<u64> = [512, 768, 1024]
            .into_iter()
            .map(|side| {
                let r = plan(&input(side, base, FluxStreamOrder::SingleFirst)).unwrap();
                assert!(r.model.starts_with("FLUX.1 [dev]"), "{}", r.model);
                // 4096 image tokens (1024² through the 8× autoencoder and 2×2 packing) and 512 text tokens.
                let image = (side / 16) * (side / 16);
                assert_eq!(r.tokens, image as u64 + 512);
                r.peak_vram_bytes
            })
            .collect();
        assert!(peaks.windows(2).all(|w| w[0] < w[1]), "{base:?}: {peaks:?}");
    }
    // A whole bf16 FLUX.1 dev does not fit 24 GB; FP8 at 1024² fits with room to spare.
    let bf16 = plan(&input(1024, BaseDtype::Bf16, FluxStreamOrder::SingleFirst)).unwrap();
    assert!(bf16.peak_vram_bytes > 24 * GIB, "{}", bf16.peak_vram_bytes);
    let fp8 = plan(&input(1024, BaseDtype::Fp8, FluxStreamOrder::SingleFirst)).unwrap();
    assert!(fp8.peak_vram_bytes < 20 * GIB, "{}", fp8.peak_vram_bytes);
    assert!(input(1000, BaseDtype::Fp8, FluxStreamOrder::SingleFirst)
        .model
        .describe(&input(1000, BaseDtype::Fp8, FluxStreamOrder::SingleFirst))
        .is_err());
}

#[test]
fn auto_streams_within_the_budget_in_every_order() {
    for base in [BaseDtype::Bf16, BaseDtype::Fp8] {
        for order in [
            FluxStreamOrder::SingleFirst,
            FluxStreamOrder::DoubleFirst,
            FluxStreamOrder::Spread,
        ] {
            let mut last = 0;
            for budget_gib in [20, 16, 12] {
                let mut i = input(1024, base, order);
                i.streaming.mode = StreamingMode::Pinned;
                i.streaming.blocks_to_swap = BlocksToSwap::Auto(AutoKeyword::Auto);
                i.streaming.activations = ActivationPlacement::Host;
                i.vram_budget_bytes = Some(budget_gib * GIB);
                let r = plan(&i).unwrap();
                let case = format!("{base:?} {order:?} {budget_gib} GiB");
                assert!(r.fits(), "{case}: {}", r.peak_vram_bytes);
                assert!(r.peak_vram_bytes <= budget_gib * GIB, "{case}");
                assert!(r.blocks_chosen, "{case}");
                assert!(
                    r.blocks_to_swap >= last,
                    "{case}: fewer blocks for less VRAM"
                );
                last = r.blocks_to_swap;
                // One fewer streamed block would not have left auto's margin free.
                if r.blocks_to_swap > 0 {
                    let margin = crate::plan::auto_margin_bytes(budget_gib * GIB);
                    let fewer = crate::plan::peak_vram_bytes(&i, r.blocks_to_swap - 1).unwrap();
                    assert!(fewer > budget_gib * GIB - margin, "{case}");
                }
                let slots = r
                    .breakdown
                    .iter()
                    .find(|l| l.label.starts_with("GPU slots"))
                    .map(|l| l.label.clone());
                if r.blocks_to_swap > 0 {
                    assert!(slots.is_some(), "{case}");
                }
            }
            assert!(last > 0, "{base:?} {order:?}: 12 GiB needs streaming");
        }
    }
    // Single-stream blocks are the smaller kind: single_first streams more of them for the same budget.
    let count = |order| {
        let mut i = input(1024, BaseDtype::Fp8, order);
        i.streaming.mode = StreamingMode::Pinned;
        i.streaming.blocks_to_swap = BlocksToSwap::Auto(AutoKeyword::Auto);
        i.streaming.activations = ActivationPlacement::Host;
        i.vram_budget_bytes = Some(12 * GIB);
        plan(&i).unwrap().blocks_to_swap
    };
    let (single, double) = (
        count(FluxStreamOrder::SingleFirst),
        count(FluxStreamOrder::DoubleFirst),
    );
    eprintln!("FP8 at 1024² in 12 GiB: single_first streams {single}, double_first {double}");
    assert!(
        single > double,
        "single_first {single}, double_first {double}"
    );
}

/// The FLUX.1 presets at 1024²: `flux-dev-24gb` fits a 24 GB card whole (nothing streams), `flux-dev-12gb`
/// fits 12 GB by streaming some blocks, planned as `framesmith plan --variant flux-dev --preset …` does.
#[test]
fn the_flux_presets_fit_their_cards_at_1024() {
    for (name, gib, streams) in [("flux-dev-24gb", 24, false), ("flux-dev-12gb", 12, true)] {
        let mut cfg = framesmith_config::presets::builtin(name)
            .and_then(|p| p.apply(&RunConfig::default()))
            .unwrap()
            .config;
        cfg.model.variant = "flux-dev".into();
        let model = crate::plan::model_for_config(&cfg).unwrap();
        let (clip, _) = crate::plan::clip_for_config(&cfg);
        assert_eq!((clip.width, clip.height), (1024, 1024), "{name}");
        let mut i = PlanInput::from_config(&cfg, model, clip);
        i.free_vram_bytes = Some(gib * GIB);
        let r = plan(&i).unwrap();
        eprintln!("{name}: {}", r.verdict_line());
        assert!(r.fits(), "{name}: {}", r.verdict_line());
        assert_eq!(
            r.blocks_to_swap > 0,
            streams,
            "{name}: {}",
            r.verdict_line()
        );
    }
}

#[test]
fn the_largest_image_at_the_largest_rank_plans_and_past_them_is_refused() {
    // FLUX.1 dev at the largest side and rank: a plan, not an overflow; past the tokens of a step or the rank: the
    // planner's errors.
    let mut i = input(
        crate::plan::MAX_SIDE_PIXELS,
        BaseDtype::Fp8,
        FluxStreamOrder::Spread,
    );
    i.base = crate::plan::BaseFormat::Fp8(framesmith_config::run::Fp8ScaleMode::Block64);
    i.clip.frames = 1;
    i.clip.batch = 1;
    i.lora.rank = 3072;
    assert!(plan(&i).is_ok());
    i.clip.batch = usize::MAX;
    assert!(matches!(
        plan(&i),
        Err(crate::plan::PlanError::TooManyTokens { .. })
    ));
    i.clip.batch = 1;
    i.lora.rank = 3073;
    assert!(matches!(
        plan(&i),
        Err(crate::plan::PlanError::Lora(
            framesmith_nn::lora::LoraError::RankTooLarge { max: 3072, .. }
        ))
    ));
}

/// The autoencoder's decode (its widest GroupNorm, 256 channels over every pixel) is the sampling phase's working
/// set: a 1024² sample stays below the FP8 step at 1024², a 2048² one binds; the step also holds the autoencoder
/// and the embeddings.
#[test]
fn a_large_sample_is_bound_by_the_decode() {
    let mut i = input(1024, BaseDtype::Fp8, FluxStreamOrder::default());
    i.streaming.mode = StreamingMode::Off;
    i.streaming.blocks_to_swap = BlocksToSwap::Count(0);
    let sample = |side: usize| SampleShape {
        width: side,
        height: side,
        frames: 1,
        steps: 20,
        guided: false,
        prompts: 2,
    };
    i.sampling = Some(sample(1024));
    let r = plan(&i).unwrap();
    let s = r.sampling.as_ref().unwrap();
    let decode = 10 * 256 * (1 << 20);
    let ae = framesmith_models::flux::autoencoder::AutoEncoderConfig::flux1();
    assert_eq!(sampling::decode_bytes(&ae, 1 << 20, 2), decode);
    let working = |r: &framesmith_config::protocol::memory::PlanReport| {
        let s = r.sampling.as_ref().unwrap();
        s.breakdown
            .iter()
            .find(|l| l.label.starts_with("sampling working set"))
            .unwrap()
            .bytes
    };
    assert_eq!(working(&r), decode, "{r}");
    assert!(s.peak_vram_bytes < r.device_bytes(), "{r}");
    assert_eq!(r.binding_phase(), Phase::Step);
    let held: Vec<&str> = r
        .breakdown
        .iter()
        .filter(|l| l.label.starts_with("samples:"))
        .map(|l| l.label.as_str())
        .collect();
    assert_eq!(
        held,
        [
            "samples: autoencoder (encoder and decoder)",
            "samples: 2 prompts' T5-XXL and CLIP-L outputs"
        ]
    );
    i.sampling = Some(sample(2048));
    let large = plan(&i).unwrap();
    assert_eq!(working(&large), 4 * decode);
    assert_eq!(large.binding_phase(), Phase::Sampling, "{large}");
    // Without samples the step is planned as before.
    i.sampling = None;
    let plain = plan(&i).unwrap();
    assert!(plain.sampling.is_none());
    assert!(plain.device_bytes() < r.device_bytes());
}
