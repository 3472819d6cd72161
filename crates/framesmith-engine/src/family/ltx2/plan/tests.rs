use super::*;
use crate::family::testkit::plan::{
    assert_auto_streams_within, assert_blocks_hold_every_weight, assert_presets_fit,
    assert_streamed_blocks_spread, variant_input,
};
use crate::plan::{ClipShape, DEFAULT_CLIP};
use framesmith_config::run::BaseDtype;
use framesmith_config::ModelFamily;

/// LTX-2.3 at 768×512 × `frames`, rank 32, with `base`, planned as `framesmith plan --variant ltx-2.3` does.
fn input(frames: usize, base: BaseDtype) -> PlanInput {
    let clip = ClipShape {
        width: 768,
        height: 512,
        frames,
        ..DEFAULT_CLIP
    };
    let i = variant_input("ltx-2.3", 32, base, clip).unwrap();
    assert!(i.model.downcast_ref::<Ltx2PlanModel>().is_some());
    i
}

#[test]
fn the_video_stream_of_ltx23_is_48_blocks_of_its_tensors() {
    let i = input(121, BaseDtype::F32);
    let s = i.model.describe(&i).unwrap();
    let shapes: Vec<_> = video_stream_shapes(&Ltx2Config::ltx23_22b())
        .into_iter()
        .filter(|(name, _)| !name.starts_with("audio_"))
        .collect();
    let params = assert_blocks_hold_every_weight(&s, 48, &shapes);
    // The video stream is 13.1B of the 22B (48 blocks of 16·4096² and the embeddings); the audio stream, the
    // audio-video cross-attentions and the connectors make the rest.
    assert!(
        (12_500_000_000..14_000_000_000).contains(&params),
        "{params}"
    );
    // q, k, v and out of both attentions of every block (the official trainer's targets).
    assert_eq!(s.lora.modules, 48 * 8);
    // 768×512 × 121 frames: 16 latent frames of 16 × 24 tokens; the 1024 text tokens are the cross-attention's
    // keys, not part of the video sequence.
    assert_eq!(s.shape.tokens, 16 * 16 * 24);
    assert_eq!((s.pixel_multiple, s.frame_step), (32, 8));
    assert!(s.name.starts_with("LTX-2.3 (22B)"), "{}", s.name);
    assert!(input(120, BaseDtype::Bf16)
        .model
        .describe(&input(120, BaseDtype::Bf16))
        .is_err());
}

/// The blocks share RoPE tables per head and pair over the video tokens (cos and sin in the compute dtype) and
/// the 1024-token text context; a block's tape holds the text side of its cross-attention, and not the GELU's
/// output.
#[test]
fn rope_tables_and_the_text_are_counted_at_their_sizes() {
    let i = input(121, BaseDtype::Bf16);
    let s = i.model.describe(&i).unwrap();
    let (video, text, d) = (16 * 16 * 24u64, 1024u64, 4096u64);
    let shared: u64 = s.shared_inputs.iter().map(|(_, b)| b).sum();
    assert!(shared >= video * d * 2 + text * d * 2, "{shared}");
    let video_only = dual_stream_block_kind(
        &[],
        &i,
        &s.shape,
        (d, 4 * d, 32),
        TapeCounts {
            f32_norms: 3,
            attentions: 2,
        },
    );
    // The text side's, and the 9 per-token f32 AdaLN rows of first-frame conditioning (on by default), less the
    // GELU's output.
    assert_eq!(
        s.kinds[0].tape_bytes + video * 4 * d * 2 - video_only.tape_bytes,
        4 * text * d * 2 + 2 * text * 32 * 2 + 9 * video * d * 4
    );
}

/// Each block's saved input holds its residual stream and the text keys and values it keeps for the recompute
/// (they wait where the input does); the blocks share every block's f32 modulation rows of the pass.
#[test]
fn saved_inputs_hold_the_text_keys_and_values() {
    let i = input(121, BaseDtype::Bf16);
    let s = i.model.describe(&i).unwrap();
    let (video, text, d) = (16 * 16 * 24u64, 1024u64, 4096u64);
    assert_eq!(
        s.saved_input_bytes,
        video * d * s.shape.residual_bytes + 2 * text * d * 2
    );
    let shared: u64 = s.shared_inputs.iter().map(|(_, b)| b).sum();
    assert!(
        shared >= 48 * (9 + 2) * d * 4 + video * d * 2 + text * d * 2,
        "{shared}"
    );
}

