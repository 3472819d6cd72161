//! LTX-2's description for the planner ([`ModelMemory`]): the blocks with their bytes from the tensor list of the
//! official file, which blocks stream for a count (spread evenly), the video tokens through the VAE's 32× spatial
//! and 8× temporal compression (1×1×1 patches), and the step's activations. Text-to-video: the audio stream is
//! neither held nor computed. Joint audio-video training (`audio`): the blocks hold both streams and the
//! audio-video cross-attentions, and the step counts the audio tokens (25 latent frames a second of the clip) in
//! the saved inputs, the tapes and the shared tables too. First-frame conditioning (on unless
//! `training.first_frame_conditioning_p` is 0) makes the video's AdaLN rows per token: each block's tape holds them
//! at every token, in f32. Samples during training ([`super::samples`]) hold the video VAE and the prompts'
//! connector outputs on the device for the whole run, denoise at the sample's size (with a `--i` prompt's clean
//! first-frame tokens) and decode in ltx-core's tiles; a joint run's samples have sound: they also hold the audio
//! VAE's decoder, the vocoder and the audio connector's outputs, denoise the audio tokens (25 latent frames a second)
//! and decode them through the vocoder after the video.

use framesmith_config::RunConfig;
use framesmith_models::ltx2::audio::identify_audio;
use framesmith_models::ltx2::vae::{identify_vae, Ltx2VaeConfig, VaeTiling};
use framesmith_models::ltx2::weights::{audio_stream_shapes, video_stream_shapes};
use framesmith_models::ltx2::Ltx2Config;
use framesmith_nn::lora::{LoraError, LoraFamily};

use super::denoise::audio_latent_frames;
use super::items::{audio_context_width, context_width, VAE_FACTOR, VAE_TEMPORAL};
use super::pipeline::{DEFAULT_GUIDANCE, FPS};
use super::train::{dit_config, first_frame_conditioning_p, is_ltx2_file};
use crate::family::image::plan::{
    block_buffers, dual_stream_block_kind, dual_stream_shape, family_lora_parameters,
    latent_frames, plan_model_of, spread_streamed_blocks, token_grid, weights_by_component,
    PlanNames, TapeCounts,
};
use crate::family::Family;
use crate::plan::{chunked_decode_bytes, settle_sampling, SampleShape, SamplingMemory};
use crate::plan::{
    dtype_bytes, step_tokens, BlockKind, ModelMemory, PlanError, PlanInput, StepShape,
};
use crate::plan::{AdapterCount, DescribeModel, LoraShape, PlanModel};

/// LTX-2's transformer as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Ltx2PlanModel {
    pub config: Ltx2Config,
    /// Both streams trained (the caches hold audio latents).
    pub audio: bool,
    /// The video VAE samples decode with, when the checkpoint (or `model.vae`) holds one.
    pub vae: Option<PlanVae>,
    /// First-frame conditioning may fire (its probability is above 0): per-token AdaLN rows.
    pub first_frame_conditioning: bool,
    /// What the samples' sound is decoded with (a joint run's samples have sound).
    pub sound: Option<PlanSound>,
}

/// The audio VAE's decoder and the vocoder as the planner sees them.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSound {
    /// Elements of their weights.
    pub parameters: u64,
    /// The vocoder's first width and its upsampling rates (its widest activation), and the sound's sample rate.
    pub vocoder_channels: usize,
    pub upsample_rates: Vec<usize>,
    pub sampling_rate: usize,
}

impl PlanSound {
    /// The decoder and vocoder of the first of `paths` that holds both, from the file's header.
    pub fn of_files(paths: &[&std::path::Path]) -> Option<Self> {
        paths.iter().find_map(|p| {
            let file = identify_audio(p).ok().filter(|f| f.decoder)?;
            let vocoder = file.vocoder?;
            Some(Self {
                parameters: file.decode_parameters,
                vocoder_channels: vocoder.vocoder.upsample_initial_channel,
                upsample_rates: vocoder.vocoder.upsample_rates.clone(),
                sampling_rate: vocoder.output_sampling_rate(),
            })
        })
    }
}

/// The video VAE as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanVae {
    pub config: Ltx2VaeConfig,
    /// Elements of its weights.
    pub parameters: u64,
}

impl PlanVae {
    /// The VAE of the run config `cfg` (`model.vae`, else `model.dit`), from the file's header; `None` when
    /// neither holds one.
    pub fn of_run(cfg: &RunConfig) -> Option<Self> {
        let m = &cfg.model;
        let path = if m.vae.as_os_str().is_empty() {
            &m.dit
        } else {
            &m.vae
        };
        Self::of_file(path)
    }

