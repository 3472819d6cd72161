//! The FLUX.1 [dev] family: which runs are FLUX.1's and its cached items and batch ([`train`]), a run's setup
//! ([`setup`]), micro-step and samples ([`run`], [`samples`]), images sampled with loaded models ([`pipeline`]) and
//! generated from a prompt ([`generate`]).

use std::path::Path;

use crate::family::Family;
use crate::generate::request::{DitSource, GenerationOutput, GenerationRequest};
use crate::generate::run::Session;
use crate::plan::{PlanError, PlanModel};
use crate::prep::pass::{CachePass, CacheRequest};
use crate::prep::{CacheProgress, CacheSummary};
use crate::train::setup::RunParts;
use framesmith_config::protocol::LogLevel;
use framesmith_config::{ModelFamily, RunConfig, RunPlan};

pub mod generate;
mod help;
pub mod pipeline;
pub mod plan;
pub mod prep;
pub mod run;
pub mod samples;
mod setup;
pub mod train;

#[cfg(test)]
mod tests;

/// FLUX.1 [dev]: the runs whose `model.dit` is a FLUX.1 file of any kind.
pub struct FluxFamily;

impl Family for FluxFamily {
    fn flag_help(&self, command: crate::family::CliCommand) -> Option<&'static str> {
        Some(help::flag_help(command))
    }

    fn name(&self) -> &'static str {
        "FLUX.1"
    }

    fn claims(&self, config: &RunConfig) -> bool {
        train::is_flux_run(config)
    }

    fn config_family(&self) -> ModelFamily {
        ModelFamily::Flux
    }

    fn plan_model(&self, config: &RunConfig) -> Option<Result<PlanModel, PlanError>> {
        plan::plan_model(config)
    }

    fn claims_cache(&self, pass: &CachePass) -> bool {
        match pass {
            CachePass::Latents(files) => prep::is_flux_autoencoder(&files.vae),
            CachePass::Text(files) => files.clip_text.is_some(),
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

    fn settings_to_check(&self, config: &RunConfig) -> RunConfig {
        super::image::settings_with_auto_variant(config)
    }

    fn start_run(
        &self,
        plan: &RunPlan,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> anyhow::Result<RunParts> {
        let Some(dit) = train::flux_dit_of(plan) else {
            anyhow::bail!("model.dit is not a FLUX.1 file; point it at flux1-dev.safetensors");
        };
        setup::start_run(plan, &dit, log)
    }

    fn run_request(&self, config: &RunConfig, out_stem: &Path) -> GenerationRequest {
        generate::run_request(config, out_stem)
    }

    fn claims_dit(&self, dit: &DitSource) -> bool {
        generate::is_flux_dit(dit)
    }

    fn generate(
        &self,
        request: &GenerationRequest,
        session: &mut Session,
    ) -> anyhow::Result<GenerationOutput> {
        generate::generate(request, session)
    }
}