#[test]
fn auto_streams_more_blocks_within_smaller_budgets() {
    let reports = assert_auto_streams_within(|| input(121, BaseDtype::Fp8), &[24, 16, 12], false);
    // The FP8 video stream alone (about 13 GB) does not fit 12 GiB with the step.
    assert!(reports[2].blocks_to_swap > 0, "12 GiB streams blocks");
}

#[test]
fn streamed_blocks_spread_and_leave_one_resident() {
    assert_streamed_blocks_spread(Ltx2Config::ltx23_22b().num_layers, 38);
}

/// The LTX-2 presets at 768×512 × 121 frames, planned as `framesmith plan --variant ltx-2.3 --preset …` does:
/// each fits its card.
#[test]
fn the_presets_fit_their_cards_at_768x512_and_121_frames() {
    assert_presets_fit(
        &[("ltx2-24gb", 24), ("ltx2-16gb", 16)],
        (ModelFamily::Ltx2, "ltx-2.3"),
        (768, 512, Some(121)),
    );
}

/// Joint audio-video training holds both streams and the audio-video cross-attentions in every block, trains the
/// official trainer's default targets of all six attentions, and counts the audio tokens (25 a second of the
/// clip) in the saved inputs and the tapes.
#[test]
fn joint_training_counts_both_streams() {
    let cfg = Ltx2Config::ltx23_22b();
    let i = input(121, BaseDtype::F32);
    let model = |audio: bool| Ltx2PlanModel {
        config: cfg.clone(),
        audio,
        vae: None,
        first_frame_conditioning: false,
        sound: None,
    };
    let video = describe(&model(false), &i).unwrap();
    let joint = describe(&model(true), &i).unwrap();
    assert!(
        joint.name.ends_with("video and audio streams"),
        "{}",
        joint.name
    );
    let shapes: Vec<_> = video_stream_shapes(&cfg)
        .into_iter()
        .chain(framesmith_models::ltx2::weights::audio_stream_shapes(&cfg))
        .collect();
    let params = assert_blocks_hold_every_weight(&joint, 48, &shapes);
    // The audio stream and the cross-attentions add about 5.6B to the video stream's 13.1B.
    assert!(
        (18_000_000_000..19_500_000_000).contains(&params),
        "{params}"
    );
    assert_eq!(joint.lora.modules, 48 * 24);
    // 121 frames at 24 fps: 126 audio latent frames of width 2048.
    assert_eq!(audio_frames(121), 126);
    let residual = joint.shape.residual_bytes;
    assert_eq!(
        joint.saved_input_bytes - video.saved_input_bytes,
        126 * 2048 * residual
    );
    assert!(joint.kinds[0].tape_bytes > video.kinds[0].tape_bytes);
    let shared = |m: &ModelMemory| m.shared_inputs.iter().map(|(_, b)| b).sum::<u64>();
    assert!(shared(&joint) > shared(&video));
}

/// Samples hold the VAE and the prompts' connector outputs for the whole run; a longer sample denoises and
/// decodes more; the decode is of one of ltx-core's tiles at a time, so a clip past a tile adds no decode memory.
#[test]
fn samples_count_the_vae_the_texts_the_denoising_and_a_tiles_decode() {
    let fixture = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../framesmith-models/tests/fixtures/ltx2/vae_ltx23/weights.safetensors");
    let vae = PlanVae::of_file(&fixture).unwrap();
    let model = Ltx2PlanModel {
        config: Ltx2Config::ltx23_22b(),
        audio: false,
        vae: Some(vae.clone()),
        first_frame_conditioning: false,
        sound: None,
    };
    let i = input(121, BaseDtype::Bf16);
    let sample = |width: usize, height: usize, frames: usize| SampleShape {
        width,
        height,
        frames,
        steps: 30,
        guided: true,
        prompts: 2,
    };
    let of = |s| sampling(&model, &i, &s);
    let short = of(sample(768, 512, 25));
    let long = of(sample(768, 512, 121));
    assert_eq!(short.held[0], ("video VAE".to_owned(), vae.parameters * 2));
    // Two prompts and their negative prompts: 1024 × 4096 each in bf16.
    assert_eq!(short.held[1].1, 4 * 1024 * 4096 * 2);
    assert!(long.denoise_state_bytes > short.denoise_state_bytes);
    assert!(long.decode_bytes > short.decode_bytes);
    // 121 and 193 frames both decode in tiles of 80 frames: only the blended clip grows.
    let longer = of(sample(768, 512, 193));
    let clip = |frames: u64| 3 * frames * 768 * 512 * (4 + 5);
    assert_eq!(
        longer.decode_bytes - clip(193),
        long.decode_bytes - clip(121)
    );
    let unguided = of(SampleShape {
        guided: false,
        ..sample(768, 512, 121)
    });
    assert_eq!(unguided.held[1].1, 2 * 1024 * 4096 * 2);
}