    /// The VAE of the file at `path`, from its header.
    pub fn of_file(path: &std::path::Path) -> Option<Self> {
        identify_vae(path).ok().map(|file| Self {
            config: file.config,
            parameters: file.parameters,
        })
    }
}

impl DescribeModel for Ltx2PlanModel {
    fn family(&self) -> &'static dyn Family {
        &super::Ltx2Family
    }

    fn describe(&self, input: &PlanInput) -> Result<ModelMemory, PlanError> {
        describe(self, input)
    }

    fn num_blocks(&self) -> usize {
        self.config.num_layers
    }

    fn settle(&self, cfg: &RunConfig, input: &mut PlanInput) {
        settle_sampling(
            cfg,
            input,
            |spec| spec.clip_frames(),
            |spec| spec.guidance.unwrap_or(DEFAULT_GUIDANCE) > 1.0,
        );
    }

    fn sampling(
        &self,
        input: &PlanInput,
        sample: &SampleShape,
    ) -> Result<Option<SamplingMemory>, PlanError> {
        Ok(Some(sampling(self, input, sample)))
    }
}

/// What LTX-2's samples of `sample` hold and add: the VAE (when the plan knows it) and each prompt's connector
/// output (and its negative prompt's) for the whole run; the denoising's f32 tokens (the latents, the prompt's and
/// the negative prompt's denoised latents, the guided ones, the velocity); the decode of one of ltx-core's default
/// tiles at a time, its widest activations the decoder's last stage (its base width over every frame and pixel of
/// the tile, before the un-patchify), counted as a chunked decoder's, beside the blended f32 clip and its RGB8
/// conversion.
fn sampling(model: &Ltx2PlanModel, input: &PlanInput, sample: &SampleShape) -> SamplingMemory {
    let c = dtype_bytes(input.compute);
    let cfg = &model.config;
    let vae = model.vae.as_ref();
    let (space, time) = vae.map_or((VAE_FACTOR, VAE_TEMPORAL), |v| v.config.decoder_factors());
    let (frames, pixels) = (sample.frames as u64, (sample.width * sample.height) as u64);
    let latent_frames = (sample.frames.max(1) as u64 - 1) / time as u64 + 1;
    let tokens = latent_frames * pixels / (space * space) as u64;
    let latents = tokens * cfg.out_channels as u64 * 4;
    // With sound the audio's guidance runs the negative prompt whatever the video's.
    let passes = 1 + u64::from(sample.guided || model.sound.is_some());
    let prompts = sample.prompts as u64;
    let embeddings = prompts * passes * TEXT_TOKENS * context_width(cfg) as u64 * c;
    let mut held = Vec::with_capacity(4);
    if let Some(v) = vae {
        held.push(("video VAE".to_owned(), v.parameters * c));
    }
    held.push((
        format!("{prompts} prompts' connector outputs (and their negative prompts')"),
        embeddings,
    ));
    // A `--i` prompt's clean first-frame tokens, and the image's latents.
    let first_frame = 2 * pixels / (space * space) as u64 * cfg.out_channels as u64 * 4;
    let (audio_state, audio_decode) = match &model.sound {
        Some(sound) => {
            held.push((
                "audio VAE decoder and vocoder".to_owned(),
                sound.parameters * c,
            ));
            held.push((
                format!("{prompts} prompts' audio connector outputs"),
                prompts * passes * TEXT_TOKENS * audio_context_width(cfg) as u64 * c,
            ));
            let audio_frames = audio_latent_frames(sample.frames, FPS) as u64;
            (
                (3 + passes + 1) * audio_frames * cfg.audio_in_channels as u64 * 4,
                sound_decode_bytes(sound, audio_frames, c),
            )
        }
        None => (0, 0),
    };
    let tiles = VaeTiling::official();
    let side = |n: usize, axis: Option<framesmith_models::ltx2::vae::AxisTiles>| {
        axis.map_or(n, |a| n.min(a.tile)) as u64
    };
    let tile_frames = side(sample.frames, tiles.frames);
    let tile_pixels = side(sample.width, tiles.width) * side(sample.height, tiles.height);
    let (base, patch) = vae.map_or((128, 4), |v| {
        (v.config.decoder_base_channels, v.config.patch_size)
    });
    let video = 3 * frames * pixels;
    let video_decode = chunked_decode_bytes(
        base as u64,
        tile_frames,
        tile_pixels / (patch * patch).max(1) as u64,
        c,
    ) + video * 4
        + video * (4 + 1);
    SamplingMemory {
        held,
        denoise_state_bytes: (3 + passes + 1) * latents + audio_state + first_frame,
        // The sound is decoded before the video, each freed before the other.
        decode_bytes: video_decode.max(audio_decode),
        decoded_host_bytes: video * 2,
    }
}

