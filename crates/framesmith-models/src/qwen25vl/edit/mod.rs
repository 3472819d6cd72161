//! Prompts with condition images to text embeddings as Qwen-Image-Edit's pipelines make them (diffusers 0.42.1:
//! `QwenImageEditPipeline` and, for Qwen-Image-Edit-2509 and later, `QwenImageEditPlusPipeline`; `__call__`'s
//! image preparation, then `_get_qwen_prompt_embeds`): each image resized with Lanczos to a target area (Edit:
//! ~1024², Edit-2509: ~384² per image) in multiples of 32, put through the Qwen2-VL image processor and the
//! vision tower; the prompt put into the Edit template with one `<|vision_start|><|image_pad|><|vision_end|>` per
//! image (Edit-2509: each after `Picture k: `), every `<|image_pad|>` expanded to the image's merged patch count;
//! the vision embeddings spliced in at those tokens; the language model run at Qwen2.5-VL's multimodal positions;
//! `hidden_states[-1]` kept with its first 64 tokens (the template's system part) dropped.
//!
//! The positions are the 3-D ones Qwen2.5-VL was trained with and ComfyUI computes. transformers 5 gives them only
//! when called with `mm_token_type_ids`, which diffusers 0.42.1 does not pass (it then gives 1-D positions);
//! transformers 4, which Qwen-Image-Edit was released with, derived them from the ids.

use candle_core::{DType, Tensor};
use image::RgbImage;

use super::encoder::{drop_and_repad, PromptEmbeds, Qwen25VlError, Qwen25VlTextEncoder};
use super::mrope::rope_index;
use super::vision::{ImageProcessorConfig, Qwen25VlVision};
use crate::resample::{resize, Filter};

/// The Edit pipelines' `prompt_template_encode` (both use it; Edit writes its one image in it).
pub const EDIT_TEMPLATE: &str = "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, background), then explain how the user's text instruction should alter or modify the image. Generate a new image that meets the user's requirements while maintaining consistency with the original input where appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n";
/// An image's placeholder in the prompt, before the processor expands `<|image_pad|>`.
pub const IMAGE_PLACEHOLDER: &str = "<|vision_start|><|image_pad|><|vision_end|>";
/// The token the processor repeats once per merged patch.
pub const IMAGE_PAD: &str = "<|image_pad|>";
/// `prompt_template_encode_start_idx` of both Edit pipelines.
pub const EDIT_DROP_TOKENS: usize = 64;

/// Which official pipeline's encoding to reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditPipeline {
    /// `QwenImageEditPipeline` (Qwen-Image-Edit): exactly one image, resized to ~1024² for the vision tower.
    Edit,
    /// `QwenImageEditPlusPipeline` (Qwen-Image-Edit-2509, -2511): one or more images, each resized to ~384²
    /// (`CONDITION_IMAGE_SIZE`) and introduced as `Picture k: `.
    EditPlus,
}

impl EditPipeline {
    /// The area the pipeline resizes each image to before the processor.
    pub fn condition_area(self) -> f64 {
        match self {
            Self::Edit => 1024.0 * 1024.0,
            Self::EditPlus => 384.0 * 384.0,
        }
    }

    /// The text the pipeline tokenizes for `prompt` with `images` images.
    pub fn text(self, prompt: &str, images: usize) -> Result<String, String> {
        let user = match (self, images) {
            (Self::Edit, 1) => format!("{IMAGE_PLACEHOLDER}{prompt}"),
            (Self::Edit, n) => {
                return Err(format!(
                    "Qwen-Image-Edit takes exactly one condition image, not {n} (Qwen-Image-Edit-2509 takes several)"
                ))
            }
            (Self::EditPlus, n) => {
                let pictures: String = (1..=n)
                    .map(|k| format!("Picture {k}: {IMAGE_PLACEHOLDER}"))
                    .collect();
                format!("{pictures}{prompt}")
            }
        };
        Ok(EDIT_TEMPLATE.replacen("{}", &user, 1))
    }

    /// `image` as the pipeline hands it to the processor: resized (Pillow Lanczos, as `VaeImageProcessor.resize`)
    /// to [`calculate_dimensions`] of the pipeline's area and the image's aspect ratio.
    pub fn condition_image(self, image: &RgbImage) -> RgbImage {
        let ratio = f64::from(image.width()) / f64::from(image.height().max(1));
        let (w, h) = calculate_dimensions(self.condition_area(), ratio);
        resize(image, w, h, Filter::Lanczos)
    }
}

