//! `synth-project`: a training project of a real size, Wan, FLUX.1 [dev], Qwen-Image, HunyuanVideo 1.5 or LTX-2.3,
//! with nothing to download.

use anyhow::{bail, Result};

use crate::{variant, Clip};
use framesmith_bench::{self as bench};

/// `synth-project`'s arguments.
#[derive(clap::Args)]
pub(crate) struct SynthArgs {
    /// Model family: `wan` (the Wan `--variant`), `flux-dev` (FLUX.1 [dev] at its released size, one cached
    /// image of `--width` x `--height`; `--frames` and `--encoders` do not apply) or `qwen-image` (Qwen-Image at
    /// its released size, bf16 only, likewise), `hunyuan-video15` (HunyuanVideo 1.5 T2V at its released size,
    /// bf16 only, one cached clip of `--width` x `--height` x `--frames`) or `ltx2` (LTX-2.3 22B T2V: the video
    /// stream at its released size in the official single-file layout, bf16 only, one cached clip likewise) or
    /// `ltx2-text` (what `framesmith cache text` needs for LTX-2: a random Gemma 3 12B in ComfyUI's scaled-FP8
    /// layout, the `--release`'s checkpoint holding its text side, `--captions` captioned images).
    #[arg(long, default_value = "wan")]
    model: String,
    /// `ltx2-text`: whose text side, `ltx23` (LTX-2.3 22B) or `ltx2` (LTX-2 19B).
    #[arg(long, default_value = "ltx23")]
    release: String,
    /// Wan variant (t2v-1.3b, t2v-14b, i2v-14b, t2v-a14b, i2v-a14b, ti2v-5b).
    #[arg(long, default_value = "t2v-1.3b")]
    variant: String,
    #[command(flatten)]
    clip: Clip,
    /// Project folder.
    #[arg(long)]
    out: std::path::PathBuf,
    /// DiT weights: bf16, f16 or f32 in the official layout, or `fp8-scaled` (a ComfyUI scaled-FP8 single file);
    /// for FLUX.1 also `fp8` (plain float8_e4m3fn block weights under the official names).
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// LoRA rank (and alpha) of a FLUX.1, Qwen-Image or HunyuanVideo 1.5 project's run config (Wan projects use
    /// 32).
    #[arg(long, default_value_t = 16)]
    rank: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Text-embedding tokens (umT5 writes up to 512; FLUX.1 [dev]'s T5 always 512).
    #[arg(long, default_value_t = 32)]
    text_tokens: usize,
    /// Optimizer steps of the run config.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Also write random umT5-XXL (ComfyUI scaled FP8) and Wan VAE weights (Wan2.2's for ti2v-5b, else Wan2.1's)
    /// at their real sizes, with this SentencePiece model embedded as the umT5 file's tokenizer, for `framesmith
    /// cache` runs.
    #[arg(long, value_name = "SPIECE_MODEL")]
    encoders: Option<std::path::PathBuf>,
    /// FLUX.1: also write random `ae.safetensors`, CLIP-L and T5-XXL at their released sizes (with stand-in
    /// tokenizers) and `prompts.txt`, for runs that sample during training. Qwen-Image: also write a random
    /// Qwen2.5-VL-7B (ComfyUI scaled FP8), a random VAE and `--captions` captioned images (`captions.toml`) for
    /// `cache text`, samples and `generate`. HunyuanVideo 1.5: also write its random VAE, Qwen2.5-VL-7B (ComfyUI
    /// scaled FP8) and byT5 glyph encoder at their released sizes, for `generate` and samples.
    #[arg(long)]
    sample_files: bool,
    /// HunyuanVideo 1.5: cache the clip's image-to-video conditioning (first-frame latents, SigLIP features) too,
    /// and train image-to-video.
    #[arg(long)]
    i2v: bool,
    /// LTX-2 only: write the audio stream and the audio-video cross-attentions too, and the clip's audio latent
    /// cache and audio text (joint audio-video training).
    #[arg(long)]
    audio: bool,
    /// LTX-2 only: write the first N transformer blocks of the release instead of all 48 (the `config`
    /// metadata says so, which the official model code reads too): a short trial of the step at the real width and
    /// sequence, with a file of a few GB.
    #[arg(long)]
    layers: Option<usize>,
    /// Qwen-Image with --sample-files, and ltx2-text: how many captioned images to write.
    #[arg(long, default_value_t = 100)]
    captions: usize,
    /// Control images cached with the image (each of its size), for an edit LoRA: `qwen-image` any number
    /// (Qwen-Image-Edit: 1; Edit-2509: several), `flux-dev` 1 (FLUX.1 Kontext [dev]: the DiT is named as Kontext's).
    #[arg(long, default_value_t = 0)]
    controls: usize,
}

/// Writes the synthetic FLUX.1 [dev] project and says what it wrote.
fn synth_flux_project(args: &SynthArgs) -> Result<()> {
    if args.encoders.is_some() {
        bail!("--encoders is for Wan projects: a FLUX.1 project trains from its caches alone");
    }
    if args.controls > 1 {
        bail!(
            "--controls {}: FLUX.1 Kontext [dev] edits one image; give --controls 1",
            args.controls
        );
    }
    let spec = bench::synth_flux::FluxSynthProject {
        cfg: framesmith_models::flux::FluxConfig::dev(),
        height: args.clip.height,
        width: args.clip.width,
        dit: bench::synth_flux::FluxDitFormat::parse(&args.dtype)?,
        seed: args.seed,
        text_tokens: args.text_tokens,
        steps: args.steps,
        rank: args.rank,
        kontext: args.controls == 1,
    };
    let files = bench::synth_flux::write_flux_project(&args.out, &spec)?;
    if args.sample_files {
        let sizes = bench::synth_flux_samples::FluxEncoderSizes::released();
        let dir = files.dit.parent().unwrap_or(&args.out);
        let samples = bench::synth_flux_samples::write_flux_sample_files(
            dir,
            &sizes,
            (spec.width, spec.height),
            spec.seed,
        )?;
        println!(
            "wrote {}, {}, {}, {}",
            samples.autoencoder.display(),
            samples.clip_l.display(),
            samples.t5.display(),
            samples.prompts.display()
        );
    }
    println!("{}", files.wrote_line());
    Ok(())
}

/// Writes the synthetic Qwen-Image project and says what it wrote.
fn synth_qwen_image_project(args: &SynthArgs) -> Result<()> {
    use framesmith_bench::synth_qwen_image as qi;
    if args.encoders.is_some() || args.dtype != "bf16" {
        bail!("a Qwen-Image project is a bf16 DiT trained from its caches: drop --encoders and --dtype");
    }
    let encoder = framesmith_models::qwen25vl::Qwen25VlTextConfig::qwen25_vl_7b();
    let spec = qi::QwenImageSynthProject {
        cfg: framesmith_models::qwen_image::QwenImageConfig::qwen_image(),
        height: args.clip.height,
        width: args.clip.width,
        seed: args.seed,
        text_tokens: args.text_tokens,
        steps: args.steps,
        rank: args.rank,
        captions: args.sample_files.then_some((args.captions, encoder)),
        controls: args.controls,
    };
    let files = qi::write_qwen_image_project(&args.out, &spec)?;
    if let Some((encoder, captions)) = &files.captions {
        println!("wrote {}, {}", encoder.display(), captions.display());
    }
    if let Some(vae) = &files.vae {
        println!("wrote {}", vae.display());
    }
    println!("{}", files.project.wrote_line());
    Ok(())
}

/// Writes the synthetic HunyuanVideo 1.5 project and says what it wrote.
fn synth_hv15_project(args: &SynthArgs) -> Result<()> {
    use framesmith_bench::synth_hunyuan_video15 as hv;
    if args.encoders.is_some() || args.dtype != "bf16" {
        bail!(
            "a HunyuanVideo 1.5 project is a bf16 DiT trained from its caches: drop --encoders and --dtype"
        );
    }
    let spec = hv::Hv15SynthProject {
        cfg: framesmith_models::hunyuan_video15::HunyuanVideo15Config::hunyuan_video15(),
        height: args.clip.height,
        width: args.clip.width,
        frames: args.clip.frames,
        seed: args.seed,
        text_tokens: args.text_tokens,
        steps: args.steps,
        rank: args.rank,
        i2v: args.i2v,
    };
    let files = hv::write_hv15_project(&args.out, &spec)?;
    if args.sample_files {
        let samples = framesmith_bench::synth_hunyuan_video15_samples::write_hv15_sample_files(
            &args.out, args.seed,
        )?;
        println!(
            "wrote {}, {}, {}",
            samples.vae.display(),
            samples.text_encoder.display(),
            samples.glyph.display()
        );
    }
    println!("{}", files.wrote_line());
    Ok(())
}

/// Writes the synthetic LTX-2.3 project and says what it wrote.
fn synth_ltx2_project(args: &SynthArgs) -> Result<()> {
    use framesmith_bench::synth_ltx2 as ltx;
    if args.encoders.is_some() || args.sample_files || args.i2v || args.dtype != "bf16" {
        bail!(
            "an LTX-2 project is a bf16 DiT trained text-to-video (with --audio: and audio) from its caches: drop \
             --encoders, --sample-files, --i2v and --dtype"
        );
    }
    let mut cfg = framesmith_models::ltx2::Ltx2Config::ltx23_22b();
    if let Some(layers) = args.layers {
        if layers == 0 || layers > cfg.num_layers {
            bail!("--layers {layers}: give 1 to {}", cfg.num_layers);
        }
        cfg.num_layers = layers;
    }
    let spec = ltx::Ltx2SynthProject {
        cfg,
        height: args.clip.height,
        width: args.clip.width,
        frames: args.clip.frames,
        seed: args.seed,
        text_tokens: args.text_tokens,
        steps: args.steps,
        rank: args.rank,
        audio: args.audio,
    };
    let files = ltx::write_ltx2_project(&args.out, &spec)?;
    println!("{}", files.wrote_line());
    Ok(())
}

/// Writes what `framesmith cache text` needs for LTX-2 and says what it wrote.
fn synth_ltx2_text(args: &SynthArgs) -> Result<()> {
    use framesmith_models::ltx2::Ltx2Version;
    let version = match args.release.as_str() {
        "ltx2" => Ltx2Version::Ltx2,
        "ltx23" => Ltx2Version::Ltx23,
        other => bail!("--release {other}: give ltx2 (LTX-2 19B) or ltx23 (LTX-2.3 22B)"),
    };
    let files = framesmith_bench::synth_ltx2_text::write_ltx2_text_files(
        &args.out,
        version,
        args.captions,
        args.seed,
    )?;
    println!(
        "wrote {}, {}, {}",
        files.gemma.display(),
        files.checkpoint.display(),
        files.captions.display()
    );
    Ok(())
}

/// Writes the synthetic project and says what it wrote.
pub(crate) fn synth_project(args: &SynthArgs) -> Result<()> {
    if (args.audio || args.layers.is_some()) && args.model != "ltx2" {
        bail!("--audio and --layers are for LTX-2 projects (--model ltx2)");
    }
    match args.model.as_str() {
        "wan" => {}
        "flux-dev" => return synth_flux_project(args),
        "qwen-image" => return synth_qwen_image_project(args),
        "hunyuan-video15" => return synth_hv15_project(args),
        "ltx2" => return synth_ltx2_project(args),
        "ltx2-text" => return synth_ltx2_text(args),
        other => bail!(
            "unknown model `{other}` for synth-project (wan, flux-dev, qwen-image, hunyuan-video15, ltx2, \
             ltx2-text)"
        ),
    }
    if args.sample_files {
        bail!("--sample-files is for FLUX.1 projects (--model flux-dev); Wan projects take --encoders");
    }
    if args.controls > 0 {
        bail!("--controls is for edit models (--model flux-dev or qwen-image)");
    }
    let dit = bench::synth::DitFormat::parse(&args.dtype)?;
    let spec = bench::synth::SynthProject {
        cfg: variant(&args.variant)?,
        frames: args.clip.frames,
        height: args.clip.height,
        width: args.clip.width,
        dit,
        seed: args.seed,
        text_tokens: args.text_tokens,
        steps: args.steps,
        encoders: args.encoders.clone(),
    };
    let files = bench::synth::write_project(&args.out, &spec)?;
    let cache = if files.latents.as_os_str().is_empty() {
        "no cache (image-to-video: `framesmith cache latents --dit`)".to_string()
    } else {
        files.latents.display().to_string()
    };
    println!(
        "wrote {} ({:.2} GiB), {cache}, {}, {}",
        files.dit.display(),
        files.dit_bytes as f64 / (1u64 << 30) as f64,
        files.dataset.display(),
        files.run.display()
    );
    Ok(())
}