/// The vocoder's working set for `audio_frames` latent frames (4 spectrogram frames each), at its widest stage
/// (the upsampling halves the width as it multiplies the length), ten such tensors alive as a chunked decoder's
/// are counted, beside the f32 stereo waveform.
fn sound_decode_bytes(sound: &PlanSound, audio_frames: u64, compute_bytes: u64) -> u64 {
    let mut length = audio_frames * 4;
    let mut widest = sound.vocoder_channels as u64 * length;
    for (i, rate) in sound.upsample_rates.iter().enumerate() {
        length *= *rate as u64;
        widest = widest.max((sound.vocoder_channels as u64 >> (i + 1)) * length);
    }
    let seconds = audio_frames as f64 / 25.0;
    let waveform = (seconds * sound.sampling_rate as f64) as u64 * 2 * 4;
    10 * widest * compute_bytes + waveform
}

/// The `model.variant` names that plan LTX-2.3 (22B) (a run trains LTX-2 or LTX-2.3 from its file, with
/// `variant = "auto"`).
pub const LTX2_NAMES: [&str; 3] = ["ltx-2.3", "ltx2.3", "ltx23"];

/// LTX-2.3 when the config names it (`model.variant = "ltx-2.3"`), or the release its `model.dit` is (with
/// `variant = "auto"`; reads the file's header, not its weights); `None` for any other model.
pub(crate) fn plan_model(cfg: &RunConfig) -> Option<Result<PlanModel, PlanError>> {
    let names = PlanNames {
        variants: &LTX2_NAMES,
        named: Ltx2Config::ltx23_22b,
        is_file: is_ltx2_file,
        read: dit_config,
    };
    let vae = PlanVae::of_run(cfg);
    let first_frame_conditioning = first_frame_conditioning_p(cfg) > 0.0;
    plan_model_of(cfg, &names, |config| {
        PlanModel::new(Ltx2PlanModel {
            config,
            audio: false,
            vae: vae.clone(),
            first_frame_conditioning,
            sound: None,
        })
    })
}

/// Text tokens per sample the plan counts: the connector's output of a caption padded to Gemma's 1024 tokens.
const TEXT_TOKENS: u64 = 1024;

/// The tensors the run reads: the video stream's, and the audio stream's too when `audio`.
fn shapes(cfg: &Ltx2Config, audio: bool) -> Vec<(String, Vec<usize>)> {
    let mut out = video_stream_shapes(cfg);
    if audio {
        out.extend(audio_stream_shapes(cfg));
    }
    out
}

/// Audio latent frames per second of a clip (16 kHz, a 160-sample hop, 4 spectrogram frames a latent frame).
const AUDIO_FRAMES_PER_SECOND: f64 = 25.0;
/// The frame rate a clip's duration is taken at (the official trainer's default).
const CLIP_FPS: f64 = 24.0;

/// The audio latent frames of a clip of `frames` video frames (musubi-tuner's length for a clip's audio).
pub fn audio_frames(frames: usize) -> usize {
    ((frames as f64 / CLIP_FPS * AUDIO_FRAMES_PER_SECOND) as usize).max(1)
}

/// The weights outside the blocks, all in the compute dtype, by component.
fn resident_weights(cfg: &Ltx2Config, audio: bool, compute: u64) -> Vec<(&'static str, u64)> {
    const GROUPS: [(&str, &str); 13] = [
        ("patchify_proj.", "latent and timestep embeddings"),
        ("adaln_single.", "latent and timestep embeddings"),
        ("prompt_adaln_single.", "latent and timestep embeddings"),
        ("caption_projection.", "caption projection"),
        ("proj_out.", "output norm and projection"),
        ("scale_shift_table", "output norm and projection"),
        (
            "audio_adaln_single.",
            "audio latent and timestep embeddings",
        ),
        (
            "audio_prompt_adaln_single.",
            "audio latent and timestep embeddings",
        ),
        ("av_ca_", "audio-video cross-attention embeddings"),
        ("audio_caption_projection.", "caption projection"),
        ("audio_proj_out.", "audio output norm and projection"),
        (
            "audio_scale_shift_table",
            "audio output norm and projection",
        ),
        (
            "audio_patchify_proj.",
            "audio latent and timestep embeddings",
        ),
    ];
    let all = shapes(cfg, audio);
    let read: Vec<_> = all
        .into_iter()
        .filter(|(name, _)| audio || !name.starts_with("audio_patchify_proj."))
        .collect();
    weights_by_component(&read, &GROUPS, compute)
}

