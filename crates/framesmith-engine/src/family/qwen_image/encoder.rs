//! The seam between Qwen-Image and its text encoder: prompts in, Qwen2.5-VL's hidden states and their mask out
//! ([`PromptEncoder`]). The text cache pass, samples and generation encode only through it; [`load_encoder`]
//! gives the language model with the official template (its system tokens dropped,
//! `prompt_template_encode_start_idx` = 34), tests a stand-in. Each prompt keeps the hidden states of its valid
//! tokens only, as musubi-tuner caches them (`embed[:txt_len]`). Qwen-Image-Edit's prompts, which carry condition
//! images, go through [`EditPromptEncoder`]; [`load_edit_encoder`] gives the language model with the vision tower
//! of the same file.

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use framesmith_models::qwen25vl::vision::{
    load_vision_model, Qwen25VlVision, Qwen25VlVisionConfig, VisionLoadOptions,
};
use framesmith_models::qwen25vl::{
    self, encode_edit_prompt, EditPipeline, EditPromptOptions, LayerPlacement, LoadOptions,
    Qwen25VlTextEncoder,
};
use framesmith_nn::device::VramUse;
use framesmith_nn::fp8::Fp8Scale;
use image::RgbImage;

/// Width of Qwen2.5-VL-7B's hidden states (the released transformer's `joint_attention_dim`).
pub const TEXT_DIM: usize = 3584;

/// Turns prompts into Qwen-Image's text conditioning.
pub trait PromptEncoder {
    /// The hidden states [b, L, D] of `prompts` as the Qwen-Image pipeline takes them, and their mask [b, L]
    /// (non-zero: a valid token; each row's valid tokens first, padding after).
    fn encode(&self, prompts: &[&str]) -> anyhow::Result<(Tensor, Tensor)>;

    /// What the encoder is and how it is kept, for the log.
    fn describe(&self) -> String {
        "a stand-in text encoder".into()
    }
}

/// The text encoder's files.
#[derive(Debug, Clone, Copy)]
pub struct EncoderFiles<'a> {
    /// Qwen2.5-VL's weights (ComfyUI's `qwen_2.5_vl_7b.safetensors`, its FP8 file, or a diffusers `text_encoder/`).
    pub weights: &'a Path,
    /// Its tokenizer (default: the one beside the weights).
    pub tokenizer: Option<&'a Path>,
}

/// How a caller gets its encoder: [`load_encoder`] in a run; a stand-in in tests.
pub type LoadEncoder<'a> =
    &'a dyn Fn(EncoderFiles<'_>, DType, &Device) -> anyhow::Result<Box<dyn PromptEncoder>>;

/// Loads Qwen-Image's text encoder (the Qwen2.5-VL-7B language model and its tokenizer) from `files` in `dtype`
/// on `device`, placed so that it fits what the card has free ([`placement_for`]).
pub fn load_encoder(
    files: EncoderFiles<'_>,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<Box<dyn PromptEncoder>> {
    let file = qwen25vl::identify(files.weights)?;
    let free = VramUse::measure(device, 0).map(|use_| use_.free);
    let (fp8, placement) = placement_for(file.parameter_count, free);
    let options = LoadOptions {
        dtype,
        fp8,
        placement,
        ..LoadOptions::new(device)
    };
    load_encoder_with(files, &options)
}

/// Loads the encoder at `files` as `options` say (tests give small models' sizes there).
pub fn load_encoder_with(
    files: EncoderFiles<'_>,
    options: &LoadOptions,
) -> anyhow::Result<Box<dyn PromptEncoder>> {
    let encoder = Qwen25VlTextEncoder::load(files.weights, files.tokenizer, options)?;
    let weights = match options.fp8 {
        Some(scale) => format!("FP8 weights (scales per {})", scale.as_str()),
        None => format!("{:?} weights", options.dtype),
    };
    let placement = match options.placement {
        LayerPlacement::Resident => "resident",
        LayerPlacement::Streamed => "layers streamed from RAM",
    };
    let what = format!("Qwen2.5-VL, {weights}, {placement}");
    Ok(Box::new(QwenVlPrompts { encoder, what }))
}

/// Room the encoder needs on the card beyond its weights: one batch of prompts' activations, cuBLAS workspaces.
const ACTIVATION_ROOM_BYTES: u64 = 2 << 30;