/// First-frame conditioning makes the video's AdaLN rows per token: 9 f32 rows of every token in each block's
/// tape for LTX-2.3 (13 with audio), and the per-token head and row index among the shared inputs; a single
/// latent frame is never conditioned.
#[test]
fn first_frame_conditioning_counts_the_per_token_rows() {
    let cfg = Ltx2Config::ltx23_22b();
    let model = |audio: bool, first_frame_conditioning: bool| Ltx2PlanModel {
        config: cfg.clone(),
        audio,
        vae: None,
        first_frame_conditioning,
        sound: None,
    };
    let i = input(121, BaseDtype::Bf16);
    // 16 latent frames of 16 × 24 tokens, width 4096.
    let tokens = 16 * 16 * 24;
    let shared = |m: &ModelMemory| m.shared_inputs.iter().map(|(_, b)| b).sum::<u64>();
    for (audio, rows) in [(false, 9), (true, 13)] {
        let plain = describe(&model(audio, false), &i).unwrap();
        let conditioned = describe(&model(audio, true), &i).unwrap();
        assert_eq!(
            conditioned.kinds[0].tape_bytes - plain.kinds[0].tape_bytes,
            rows * tokens * 4096 * 4
        );
        assert!(shared(&conditioned) > shared(&plain) + 3 * tokens * 4096 * 2);
    }
    let image = input(1, BaseDtype::Bf16);
    let (plain, conditioned) = (
        describe(&model(false, false), &image).unwrap(),
        describe(&model(false, true), &image).unwrap(),
    );
    assert_eq!(conditioned.kinds[0].tape_bytes, plain.kinds[0].tape_bytes);
    assert_eq!(shared(&conditioned), shared(&plain));
    // `framesmith plan` counts them unless the run turns conditioning off.
    assert!(input(121, BaseDtype::Bf16)
        .model
        .downcast_ref::<Ltx2PlanModel>()
        .is_some_and(|m| m.first_frame_conditioning));
}

/// A joint run's samples have sound: they hold the audio VAE's decoder, the vocoder and the audio connector's
/// outputs, always run the negative prompt (the audio's guidance), and denoise the audio tokens beside the video's.
#[test]
fn samples_with_sound_count_the_audio_decoder_texts_and_tokens() {
    let fixtures = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../framesmith-models/tests/fixtures/ltx2");
    let sound = PlanSound::of_files(&[
        &fixtures.join("vae_ltx23/weights.safetensors"),
        &fixtures.join("audio_ltx23/weights.safetensors"),
    ])
    .unwrap();
    assert!(sound.parameters > 0);
    let model = |sound: Option<PlanSound>| Ltx2PlanModel {
        config: Ltx2Config::ltx23_22b(),
        audio: sound.is_some(),
        vae: None,
        first_frame_conditioning: false,
        sound,
    };
    let i = input(121, BaseDtype::Bf16);
    let shape = SampleShape {
        width: 768,
        height: 512,
        frames: 121,
        steps: 30,
        guided: false,
        prompts: 1,
    };
    let silent = sampling(&model(None), &i, &shape);
    let loud = sampling(&model(Some(sound.clone())), &i, &shape);
    let held = |m: &SamplingMemory, what: &str| {
        m.held
            .iter()
            .find(|(name, _)| name.contains(what))
            .map(|(_, b)| *b)
    };
    assert_eq!(held(&loud, "audio VAE decoder"), Some(sound.parameters * 2));
    // The prompt and its negative prompt (run for the audio's guidance): 1024 × 2048 each in bf16.
    assert_eq!(held(&loud, "audio connector"), Some(2 * 1024 * 2048 * 2));
    assert_eq!(held(&silent, "audio"), None);
    // 126 audio latent frames of 128 values, f32, in the five denoising tensors of two passes' run.
    let video_passes = |m: &SamplingMemory| m.held[0].1 / (1024 * 4096 * 2);
    assert_eq!((video_passes(&silent), video_passes(&loud)), (1, 2));
    let video_latents = 16 * 16 * 24 * 128 * 4;
    assert_eq!(
        loud.denoise_state_bytes - silent.denoise_state_bytes,
        video_latents + 6 * 126 * 128 * 4
    );
    assert!(loud.decode_bytes >= silent.decode_bytes);
}
