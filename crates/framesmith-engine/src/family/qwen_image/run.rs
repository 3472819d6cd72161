//! A Qwen-Image run's model and what the trainer asks of it: the image families' run
//! ([`crate::family::image::run`]: the micro-step, the validation loss over held-out items at the plan's fixed
//! timesteps, the samples) over the Qwen-Image batch ([`super::train::qwen_batch`]) with the image samples.

use crate::family::image::run::ImageRun;
use crate::family::qwen_image::samples::ImageSamples;
use framesmith_models::qwen_image::QwenImageTransformer;

/// The model of a Qwen-Image run and its samples.
pub type QwenImageRun = ImageRun<QwenImageTransformer, ImageSamples>;