/// How a language model of `parameters` is kept for a card with `free` bytes (`None`: not a CUDA device): its
/// bf16 weights resident when they fit, else FP8 weights (one scale per output row) resident, else FP8 layers
/// streamed from host memory one at a time.
pub fn placement_for(parameters: u64, free: Option<u64>) -> (Option<Fp8Scale>, LayerPlacement) {
    let Some(free) = free else {
        return (None, LayerPlacement::Resident);
    };
    let room = free.saturating_sub(ACTIVATION_ROOM_BYTES);
    if parameters.saturating_mul(2) <= room {
        (None, LayerPlacement::Resident)
    } else if parameters <= room {
        (Some(Fp8Scale::Channel), LayerPlacement::Resident)
    } else {
        (Some(Fp8Scale::Channel), LayerPlacement::Streamed)
    }
}

/// Qwen2.5-VL encoding prompts as Qwen-Image's pipeline does.
struct QwenVlPrompts {
    encoder: Qwen25VlTextEncoder,
    what: String,
}

impl PromptEncoder for QwenVlPrompts {
    fn encode(&self, prompts: &[&str]) -> anyhow::Result<(Tensor, Tensor)> {
        let prompts: Vec<String> = prompts.iter().map(|p| (*p).to_string()).collect();
        let out = self.encoder.encode_prompts(&prompts)?;
        Ok((out.embeds, out.mask))
    }

    fn describe(&self) -> String {
        self.what.clone()
    }
}

/// Turns a prompt and its condition images into Qwen-Image-Edit's text conditioning; a prompt without images
/// goes through [`PromptEncoder::encode`] (the language model alone, as Qwen-Image's).
pub trait EditPromptEncoder: PromptEncoder {
    /// The hidden states [L, D] of `prompt` with its condition `images` (in the order the prompt's `Picture k`
    /// names them), as the Edit pipeline takes them: every token valid.
    fn encode_edit(&self, prompt: &str, images: &[RgbImage]) -> anyhow::Result<Tensor>;

    /// The pipeline whose encoding this reproduces.
    fn pipeline(&self) -> EditPipeline;
}

/// How a caller gets its edit encoder: [`load_edit_encoder`] in a run; a stand-in in tests.
pub type LoadEditEncoder<'a> = &'a dyn Fn(
    EncoderFiles<'_>,
    EditPipeline,
    DType,
    &Device,
) -> anyhow::Result<Box<dyn EditPromptEncoder>>;

/// Both ways a caller gets an encoder: the language model alone, or with its vision tower for prompts with
/// control images.
#[derive(Clone, Copy)]
pub struct EncoderLoaders<'a> {
    pub text: LoadEncoder<'a>,
    pub edit: LoadEditEncoder<'a>,
}

impl EncoderLoaders<'static> {
    /// [`load_encoder`] and [`load_edit_encoder`].
    pub fn real() -> Self {
        Self {
            text: &load_encoder,
            edit: &load_edit_encoder,
        }
    }
}

