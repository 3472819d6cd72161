//! The LTX-2 family (LTX-2 19B and LTX-2.3 22B): which runs are LTX-2's and its batch ([`train`]), the cached
//! items of musubi-tuner's LTX-2 `_ltx2` caches ([`items`]), a run's setup (`setup`) and model ([`run`]), its
//! plan description ([`plan`]), its latent pass ([`prep`]: the video VAE's `_ltx2` caches, and the audio VAE's
//! `_ltx2_audio` caches of clips with sound) and its text pass ([`text_cache`], with Gemma 3 and the checkpoint's
//! connector: [`encoder`]). It trains text-to-video LoRAs of the video stream, with the official trainer's
//! first-frame (image-to-video) conditioning mixed in at `training.first_frame_conditioning_p`, and both streams
//! jointly when the caches hold audio latents. Samples during training ([`samples`]) and `framesmith generate`
//! ([`generate`]) make clips through ltx-core's sampling ([`pipeline`], [`denoise`]: with sound when the audio
//! stream is trained or asked for, from a first-frame image with `--i` / `--image`) and the VAE ([`decode`]);
//! [`sound`] turns the audio stream's latents into sound and muxes it into the clip.

use std::path::Path;

use crate::family::image::cached_video::CachedVideoFamily;
use crate::family::image::items::VideoVae;
use crate::generate::request::{GenerationOutput, GenerationRequest};
use crate::generate::run::Session;
use crate::plan::{PlanError, PlanModel};
use crate::prep::pass::{CacheRequest, LatentFiles, TextFiles};
use crate::prep::{CacheProgress, CacheSummary};
use crate::train::setup::RunParts;
use framesmith_config::protocol::LogLevel;
use framesmith_config::{ModelFamily, RunConfig, RunPlan};
use framesmith_data::family::ltx2::cache::parse_ltx2_latent_cache_name;
use framesmith_data::DatasetKind;

pub mod decode;
pub mod denoise;
pub mod encoder;
pub mod generate;
pub mod items;
pub mod pipeline;
pub mod plan;
pub mod prep;
pub mod run;
pub mod samples;
mod setup;
pub mod sound;
pub mod text_cache;
pub mod train;

#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;

/// LTX-2 and LTX-2.3: the runs whose `model.dit` is an LTX-2 transformer.
pub struct Ltx2Family;

impl CachedVideoFamily for Ltx2Family {
    const NAME: &'static str = "LTX-2";
    const CONFIG_FAMILY: ModelFamily = ModelFamily::Ltx2;
    const VAE: VideoVae = items::VAE;
    const NOT_ITS_DIT: &'static str =
        "model.dit is not an LTX-2 transformer; point it at Lightricks' \
         ltx-2-19b-*.safetensors or ltx-2.3-22b-*.safetensors";
    const NO_CACHE_PASS: &'static str = items::LTX2_CACHES;
    const MAKES_SOUND: bool = true;

    fn is_run(config: &RunConfig) -> bool {
        train::is_ltx2_run(config)
    }

    fn is_dit_file(path: &Path) -> bool {
        train::is_ltx2_file(path)
    }

    fn is_latent_cache(file_name: &str, kind: DatasetKind) -> bool {
        parse_ltx2_latent_cache_name(file_name, kind).is_some()
    }

    fn claims_latent_pass(files: &LatentFiles) -> bool {
        prep::is_ltx2_latent_pass(files)
    }

    fn cache_latents(
        request: &CacheRequest<'_>,
        files: &LatentFiles,
        progress: &mut dyn CacheProgress,
        log: &mut dyn FnMut(&str),
    ) -> anyhow::Result<CacheSummary> {
        prep::latents(request, files, progress, log)
    }

    fn plan_model(config: &RunConfig) -> Option<Result<PlanModel, PlanError>> {
        plan::plan_model(config)
    }

    fn start_run(
        plan: &RunPlan,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> Option<anyhow::Result<RunParts>> {
        train::ltx2_dit_of(plan).map(|dit| setup::start_run(plan, &dit, log))
    }

    fn claims_text_pass(files: &TextFiles) -> bool {
        text_cache::is_ltx2_text_pass(files)
    }

    fn cache_text(
        request: &CacheRequest<'_>,
        files: &TextFiles,
        progress: &mut dyn CacheProgress,
        log: &mut dyn FnMut(&str),
    ) -> anyhow::Result<CacheSummary> {
        text_cache::text(request, files, progress, log)
    }

    fn generate(
        request: &GenerationRequest,
        session: &mut Session,
    ) -> anyhow::Result<GenerationOutput> {
        generate::generate(request, session)
    }
}
