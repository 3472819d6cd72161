//! The Qwen-Image family: which runs are Qwen-Image's and its cached items and batch ([`train`]), a run's setup
//! (`setup`), micro-step, validation and samples ([`run`], [`samples`]), its plan description ([`plan`]), the cache
//! passes ([`prep`]), images sampled with loaded models ([`pipeline`]) and generated from a prompt ([`generate`]).
//! Every prompt goes through the text-encoder seam ([`encoder`]): Qwen2.5-VL in a run, a stand-in in tests; a
//! prompt with control images through its vision tower, as the edit pipeline the DiT's files say ([`edit`]).

use std::path::Path;

use crate::family::Family;
use crate::generate::request::{DitSource, GenerationOutput, GenerationRequest};
use crate::generate::run::Session;
use crate::plan::{ClipShape, PlanError, PlanModel};
use crate::prep::pass::{CachePass, CacheRequest};
use crate::prep::{CacheProgress, CacheSummary};
use crate::train::setup::RunParts;
use framesmith_config::protocol::LogLevel;
use framesmith_config::{ModelFamily, RunConfig, RunPlan};
use framesmith_data::ValidConfig;

pub mod edit;
pub mod encoder;
pub mod generate;
pub mod pipeline;
pub mod plan;
pub mod prep;
pub mod run;
pub mod samples;
mod setup;
pub mod train;

#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;

/// Qwen-Image: the runs whose `model.dit` is a Qwen-Image transformer.
pub struct QwenImageFamily;

impl Family for QwenImageFamily {
    fn name(&self) -> &'static str {
        "Qwen-Image"
    }

    fn claims(&self, config: &RunConfig) -> bool {
        train::is_qwen_image_run(config)
    }

    fn config_family(&self) -> ModelFamily {
        ModelFamily::QwenImage
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
            CachePass::Latents(files) => prep::is_qwen_latent_pass(files),
            CachePass::Text(files) => {
                files.clip_text.is_none()
                    && files
                        .text_encoder
                        .as_deref()
                        .is_some_and(prep::is_qwen_text_encoder)
            }
        }
    }

    fn cache(
        &self,
        request: &CacheRequest<'_>,
        progress: &mut dyn CacheProgress,
        log: &mut dyn FnMut(&str),
    ) -> anyhow::Result<CacheSummary> {
        match &request.pass {
            CachePass::Latents(files) => prep::latents(request, files, progress, log),
            CachePass::Text(files) => prep::text(request, files, progress, log),
        }
    }

    fn start_run(
        &self,
        plan: &RunPlan,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> anyhow::Result<RunParts> {
        let Some(dit) = train::qwen_dit_of(plan) else {
            anyhow::bail!(
                "model.dit is not a Qwen-Image transformer; point it at qwen_image_bf16.safetensors"
            );
        };
        setup::start_run(plan, &dit, log)
    }

    fn run_request(&self, config: &RunConfig, out_stem: &Path) -> GenerationRequest {
        generate::run_request(config, out_stem)
    }

    fn claims_dit(&self, dit: &DitSource) -> bool {
        generate::is_qwen_image_dit(dit)
    }

    fn generate(
        &self,
        request: &GenerationRequest,
        session: &mut Session,
    ) -> anyhow::Result<GenerationOutput> {
        generate::generate(request, session)
    }
}