/// Loads Qwen-Image-Edit's text encoder from `files` in `dtype` on `device`: the vision tower resident (it is
/// small and runs once per image), the language model placed by [`placement_for`] in what the tower leaves free.
/// `pipeline` says whose encoding to reproduce (Edit, or Edit-2509 and later).
pub fn load_edit_encoder(
    files: EncoderFiles<'_>,
    pipeline: EditPipeline,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<Box<dyn EditPromptEncoder>> {
    let file = qwen25vl::identify(files.weights)?;
    let vision_bytes: u64 = Qwen25VlVisionConfig::qwen25_vl_7b()
        .tensor_shapes()
        .iter()
        .map(|(_, shape)| shape.iter().product::<usize>() as u64 * dtype.size_in_bytes() as u64)
        .sum();
    let free = VramUse::measure(device, 0).map(|use_| use_.free.saturating_sub(vision_bytes));
    let (fp8, placement) = placement_for(file.parameter_count, free);
    let options = LoadOptions {
        dtype,
        fp8,
        placement,
        ..LoadOptions::new(device)
    };
    let vision = VisionLoadOptions {
        dtype,
        ..VisionLoadOptions::new(device)
    };
    load_edit_encoder_with(files, EditPromptOptions::new(pipeline), &options, &vision)
}

/// Loads the edit encoder at `files` as the options say (tests give small models' sizes there).
pub fn load_edit_encoder_with(
    files: EncoderFiles<'_>,
    edit: EditPromptOptions,
    options: &LoadOptions,
    vision: &VisionLoadOptions,
) -> anyhow::Result<Box<dyn EditPromptEncoder>> {
    let encoder = Qwen25VlTextEncoder::load(files.weights, files.tokenizer, options)?;
    let tower = load_vision_model(files.weights, vision)?;
    let what = format!(
        "Qwen2.5-VL with its vision tower ({:?}), {:?} weights, {}",
        edit.pipeline,
        options.dtype,
        match (options.fp8, options.placement) {
            (_, LayerPlacement::Streamed) => "layers streamed from RAM",
            (Some(_), LayerPlacement::Resident) => "FP8 layers resident",
            (None, LayerPlacement::Resident) => "resident",
        }
    );
    Ok(Box::new(QwenVlEditPrompts {
        encoder,
        vision: tower,
        edit,
        what,
    }))
}

/// Qwen2.5-VL with its vision tower encoding prompts and images as Qwen-Image-Edit's pipelines do.
struct QwenVlEditPrompts {
    encoder: Qwen25VlTextEncoder,
    vision: Qwen25VlVision,
    edit: EditPromptOptions,
    what: String,
}

impl PromptEncoder for QwenVlEditPrompts {
    fn encode(&self, prompts: &[&str]) -> anyhow::Result<(Tensor, Tensor)> {
        let prompts: Vec<String> = prompts.iter().map(|p| (*p).to_string()).collect();
        let out = self.encoder.encode_prompts(&prompts)?;
        Ok((out.embeds, out.mask))
    }

    fn describe(&self) -> String {
        self.what.clone()
    }
}

impl EditPromptEncoder for QwenVlEditPrompts {
    fn encode_edit(&self, prompt: &str, images: &[RgbImage]) -> anyhow::Result<Tensor> {
        let out = encode_edit_prompt(&self.encoder, &self.vision, &self.edit, prompt, images)
            .with_context(|| format!("encoding the edit prompt \"{prompt}\""))?;
        Ok(out.embeds.squeeze(0)?)
    }

    fn pipeline(&self) -> EditPipeline {
        self.edit.pipeline
    }
}

/// Each of `prompts` through `encoder` on its own (so a prompt's embedding does not depend on which others came
/// with it), as its valid tokens' hidden states [L, D] in `dtype`.
pub fn encode_each(
    encoder: &dyn PromptEncoder,
    prompts: &[&str],
    dtype: DType,
) -> anyhow::Result<Vec<Tensor>> {
    prompts
        .iter()
        .map(|prompt| {
            let (embed, mask) = encoder
                .encode(&[*prompt])
                .with_context(|| format!("encoding the prompt \"{prompt}\""))?;
            valid_rows(&embed, &mask)?
                .into_iter()
                .next()
                .context("the text encoder returned no prompt")?
                .to_dtype(dtype)
                .map_err(Into::into)
        })
        .collect()
}

/// The rows [L_i, D] of each prompt's valid tokens in `embed` [b, L, D] under `mask` [b, L].
pub fn valid_rows(embed: &Tensor, mask: &Tensor) -> anyhow::Result<Vec<Tensor>> {
    let (b, l, _) = embed.dims3()?;
    if mask.dims() != [b, l] {
        anyhow::bail!(
            "the text encoder's mask {:?} does not fit its hidden states {:?}",
            mask.dims(),
            embed.dims()
        );
    }
    let lens = framesmith_models::qwen_image::transformer::txt_lens_from_mask(mask)?;
    lens.iter()
        .enumerate()
        .map(|(i, &n)| {
            if n == 0 {
                anyhow::bail!("the text encoder gave prompt {i} no valid token");
            }
            Ok(embed.get(i)?.narrow(0, 0, n)?)
        })
        .collect()
}

/// A stand-in text encoder for tests: each word a fixed random vector of width `dim` (the demo model's text
/// embedding), prompts padded to the longest with a mask, as the real encoder returns them.
#[cfg(test)]
pub(crate) struct WordEncoder {
    pub dim: usize,
}

#[cfg(test)]
impl PromptEncoder for WordEncoder {
    fn encode(&self, prompts: &[&str]) -> anyhow::Result<(Tensor, Tensor)> {
        let rows = prompts
            .iter()
            .map(|p| crate::demo::text::embed(p, self.dim, 64, &Device::Cpu))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let lens = rows
            .iter()
            .map(|r| r.dim(0))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let longest = lens.iter().copied().max().unwrap_or(0);
        let (mut padded, mut mask) = (Vec::new(), Vec::new());
        for r in &rows {
            let n = r.dim(0)?;
            padded.push(r.pad_with_zeros(0, 0, longest - n)?);
            mask.push(Tensor::cat(
                &[
                    Tensor::ones(n, DType::U8, &Device::Cpu)?,
                    Tensor::zeros(longest - n, DType::U8, &Device::Cpu)?,
                ],
                0,
            )?);
        }
        Ok((Tensor::stack(&padded, 0)?, Tensor::stack(&mask, 0)?))
    }
}

/// A stand-in edit encoder for tests: one row per image (its mean pixel in 0..1 plus its index, so the encoding
/// follows each image's contents and order) before the prompt's words as [`WordEncoder`]'s; the image count
/// checked as the pipeline checks it.
#[cfg(test)]
pub(crate) struct WordEditEncoder {
    pub dim: usize,
    pub pipeline: EditPipeline,
}

#[cfg(test)]
impl PromptEncoder for WordEditEncoder {
    fn encode(&self, prompts: &[&str]) -> anyhow::Result<(Tensor, Tensor)> {
        WordEncoder { dim: self.dim }.encode(prompts)
    }
}

#[cfg(test)]
impl EditPromptEncoder for WordEditEncoder {
    fn encode_edit(&self, prompt: &str, images: &[RgbImage]) -> anyhow::Result<Tensor> {
        self.pipeline
            .text(prompt, images.len())
            .map_err(anyhow::Error::msg)?;
        let mut rows = images
            .iter()
            .enumerate()
            .map(|(k, image)| {
                let pixels = image.as_raw();
                let sum: f32 = pixels.iter().map(|&v| f32::from(v)).sum();
                let mean = sum / (pixels.len().max(1) as f32 * 255.0);
                Tensor::full(mean + k as f32, (1, self.dim), &Device::Cpu)
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        rows.push(crate::demo::text::embed(
            prompt,
            self.dim,
            64,
            &Device::Cpu,
        )?);
        Ok(Tensor::cat(&rows, 0)?)
    }

    fn pipeline(&self) -> EditPipeline {
        self.pipeline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_prompt_keeps_its_valid_tokens_alone() -> anyhow::Result<()> {
        let encoder = WordEncoder { dim: 8 };
        let (embed, mask) = encoder.encode(&["a red cat", "dog"])?;
        assert_eq!(embed.dims()[0], 2);
        let rows = valid_rows(&embed, &mask)?;
        assert_eq!((rows[0].dims(), rows[1].dims()), (&[3, 8][..], &[1, 8][..]));
        let each = encode_each(&encoder, &["a red cat", "dog"], DType::F32)?;
        let diff = (&each[1] - &rows[1])?
            .abs()?
            .sum_all()?
            .to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);
        let bad = Tensor::ones((2, 1), DType::U8, &Device::Cpu)?;
        assert!(valid_rows(&embed, &bad).is_err());
        let missing = Path::new("no/such/qwen_2.5_vl_7b.safetensors");
        let files = EncoderFiles {
            weights: missing,
            tokenizer: None,
        };
        let err = load_encoder(files, DType::F32, &Device::Cpu)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(err.contains("no/such/qwen_2.5_vl_7b.safetensors"), "{err}");
        Ok(())
    }

    #[test]
    fn the_encoder_is_kept_as_the_card_allows() {
        let gib = 1u64 << 30;
        let seven_b = 7_070_000_000;
        assert_eq!(
            placement_for(seven_b, None),
            (None, LayerPlacement::Resident)
        );
        assert_eq!(
            placement_for(seven_b, Some(80 * gib)),
            (None, LayerPlacement::Resident)
        );
        assert_eq!(
            placement_for(seven_b, Some(12 * gib)),
            (Some(Fp8Scale::Channel), LayerPlacement::Resident)
        );
        assert_eq!(
            placement_for(seven_b, Some(6 * gib)),
            (Some(Fp8Scale::Channel), LayerPlacement::Streamed)
        );
    }

    /// The tiny Qwen2.5-VL the official pipeline encoded (`bench/reference/qwen25vl.py`) through this loader:
    /// each prompt alone gives the pipeline's batched embedding of it.
    #[test]
    fn the_loaded_encoder_gives_the_pipelines_prompt_embeds() -> anyhow::Result<()> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../framesmith-models/tests/fixtures/qwen25vl");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
        let config = qwen25vl::Qwen25VlTextConfig::from_hf_json(&json["text_config"].to_string())?;
        let options = LoadOptions {
            dtype: DType::F32,
            config: Some(config),
            ..LoadOptions::new(&Device::Cpu)
        };
        let weights = dir.join("weights.safetensors");
        let tokenizer = dir.join("tokenizer.json");
        let files = EncoderFiles {
            weights: &weights,
            tokenizer: Some(&tokenizer),
        };
        let encoder = load_encoder_with(files, &options)?;
        assert_eq!(encoder.describe(), "Qwen2.5-VL, F32 weights, resident");
        let prompts: Vec<String> = serde_json::from_value(json["prompts"].clone())?;
        let prompts: Vec<&str> = prompts.iter().map(String::as_str).collect();
        let expected =
            candle_core::safetensors::load(dir.join("expected.safetensors"), &Device::Cpu)?;
        let want = valid_rows(&expected["prompt_embeds"], &expected["prompt_mask"])?;
        let got = encode_each(encoder.as_ref(), &prompts, DType::F32)?;
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.dims(), w.dims());
            let err = (g - w)?.abs()?.max_all()?.to_scalar::<f32>()?;
            let scale = w.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(err <= 1e-4 * scale, "max error {err} against {scale}");
        }
        Ok(())
    }
    /// The tiny Qwen2.5-VL with its vision tower the official Edit-2509 pipeline encoded
    /// (`bench/reference/qwen_image_edit_text.py`, case `plus2`) through this loader.
    #[test]
    fn the_loaded_edit_encoder_gives_the_edit_pipelines_embeds() -> anyhow::Result<()> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../framesmith-models/tests/fixtures/qwen25vl_edit");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
        let options = LoadOptions {
            dtype: DType::F32,
            config: Some(qwen25vl::Qwen25VlTextConfig::from_hf_json(
                &json["text_config"].to_string(),
            )?),
            ..LoadOptions::new(&Device::Cpu)
        };
        let vision = VisionLoadOptions {
            dtype: DType::F32,
            config: Some(Qwen25VlVisionConfig::from_hf_json(
                &json["vision_config"].to_string(),
            )?),
            ..VisionLoadOptions::new(&Device::Cpu)
        };
        let (weights, tokenizer) = (dir.join("weights.safetensors"), dir.join("tokenizer.json"));
        let files = EncoderFiles {
            weights: &weights,
            tokenizer: Some(&tokenizer),
        };
        let edit = EditPromptOptions::new(EditPipeline::EditPlus);
        let encoder = load_edit_encoder_with(files, edit, &options, &vision)?;
        let inputs = candle_core::safetensors::load(dir.join("inputs.safetensors"), &Device::Cpu)?;
        let images = ["image_fox", "image_wide"]
            .iter()
            .map(|name| {
                let t = &inputs[*name];
                let (h, w, _) = t.dims3()?;
                RgbImage::from_raw(w as u32, h as u32, t.flatten_all()?.to_vec1::<u8>()?)
                    .context("image size")
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let prompt = json["cases"]["plus2"]["prompt"]
            .as_str()
            .unwrap_or_default();
        let got = encoder.encode_edit(prompt, &images)?;
        let expected =
            candle_core::safetensors::load(dir.join("expected.safetensors"), &Device::Cpu)?;
        let want = expected["plus2_embeds"].squeeze(0)?;
        assert_eq!(got.dims(), want.dims());
        let err = (&got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
        let scale = want.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(err <= 1e-4 * scale, "max error {err} against {scale}");
        assert!(encoder.describe().contains("EditPlus"));
        Ok(())
    }
}
