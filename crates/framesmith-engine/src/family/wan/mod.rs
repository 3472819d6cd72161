//! The Wan family (Wan2.1, Wan2.2 and the built-in demo model, a tiny Wan): its runs' setup ([`setup`]), data
//! ([`data`], its caches read in [`cached`]), micro-step, validation and samples ([`run`]), training mode ([`mode`]), Wan2.2 A14B's two experts
//! ([`experts`]), the sample prompts encoded before the DiT loads ([`sample_models`], [`samples`]), the sampling
//! loop ([`denoise`]), whole clips from loaded models ([`pipeline`]), the start image of image-to-video clips
//! ([`start_image`]) and clips generated from a prompt ([`generate`]).

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

pub mod cached;
pub mod data;
mod demo_generate;
pub mod demo_setup;
pub mod denoise;
pub mod experts;
pub mod generate;
mod help;
pub mod latents;
pub mod mode;
pub mod pipeline;
pub mod plan;
mod prep;
pub mod run;
pub mod sample_models;
pub mod samples;
mod setup;
pub mod start_image;
pub mod text_cache;
pub mod whole_graph;

#[cfg(test)]
pub(crate) mod step_testkit;
#[cfg(test)]
mod tests;

/// Wan models: the family that takes every run no other family claims (the demo model's among them).
pub struct WanFamily;

impl Family for WanFamily {
    fn flag_help(&self, command: crate::family::CliCommand) -> Option<&'static str> {
        Some(help::flag_help(command))
    }

    fn name(&self) -> &'static str {
        "Wan"
    }

    fn claims(&self, _config: &RunConfig) -> bool {
        true
    }

    fn config_family(&self) -> ModelFamily {
        ModelFamily::Wan
    }

    fn plan_model(&self, config: &RunConfig) -> Option<Result<PlanModel, PlanError>> {
        Some(plan::plan_model(config))
    }

    fn largest_cached_clip(&self, valid: &ValidConfig, demo: bool) -> Option<ClipShape> {
        plan::largest_cached_clip(valid, demo)
    }

    fn claims_cache(&self, _pass: &CachePass) -> bool {
        true
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
        setup::start_run(plan, log)
    }

    fn run_request(&self, config: &RunConfig, out_stem: &Path) -> GenerationRequest {
        generate::run_request(config, out_stem)
    }

    fn claims_dit(&self, _dit: &DitSource) -> bool {
        true
    }

    fn generate(
        &self,
        request: &GenerationRequest,
        session: &mut Session,
    ) -> anyhow::Result<GenerationOutput> {
        generate::generate(request, session)
    }
}