/// The adapter's parameters and adapted linears for `lora` (the official trainer's LTX-2 targets).
fn lora_parameters(
    cfg: &Ltx2Config,
    audio: bool,
    lora: &LoraShape,
) -> Result<AdapterCount, LoraError> {
    family_lora_parameters(LoraFamily::Ltx2, &shapes(cfg, audio), lora)
}

/// The block's sizes for a step of `shape` with `text` text tokens in all: the tape and kept values [`describe`]
/// spells out; with `audio` (its tokens in all), the audio stream's and the cross-attentions' too.
fn block_kind(
    cfg: &Ltx2Config,
    input: &PlanInput,
    (shape, text): (&StepShape, u64),
    audio: Option<u64>,
) -> BlockKind {
    let d = cfg.inner_dim() as u64;
    let buffers = block_buffers(
        &shapes(cfg, audio.is_some()),
        "transformer_blocks.0.",
        input.base,
    );
    let dims = (d, 4 * d, cfg.num_attention_heads as u64);
    let counts = TapeCounts {
        f32_norms: 3,
        attentions: 2,
    };
    let mut kind = dual_stream_block_kind(&buffers, input, shape, dims, counts);
    let (c, r) = (shape.compute_bytes, input.lora.rank as u64);
    // The GELU's output is not taped (the backward recomputes it where `ff.net.2` has an adapter).
    kind.tape_bytes -= shape.tokens * 4 * d * c;
    kind.tape_bytes += 4 * text * d * c + 2 * text * r * c;
    if let Some(la) = audio {
        let ad = cfg.audio_inner_dim() as u64;
        let aheads = cfg.audio_num_attention_heads as u64;
        let audio_shape = StepShape {
            tokens: la,
            ..*shape
        };
        let mut stream =
            dual_stream_block_kind(&[], input, &audio_shape, (ad, 4 * ad, aheads), counts);
        stream.tape_bytes -= la * 4 * ad * c;
        let lv = shape.tokens;
        // Per direction: both modulated inputs, q, k, v before and after their norms, the output, the gates'
        // inputs at the cross-attention width, LoRA activations of four linears, the log-sum-exp.
        let cross = |lq: u64, lk: u64, dq: u64, dk: u64| {
            (lq * dq + lk * dk + 3 * lq * ad + 4 * lk * ad + lq * ad) * c
                + 4 * (lq + lk) * r * c
                + lq * aheads * 4
        };
        kind.tape_bytes += stream.tape_bytes
            + 4 * text * ad * c
            + 2 * text * r * c
            + cross(lv, la, d, ad)
            + cross(la, lv, ad, d);
    }
    kind
}

