//! The LTX-2 family (LTX-2 19B and LTX-2.3 22B): which runs are LTX-2's and its batch ([`train`]), the cached
//! items of musubi-tuner's LTX-2 `_ltx2` caches ([`items`]), a run's setup (`setup`) and model ([`run`]), and its
//! plan description ([`plan`]). It trains text-to-video LoRAs of the video stream from caches only, the audio
//! stream left out: the video VAE and the Gemma 3 text encoder are not implemented, so the cache passes, samples
//! during training and `framesmith generate` are refused with what is missing and where the caches come from.

use std::path::Path;

use crate::family::Family;
use crate::generate::request::{DitSource, GenerationOutput, GenerationRequest};
use crate::generate::run::{given, Session};
use crate::plan::{ClipShape, PlanError, PlanModel};
use crate::prep::pass::{CachePass, CacheRequest};
use crate::prep::{CacheProgress, CacheSummary};
use crate::train::setup::RunParts;
use framesmith_config::protocol::LogLevel;
use framesmith_config::{ModelFamily, RunConfig, RunPlan};
use framesmith_data::ValidConfig;

pub mod items;
pub mod plan;
pub mod run;
mod setup;
pub mod train;

#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;

/// Why `framesmith generate` does not run an LTX-2 DiT.
const NO_GENERATE: &str = "generating with LTX-2 needs its video VAE (to decode the clip) and the Gemma 3 text \
     encoder, which Framesmith does not have yet; use ComfyUI's LTX-2 workflow or ltx-pipelines with the LoRA \
     (its keys are the official trainer's)";

/// LTX-2 and LTX-2.3: the runs whose `model.dit` is an LTX-2 transformer.
pub struct Ltx2Family;

impl Family for Ltx2Family {
    fn name(&self) -> &'static str {
        "LTX-2"
    }

    fn claims(&self, config: &RunConfig) -> bool {
        train::is_ltx2_run(config)
    }

    fn config_family(&self) -> ModelFamily {
        ModelFamily::Ltx2
    }

    fn plan_model(&self, config: &RunConfig) -> Option<Result<PlanModel, PlanError>> {
        plan::plan_model(config)
    }

    fn largest_cached_clip(&self, valid: &ValidConfig, _demo: bool) -> Option<ClipShape> {
        plan::largest_cached_clip(valid)
    }

    fn settings_to_check(&self, config: &RunConfig) -> RunConfig {
        super::image::settings_with_auto_variant(config)
    }

    fn claims_cache(&self, pass: &CachePass) -> bool {
        match pass {
            CachePass::Latents(files) => files.dit.as_deref().is_some_and(train::is_ltx2_file),
            CachePass::Text(_) => false,
        }
    }

    fn cache(
        &self,
        request: &CacheRequest<'_>,
        _progress: &mut dyn CacheProgress,
        _log: &mut dyn FnMut(&str),
    ) -> anyhow::Result<CacheSummary> {
        anyhow::bail!("{}: {}", items::LTX2_CACHES, request.dataset.display())
    }

    fn start_run(
        &self,
        plan: &RunPlan,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> anyhow::Result<RunParts> {
        let Some(dit) = train::ltx2_dit_of(plan) else {
            anyhow::bail!(
                "model.dit is not an LTX-2 transformer; point it at Lightricks' ltx-2-19b-*.safetensors or \
                 ltx-2.3-22b-*.safetensors"
            );
        };
        setup::start_run(plan, &dit, log)
    }

    fn run_request(&self, config: &RunConfig, out_stem: &Path) -> GenerationRequest {
        let m = &config.model;
        let mut request = GenerationRequest::new(
            DitSource::File(m.dit.clone()),
            "",
            out_stem.with_extension("mp4"),
        );
        request.files.vae = given(&m.vae);
        request.files.text_encoder = given(&m.text_encoder);
        request.placement.device = config.training.device;
        request
    }

    fn claims_dit(&self, dit: &DitSource) -> bool {
        match dit {
            DitSource::File(path) => train::is_ltx2_file(path),
            DitSource::Demo => false,
        }
    }

    fn generate(
        &self,
        request: &GenerationRequest,
        _session: &mut Session,
    ) -> anyhow::Result<GenerationOutput> {
        let dit = match &request.dit {
            DitSource::File(path) => path.display().to_string(),
            DitSource::Demo => String::new(),
        };
        anyhow::bail!("{NO_GENERATE}: {dit}")
    }
}
