//! What [`crate::generate::run`] takes and gives, as plain data: the request (model files, LoRAs with strengths,
//! prompt, seed, size, steps, guidance, solver, device and VRAM budget, output file), the events it reports while it
//! works and the files it wrote. Options a family does not use are refused by that family, by their flag names.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use framesmith_config::run::DeviceSpec;
use framesmith_nn::device::DeviceError;
use framesmith_nn::fp8::Fp8Scale;

use crate::generate::sampler::Solver;

/// The DiT to generate with.
#[derive(Debug, Clone, PartialEq)]
pub enum DitSource {
    /// A checkpoint file or folder; which family it belongs to is read from it.
    File(PathBuf),
    /// The built-in tiny demo model (no files; its LoRAs come from `framesmith demo` or the app's demo project).
    Demo,
}

/// A LoRA and the strength (multiplier) it is applied at.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraChoice {
    pub path: PathBuf,
    pub strength: f64,
}

impl LoraChoice {
    /// `FILE` or `FILE:MULT` (the multiplier only when what follows the last `:` is a number, so `C:\x` stays a
    /// path).
    pub fn parse(spec: &str) -> Self {
        let whole = || Self {
            path: PathBuf::from(spec),
            strength: 1.0,
        };
        match spec.rsplit_once(':') {
            Some((path, mult)) if !path.is_empty() => match mult.parse::<f64>() {
                Ok(strength) => Self {
                    path: PathBuf::from(path),
                    strength,
                },
                Err(_) => whole(),
            },
            _ => whole(),
        }
    }
}

/// The files a DiT generates with besides itself; each family takes the ones it needs and refuses the others.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CompanionFiles {
    /// The VAE (or autoencoder) weights.
    pub vae: Option<PathBuf>,
    /// A umT5 text encoder's weights.
    pub text_encoder: Option<PathBuf>,
    /// The text encoder's tokenizer (default: one beside or inside its weights).
    pub tokenizer: Option<PathBuf>,
    /// A T5-XXL encoder's weights.
    pub t5: Option<PathBuf>,
    /// A CLIP-L text encoder's weights and its tokenizer.
    pub clip_l: Option<PathBuf>,
    pub clip_l_tokenizer: Option<PathBuf>,
    /// A CLIP image encoder's weights (image-to-video models that take CLIP features).
    pub clip: Option<PathBuf>,
    /// A byT5 glyph encoder's weights (HunyuanVideo 1.5; default: the one beside the text encoder).
    pub byt5: Option<PathBuf>,
}

/// Where generation runs: `device`, unless `gpus` names CUDA GPUs (one; or two for a DiT pair, one each).
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub device: DeviceSpec,
    pub gpus: Vec<usize>,
}

impl Default for Placement {
    fn default() -> Self {
        Self {
            device: DeviceSpec::Auto,
            gpus: Vec::new(),
        }
    }
}

/// One generation: what to make, with which files, where; `None` settings take the family's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    pub dit: DitSource,
    /// A second expert that denoises below the boundary (a two-expert DiT pair).
    pub dit_low_noise: Option<PathBuf>,
    /// The fraction of the timesteps below which the second expert takes over.
    pub boundary: Option<f64>,
    pub loras: Vec<LoraChoice>,
    pub loras_low_noise: Vec<LoraChoice>,
    pub files: CompanionFiles,
    /// The start image of an image-to-video clip.
    pub image: Option<PathBuf>,
    /// The images an edit model edits (its control images: as many as the model takes), in order.
    pub controls: Vec<PathBuf>,
    pub prompt: String,
    pub negative: Option<String>,
    pub width: Option<usize>,
    pub height: Option<usize>,
    pub frames: Option<usize>,
    pub steps: Option<usize>,
    pub shift: Option<f64>,
    pub guidance: Option<f64>,
    /// `None`: a random seed, reported in the log and the output.
    pub seed: Option<u64>,
    pub solver: Option<Solver>,
    pub placement: Placement,
    /// Compute dtype (default: bf16 on a GPU, f32 on the CPU).
    pub dtype: Option<DType>,
    /// Keep the DiT's block weights in FP8 with these scales.
    pub fp8: Option<Fp8Scale>,
    /// Decode in overlapping spatial tiles.
    pub tiled: bool,
    /// Sound with the clip, for a model that makes it: `Some(true)` required (refused where it cannot be made),
    /// `Some(false)` video only, `None` the family's default.
    pub sound: Option<bool>,
    /// Blocks of the DiT kept in RAM and streamed to the GPU as they run.
    pub blocks_to_swap: usize,
    /// Use at most this many bytes of the card (the rest is held back while generating).
    pub vram_budget_bytes: Option<u64>,
    /// The file to write: a clip's MP4 (its PNG frames go beside it), or an image's PNG.
    pub out: PathBuf,
}