/// The pipelines' `calculate_dimensions(target_area, ratio)`: (width, height) of about `target_area` pixels at
/// `ratio` = width / height, each rounded (ties to even, as Python) to a multiple of 32.
pub fn calculate_dimensions(target_area: f64, ratio: f64) -> (u32, u32) {
    let width = (target_area * ratio).sqrt();
    let height = width / ratio;
    let snap = |v: f64| ((v / 32.0).round_ties_even() * 32.0) as u32;
    (snap(width), snap(height))
}

/// How to encode edit prompts.
#[derive(Debug, Clone, PartialEq)]
pub struct EditPromptOptions {
    /// The pipeline whose encoding to reproduce.
    pub pipeline: EditPipeline,
    /// The image processor's settings (`processor/preprocessor_config.json`).
    pub processor: ImageProcessorConfig,
}

impl EditPromptOptions {
    /// `pipeline` with Qwen-Image-Edit's processor settings.
    pub fn new(pipeline: EditPipeline) -> Self {
        Self {
            pipeline,
            processor: ImageProcessorConfig::default(),
        }
    }
}

fn invalid(message: String) -> Qwen25VlError {
    Qwen25VlError::Tensor(candle_core::Error::Msg(message))
}

/// The official embeddings of `prompt` with its condition `images` (RGB, any size, in the order the prompt's
/// `Picture k` refers to them): [1, l, hidden] in the language model's dtype on its device, mask all ones.
/// `encoder` is the language model and tokenizer, `vision` the tower loaded from the same file
/// ([`super::vision::load_vision_model`]).
pub fn encode_edit_prompt(
    encoder: &Qwen25VlTextEncoder,
    vision: &Qwen25VlVision,
    options: &EditPromptOptions,
    prompt: &str,
    images: &[RgbImage],
) -> Result<PromptEmbeds, Qwen25VlError> {
    let text = options
        .pipeline
        .text(prompt, images.len())
        .map_err(invalid)?;
    let condition: Vec<RgbImage> = images
        .iter()
        .map(|i| options.pipeline.condition_image(i))
        .collect();
    let processed = options
        .processor
        .preprocess(&condition, vision.device())
        .map_err(|e| invalid(e.to_string()))?;
    let merge = vision.config().spatial_merge_size;
    let pad = encoder.tokenizer.token_id(IMAGE_PAD).ok_or_else(|| {
        invalid(format!(
            "the tokenizer has no `{IMAGE_PAD}` token: it is not Qwen2.5-VL's"
        ))
    })?;
    let mut counts = processed
        .grids
        .iter()
        .map(|[t, h, w]| t * h * w / (merge * merge));
    let mut ids = Vec::new();
    for id in encoder.tokenizer.encode(&text)? {
        if id == pad {
            let n = counts
                .next()
                .ok_or_else(|| invalid("more image tokens than images".into()))?;
            ids.extend(std::iter::repeat_n(pad, n));
        } else {
            ids.push(id);
        }
    }
    let positions = rope_index(&ids, pad, &processed.grids, merge).map_err(invalid)?;
    let model = &encoder.model;
    let l = ids.len();
    let tokens = model.embed(&Tensor::from_vec(
        ids.clone(),
        (1, l),
        &candle_core::Device::Cpu,
    )?)?;
    let pictures = vision.forward(&processed.pixel_values, &processed.grids)?;
    let xs = splice(&tokens, &pictures, &ids, pad)?;
    let mask = Tensor::ones((1, l), DType::U32, &candle_core::Device::Cpu)?;
    let hidden = model.hidden_states_at(&xs, &mask, &[positions], 0)?;
    Ok(drop_and_repad(&hidden, &[l], EDIT_DROP_TOKENS, usize::MAX)?)
}

/// `tokens` [1, l, hidden] with the rows at `pad` tokens of `ids` replaced, in order, by the rows of `pictures`
/// [m, hidden] (`masked_scatter`).
fn splice(
    tokens: &Tensor,
    pictures: &Tensor,
    ids: &[u32],
    pad: u32,
) -> Result<Tensor, Qwen25VlError> {
    let (_, l, hidden) = tokens.dims3()?;
    let m = pictures.dim(0)?;
    let mut rows = Vec::with_capacity(l);
    let mut next = 0;
    for &id in ids {
        if id == pad {
            rows.push((l + next) as u32);
            next += 1;
        } else {
            rows.push(rows.len() as u32);
        }
    }
    if next != m {
        return Err(invalid(format!(
            "image features and image tokens do not match: {next} tokens, {m} features"
        )));
    }
    let pictures = pictures
        .to_device(tokens.device())?
        .to_dtype(tokens.dtype())?;
    let all = Tensor::cat(&[&tokens.reshape((l, hidden))?, &pictures], 0)?;
    let index = Tensor::from_vec(rows, l, tokens.device())?;
    Ok(all.index_select(&index, 0)?.reshape((1, l, hidden))?)
}

#[cfg(test)]
mod tests;
