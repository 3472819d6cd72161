//! `framesmith generate`: the command line over the engine's generation call ([`framesmith_engine::generate::run`]):
//! the flags become a request, the engine's log lines go to stderr (with a progress bar over the denoising steps on
//! a terminal) and what it wrote to stdout. A video model's DiT makes a clip (MP4 plus its PNG frames); an image
//! model's, an image.

use std::path::PathBuf;

use candle_core::DType;
use clap::Args;
use framesmith_config::run::DeviceSpec;
use framesmith_engine::generate::request::{
    CompanionFiles, DitSource, GenerationEvent, GenerationOutput, GenerationRequest, LoraChoice,
    Placement,
};
use framesmith_engine::generate::sampler::Solver;
use framesmith_nn::fp8::Fp8Scale;
use indicatif::ProgressBar;

use super::models::{progress_bar, DtypeArg};

/// `--solver`: the engine's solver names, listed in `--help` and checked by clap.
fn solver_parser() -> impl clap::builder::TypedValueParser<Value = Solver> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Solver::NAMES).try_map(|name| name.parse::<Solver>())
}

/// `--fp8`: nn's FP8 scale names, listed in `--help` and checked by clap.
fn fp8_parser() -> impl clap::builder::TypedValueParser<Value = Fp8Scale> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Fp8Scale::NAMES)
        .try_map(|name| name.parse::<Fp8Scale>())
}

/// `generate` options.
#[derive(Args)]
pub struct GenerateArgs {
    /// DiT checkpoint (file or folder); its family decides whether a clip or an image is made and which of the
    /// flags below it takes (see "Model families")
    #[arg(long)]
    dit: PathBuf,
    /// Low-noise expert of a model of two experts (denoises below the boundary)
    #[arg(long)]
    dit_low_noise: Option<PathBuf>,
    /// Switch to the low-noise expert below this fraction of the timesteps (default: the model's; 0.875 T2V, 0.9 I2V)
    #[arg(long, allow_negative_numbers = true)]
    boundary: Option<f64>,
    /// LoRA for the DiT, FILE or FILE:MULTIPLIER; repeat for several
    #[arg(long = "lora", value_name = "FILE[:MULT]")]
    loras: Vec<String>,
    /// LoRA for the low-noise expert, FILE or FILE:MULTIPLIER; repeat for several
    #[arg(long = "lora-low-noise", value_name = "FILE[:MULT]")]
    loras_low_noise: Vec<String>,
    /// Text encoder weights, for a family with one text encoder
    #[arg(long)]
    text_encoder: Option<PathBuf>,
    /// The text encoder's (or --t5's) tokenizer, tokenizer.json or spiece.model (default: one beside its
    /// weights)
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// T5-XXL weights, for a family with T5-XXL and CLIP-L text encoders
    #[arg(long)]
    t5: Option<PathBuf>,
    /// CLIP-L text encoder weights (clip_l.safetensors), with --t5
    #[arg(long)]
    clip_l: Option<PathBuf>,
    /// CLIP-L's tokenizer.json (default: one beside clip_l.safetensors)
    #[arg(long)]
    clip_l_tokenizer: Option<PathBuf>,
    /// The byT5 glyph encoder of HunyuanVideo 1.5 (byt5_small_glyphxl_fp16.safetensors, or the release's
    /// Glyph-SDXL-v2 folder; default: the one beside --text-encoder)
    #[arg(long)]
    byt5: Option<PathBuf>,
    /// The VAE (or autoencoder) of the DiT's family
    #[arg(long)]
    vae: PathBuf,
    /// Start image (PNG, JPEG, WebP, BMP) for image-to-video models; centre-cropped to the clip's aspect ratio
    #[arg(long)]
    image: Option<PathBuf>,
    /// An image an edit model edits (repeat the flag for a model that takes several; see "Model families"); the
    /// output takes the first one's size unless --width / --height are given
    #[arg(long = "control")]
    controls: Vec<PathBuf>,
    /// Image encoder (CLIP or SigLIP, see "Model families"), for an image-to-video model that takes one
    #[arg(long, visible_alias = "image-encoder")]
    clip: Option<PathBuf>,
    /// What the clip shows
    #[arg(long)]
    prompt: String,
    /// Negative prompt (default: the model's official one, used when --guidance > 1)
    #[arg(long)]
    negative: Option<String>,
    /// Width (default: the family's; with --image and no size given, the official size for the image's aspect
    /// ratio)
    #[arg(long)]
    width: Option<usize>,
    /// Height (default: the family's; see --width)
    #[arg(long)]
    height: Option<usize>,
    /// Frames, 4k + 1 (default 81)
    #[arg(long)]
    frames: Option<usize>,
    /// Sampling steps (default: the family's)
    #[arg(long)]
    steps: Option<usize>,
    /// Flow shift of the sampling schedule (default: the family's)
    #[arg(long, allow_negative_numbers = true)]
    shift: Option<f64>,
    /// Guidance: the classifier-free guidance scale, 1 turns it off, or the distilled guidance strength of a
    /// guidance-distilled model (default: the family's)
    #[arg(long, allow_negative_numbers = true)]
    guidance: Option<f64>,
    /// Noise seed (default: random, printed)
    #[arg(long)]
    seed: Option<u64>,
    /// Solver (default: the family's)
    #[arg(long, value_parser = solver_parser())]
    solver: Option<Solver>,
    /// auto, cpu, cuda or cuda:N
    #[arg(long, default_value = "auto")]
    device: DeviceSpec,
    /// CUDA GPUs to run on, instead of --device: one (`--gpus 1`, as --device cuda:1), or for two experts two
    /// (`--gpus 0,1`): the high-noise expert on the first, the low-noise expert on the second, both resident
    /// (nothing parked in RAM; --vram-budget-gb and --blocks-to-swap then apply to each card)
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "IDS",
        conflicts_with = "device"
    )]
    gpus: Vec<usize>,
    /// Compute dtype (default: bf16 on a GPU, f32 on the CPU)
    #[arg(long, value_enum)]
    dtype: Option<DtypeArg>,
    /// Keep the DiT's block weights in FP8 with these scales (about half the memory of bf16)
    #[arg(long, value_parser = fp8_parser())]
    fp8: Option<Fp8Scale>,
    /// Decode in overlapping spatial tiles (less memory for large frames; approximate)
    #[arg(long)]
    tiled: bool,
    /// Make the clip's sound too, and fail where it cannot be made (a model that makes sound, LTX-2's audio-video
    /// checkpoints, makes it by default when its file holds the audio VAE and vocoder)
    #[arg(long, conflicts_with = "no_sound")]
    sound: bool,
    /// Video only, for a model that would make sound
    #[arg(long)]
    no_sound: bool,
    /// Blocks of each DiT kept in RAM and streamed to the GPU as they run (block swap), for cards too small for
    /// the whole model; with two experts on one GPU, the one not in use waits in RAM either way
    #[arg(long, default_value_t = 0)]
    blocks_to_swap: usize,
    /// Use at most this many GiB of the card (the rest is held back for the command's lifetime), so a run that
    /// fits here fits a card of that size; with --gpus 0,1, of each card
    #[arg(long)]
    vram_budget_gb: Option<f64>,
    /// The file to write: an MP4 for a clip (its PNG frames go to a `<name>_frames` folder beside it), a PNG for an
    /// image
    #[arg(long)]
    out: PathBuf,
}