impl GenerationRequest {
    /// A request for `prompt` with `dit`, written to `out`, every other setting left to the family.
    pub fn new(dit: DitSource, prompt: impl Into<String>, out: impl Into<PathBuf>) -> Self {
        Self {
            dit,
            dit_low_noise: None,
            boundary: None,
            loras: Vec::new(),
            loras_low_noise: Vec::new(),
            files: CompanionFiles::default(),
            image: None,
            controls: Vec::new(),
            prompt: prompt.into(),
            negative: None,
            width: None,
            height: None,
            frames: None,
            steps: None,
            shift: None,
            guidance: None,
            seed: None,
            solver: None,
            placement: Placement::default(),
            dtype: None,
            fp8: None,
            tiled: false,
            sound: None,
            blocks_to_swap: 0,
            vram_budget_bytes: None,
            out: out.into(),
        }
    }

    /// The DiT's path as messages name it (`demo` for the built-in model).
    pub fn dit_name(&self) -> String {
        match &self.dit {
            DitSource::File(path) => path.display().to_string(),
            DitSource::Demo => "the built-in demo model".into(),
        }
    }
}

/// What generation reports while it works.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// A line for the log: the files loaded, the seed and size, notes, the timings.
    Log(String),
    /// Denoising step `step` (from 0) of `steps` is starting.
    StepStarted { step: usize, steps: usize },
}

/// What generation wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationOutput {
    /// The clip's MP4, or the image's PNG.
    pub file: PathBuf,
    /// The clip's PNG frames (what the app's player shows); `None` for an image.
    pub frames_dir: Option<PathBuf>,
    /// Frames written (1 for an image).
    pub frames: usize,
    pub width: usize,
    pub height: usize,
    /// The seed the noise was drawn from.
    pub seed: u64,
}

/// Generation stopped by its cancel poll.
#[derive(Debug, thiserror::Error)]
#[error("generation cancelled")]
pub struct Cancelled;

/// The device `spec` names (`auto`: the first CUDA device if this build has one, else the CPU).
pub fn open_device(spec: DeviceSpec) -> anyhow::Result<Device> {
    let ordinal = match spec {
        DeviceSpec::Cpu => return Ok(Device::Cpu),
        DeviceSpec::Auto if framesmith_nn::device::usable_count() == 0 => return Ok(Device::Cpu),
        DeviceSpec::Auto => 0,
        DeviceSpec::Cuda(i) => i,
    };
    crate::user_cache::keep_attention_plans();
    framesmith_nn::device::open_cuda(ordinal).map_err(|e| match e {
        DeviceError::DriverMissing(why) => anyhow::anyhow!("cannot open CUDA device {ordinal}: {why}"),
        e => anyhow::Error::new(e).context(format!(
            "cannot open CUDA device {ordinal}; pass --device cpu, or check the NVIDIA driver and that this build has CUDA"
        )),
    })
}

/// The dtype asked for, else bf16 on a GPU (as the official code runs) and f32 on the CPU (where it is fast).
/// bf16 on the CPU is refused up front: candle's CPU matrix multiply has no bf16 kernel.
pub fn pick_dtype(asked: Option<DType>, device: &Device) -> anyhow::Result<DType> {
    Ok(match asked {
        Some(DType::BF16) if device.is_cpu() => {
            anyhow::bail!(
                "bf16 does not run on the CPU (no bf16 matrix multiply there); use --dtype f32"
            )
        }
        Some(dtype) => dtype,
        None if device.is_cpu() => DType::F32,
        None => DType::BF16,
    })
}

/// Makes the folder `out` goes in.
pub fn create_out_folder(out: &Path) -> anyhow::Result<()> {
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|err| {
            anyhow::Error::new(err).context(format!(
                "cannot create the folder for --out {}; pick a folder you can write to",
                out.display()
            ))
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lora_specs_split_only_at_a_numeric_multiplier() {
        let parsed = |spec: &str| {
            let c = LoraChoice::parse(spec);
            (c.path, c.strength)
        };
        assert_eq!(
            parsed("a.safetensors"),
            (PathBuf::from("a.safetensors"), 1.0)
        );
        assert_eq!(
            parsed("a.safetensors:0.5"),
            (PathBuf::from("a.safetensors"), 0.5)
        );
        assert_eq!(
            parsed(r"C:\l\a.safetensors"),
            (PathBuf::from(r"C:\l\a.safetensors"), 1.0)
        );
        assert_eq!(
            parsed(r"C:\l\a.safetensors:-1"),
            (PathBuf::from(r"C:\l\a.safetensors"), -1.0)
        );
    }

    #[test]
    fn bf16_is_refused_on_the_cpu_and_defaults_follow_the_device() -> anyhow::Result<()> {
        assert_eq!(pick_dtype(None, &Device::Cpu)?, DType::F32);
        assert_eq!(pick_dtype(Some(DType::F16), &Device::Cpu)?, DType::F16);
        let err = pick_dtype(Some(DType::BF16), &Device::Cpu)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--dtype f32"), "{err}");
        Ok(())
    }
}