/// The LTX-2 transformer `cfg` for `input`.
///
/// A block runs RoPE self-attention over the video tokens, cross-attention from them to the text and a GELU-tanh
/// MLP of width `f` = 4d. Its tape is counted as the dual-stream blocks' (`L` video tokens, `d` width, `h` heads,
/// `r` rank, `c` / `s` compute and residual dtype bytes): `2·L·d·s` of residual stream, `3·L·d·4` of f32 norms,
/// `13·L·d·c` of modulated inputs, projections, roped q/k, v, gates and attention outputs, `L·f·c` of MLP
/// activations (the GELU's input: its output is not taped), `4·L·r·c` of LoRA activations and `2·L·h·4` of the two attentions' log-sum-exp; `"attention"`
/// checkpointing keeps `L·d·c + L·h·4`, `"attention_projection"` adds `2·L·d·c`; the text side of the
/// cross-attention (`T` text tokens, 1024 per sample) adds `4·T·d·c` (the modulated context, k before and after its
/// norm, v) and `2·T·r·c` (k's and v's LoRA activations). Every checkpointing that recomputes keeps each block's
/// text k (before its norm) and v from the forward for the recompute, `2·T·d·c` beside the saved input (counted
/// in it: they wait where it does). The blocks share the AdaLN rows, every block's modulation rows of the pass
/// (`n·(k + 2)·b·d·4`), the text context
/// `T·d·c` and the RoPE tables, cos and sin per head and pair over the video tokens: `L·d·c`. The working set
/// uses the
/// calibrated coefficients of [`crate::plan::WorkingSet`]; it is not yet measured on LTX-2.
///
/// With `audio`, the audio tokens `La` (25 a second of the clip at 24 fps, per sample) add the audio stream's tape
/// (the same terms at the audio width), its text side, and each audio-video cross-attention's (both modulated
/// inputs, q / k / v before and after their norms and the output at the cross-attention width, four linears'
/// LoRA activations, the log-sum-exp); the saved inputs `La·d_a·s`; the audio tables, text and the cross tables
/// `La·d_a·c + T·d_a·c + (L + La)·d_a·c`.
///
/// With first-frame conditioning (clips of more than one latent frame), each block's tape holds the video's
/// AdaLN rows per token in f32, `k·L·d·4` (`k` = 6, or 9 with LTX-2.3's cross-attention AdaLN; 4 rows more with
/// audio, the video side's audio-video scales and shifts), and the blocks share each token's row index `4·L`, the
/// second AdaLN row set per sample `b·(k + 4)·d·c` and the head's per-token embedding, shift and scale `3·L·d·c`.
pub(crate) fn describe(model: &Ltx2PlanModel, input: &PlanInput) -> Result<ModelMemory, PlanError> {
    let (cfg, audio) = (&model.config, model.audio);
    let clip = &input.clip;
    let (w, h) = token_grid(input, VAE_FACTOR)?;
    let f = latent_frames(clip.frames, VAE_TEMPORAL)?;
    let lora = lora_parameters(cfg, audio, &input.lora)?;
    let tokens = step_tokens((f * w * h) as u64, clip.batch)?;
    let text = clip.batch as u64 * TEXT_TOKENS;
    let (d, heads) = (cfg.inner_dim() as u64, cfg.num_attention_heads as u64);
    let compute = dtype_bytes(input.compute);
    let (shape, widths) = dual_stream_shape(input, tokens, (d, 4 * d, heads));
    let n = cfg.num_layers;
    let release = cfg.version().name();
    let audio_tokens = audio.then(|| clip.batch as u64 * audio_frames(clip.frames) as u64);
    let ad = cfg.audio_inner_dim() as u64;
    let (audio_saved, audio_shared) = match audio_tokens {
        Some(la) => (
            la * ad * shape.residual_bytes,
            la * ad * compute + text * ad * compute + (tokens + la) * ad * compute,
        ),
        None => (0, 0),
    };
    let streams = if audio {
        "video and audio streams"
    } else {
        "video stream"
    };
    let mut kind = block_kind(cfg, input, (&shape, text), audio_tokens);
    // Every block's modulation rows of the pass (its k AdaLN rows and the context's two), f32, formed at once.
    let pass_rows = n as u64 * (cfg.adaln_coefficient() as u64 + 2) * clip.batch as u64 * d * 4;
    let mut shared_inputs = vec![(
        "timestep embedding, modulation rows, text and RoPE tables",
        clip.batch as u64 * d * compute * 12
            + pass_rows
            + text * d * compute
            + tokens * d * compute
            + audio_shared,
    )];
    if model.first_frame_conditioning && f > 1 {
        let rows = cfg.adaln_coefficient() as u64 + if audio { 4 } else { 0 };
        kind.tape_bytes += rows * tokens * d * 4;
        shared_inputs.push((
            "per-token timesteps (first-frame conditioning)",
            4 * tokens + clip.batch as u64 * (rows + 4) * d * compute + 3 * tokens * d * compute,
        ));
    }
    Ok(ModelMemory {
        name: if cfg.inner_dim() == 4096 && n == 48 {
            match cfg.version() {
                framesmith_models::ltx2::Ltx2Version::Ltx2 => format!("LTX-2 (19B), {streams}"),
                framesmith_models::ltx2::Ltx2Version::Ltx23 => format!("LTX-2.3 (22B), {streams}"),
            }
        } else {
            format!("{release}-style ({n} blocks, width {d}), {streams}")
        },
        kinds: vec![kind],
        blocks: vec![0; n],
        streamed: (0..n.max(1))
            .map(|count| spread_streamed_blocks(n, count))
            .collect(),
        resident: resident_weights(cfg, audio, compute),
        lora,
        // The text keys and values each block keeps for its recompute wait with its input.
        saved_input_bytes: tokens * d * shape.residual_bytes + 2 * text * d * compute + audio_saved,
        shared_inputs,
        working_set_bytes: input.working_set.bytes_for(&widths, &shape),
        fragmentation_bytes: None,
        pixel_multiple: VAE_FACTOR,
        frame_step: VAE_TEMPORAL,
        shape,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