impl GenerateArgs {
    /// The engine's request for these flags.
    fn request(&self) -> anyhow::Result<GenerationRequest> {
        let loras = |specs: &[String]| specs.iter().map(|s| LoraChoice::parse(s)).collect();
        Ok(GenerationRequest {
            dit: DitSource::File(self.dit.clone()),
            dit_low_noise: self.dit_low_noise.clone(),
            boundary: self.boundary,
            loras: loras(&self.loras),
            loras_low_noise: loras(&self.loras_low_noise),
            files: CompanionFiles {
                vae: Some(self.vae.clone()),
                text_encoder: self.text_encoder.clone(),
                tokenizer: self.tokenizer.clone(),
                t5: self.t5.clone(),
                clip_l: self.clip_l.clone(),
                clip_l_tokenizer: self.clip_l_tokenizer.clone(),
                clip: self.clip.clone(),
                byt5: self.byt5.clone(),
            },
            image: self.image.clone(),
            controls: self.controls.clone(),
            prompt: self.prompt.clone(),
            negative: self.negative.clone(),
            width: self.width,
            height: self.height,
            frames: self.frames,
            steps: self.steps,
            shift: self.shift,
            guidance: self.guidance,
            seed: self.seed,
            solver: self.solver,
            placement: Placement {
                device: self.device,
                gpus: self.gpus.clone(),
            },
            dtype: self.dtype.map(DType::from),
            fp8: self.fp8,
            tiled: self.tiled,
            sound: match (self.sound, self.no_sound) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            blocks_to_swap: self.blocks_to_swap,
            vram_budget_bytes: super::models::vram_budget_bytes(self.vram_budget_gb)?,
            out: self.out.clone(),
        })
    }
}

/// What the command prints as the engine works: log lines on stderr, and on a terminal a bar over the steps
/// (cleared before the next line).
#[derive(Default)]
struct Printer {
    bar: Option<ProgressBar>,
}

impl Printer {
    fn event(&mut self, event: GenerationEvent) {
        match event {
            GenerationEvent::Log(line) => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                eprintln!("{line}");
            }
            GenerationEvent::StepStarted { steps, .. } => self
                .bar
                .get_or_insert_with(|| {
                    progress_bar(
                        steps as u64,
                        "{bar:30} {pos}/{len} steps  [{elapsed_precise} < {eta_precise}]",
                    )
                })
                .inc(1),
        }
    }
}

/// The line saying what was written.
fn wrote_line(output: &GenerationOutput) -> String {
    match &output.frames_dir {
        Some(frames) => format!(
            "wrote {} ({} frames) and {}",
            output.file.display(),
            output.frames,
            frames.display()
        ),
        None => format!(
            "wrote {} ({}x{})",
            output.file.display(),
            output.width,
            output.height
        ),
    }
}

/// Runs `generate`: a clip or an image, as the family of the `--dit` file makes.
pub fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    let request = args.request()?;
    let mut printer = Printer::default();
    let output = framesmith_engine::generate::run(&request, &mut |e| printer.event(e), &|| false)?;
    if let Some(bar) = printer.bar.take() {
        bar.finish_and_clear();
    }
    println!("{}", wrote_line(&output));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: GenerateArgs,
    }

    fn try_parse(extra: &[&str]) -> Result<GenerateArgs, clap::Error> {
        let base = [
            "x",
            "--dit",
            "d",
            "--text-encoder",
            "t",
            "--vae",
            "v",
            "--prompt",
            "p",
            "--out",
            "o",
        ];
        let all: Vec<&str> = base.iter().chain(extra).copied().collect();
        <Cli as clap::Parser>::try_parse_from(all).map(|c| c.args)
    }

    fn parse(extra: &[&str]) -> GenerateArgs {
        try_parse(extra).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_solver_is_the_engines_by_name() {
        assert_eq!(parse(&[]).solver, None);
        assert_eq!(parse(&["--solver", "unipc"]).solver, Some(Solver::Unipc));
        assert_eq!(parse(&["--solver", "dpmpp"]).solver, Some(Solver::Dpmpp));
        assert_eq!(parse(&["--solver", "euler"]).solver, Some(Solver::Euler));
        let err = try_parse(&["--solver", "ddim"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("ddim") && err.contains("dpmpp"), "{err}");
    }

    #[test]
    fn the_fp8_scale_is_nns_by_name() {
        assert_eq!(parse(&[]).fp8, None);
        assert_eq!(parse(&["--fp8", "tensor"]).fp8, Some(Fp8Scale::Tensor));
        assert_eq!(parse(&["--fp8", "channel"]).fp8, Some(Fp8Scale::Channel));
        assert_eq!(parse(&["--fp8", "block64"]).fp8, Some(Fp8Scale::Block64));
        let err = try_parse(&["--fp8", "block32"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("block32") && err.contains("channel"), "{err}");
    }

    #[test]
    fn the_flags_become_the_engines_request() -> anyhow::Result<()> {
        let args = parse(&[
            "--lora",
            "a.safetensors:0.5",
            "--lora",
            "b.safetensors",
            "--gpus",
            "1,0",
            "--dtype",
            "f16",
            "--vram-budget-gb",
            "2",
            "--seed",
            "3",
        ]);
        let request = args.request()?;
        assert_eq!(request.dit, DitSource::File("d".into()));
        assert_eq!(
            request.loras,
            vec![
                LoraChoice {
                    path: "a.safetensors".into(),
                    strength: 0.5
                },
                LoraChoice {
                    path: "b.safetensors".into(),
                    strength: 1.0
                }
            ]
        );
        assert_eq!(request.placement.gpus, vec![1, 0]);
        assert_eq!(request.dtype, Some(DType::F16));
        assert_eq!(request.vram_budget_bytes, Some(2 << 30));
        assert_eq!(request.files.vae, Some(PathBuf::from("v")));
        assert_eq!((request.seed, request.steps), (Some(3), None));
        assert_eq!(request.sound, None);
        assert_eq!(parse(&["--sound"]).request()?.sound, Some(true));
        assert_eq!(parse(&["--no-sound"]).request()?.sound, Some(false));
        assert!(try_parse(&["--sound", "--no-sound"]).is_err());
        let err = parse(&["--vram-budget-gb", "0"])
            .request()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("positive number of GiB"), "{err}");
        Ok(())
    }

    #[test]
    fn gpus_and_device_are_exclusive() {
        let err = try_parse(&["--gpus", "0", "--device", "cpu"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--gpus") && err.contains("--device"), "{err}");
    }

    #[test]
    fn the_wrote_line_names_a_clips_frames_or_an_images_size() {
        let clip = GenerationOutput {
            file: "a.mp4".into(),
            frames_dir: Some("a_frames".into()),
            frames: 5,
            width: 32,
            height: 48,
            seed: 1,
        };
        assert_eq!(wrote_line(&clip), "wrote a.mp4 (5 frames) and a_frames");
        let image = GenerationOutput {
            frames_dir: None,
            file: "a.png".into(),
            ..clip
        };
        assert_eq!(wrote_line(&image), "wrote a.png (32x48)");
    }
}
