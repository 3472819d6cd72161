//! The HunyuanVideo 1.5 family: which runs are HunyuanVideo 1.5's and its batch ([`train`]), the cached items of
//! musubi-tuner's `_hv15` caches ([`items`]), the latent pass that makes them with the 3-D causal VAE ([`prep`]) and
//! the text pass with Qwen2.5-VL and the byT5 glyph encoder ([`text_cache`], through [`encoder`]), a run's setup
//! (`setup`), model and samples ([`run`], [`samples`]), its plan description ([`plan`]), text- and image-to-video
//! generation ([`generate`]: the official sampling loop of [`pipeline`], the clip decoder of [`decode`]) and what
//! its models take from the commands' flags (`help`).

use std::path::Path;

use crate::family::image::cached_video::CachedVideoFamily;
use crate::family::image::items::VideoVae;
use crate::family::CliCommand;
use crate::generate::request::{GenerationOutput, GenerationRequest};
use crate::generate::run::Session;
use crate::plan::{PlanError, PlanModel};
use crate::prep::pass::{CacheRequest, LatentFiles, TextFiles};
use crate::prep::{CacheProgress, CacheSummary};
use crate::train::setup::RunParts;
use framesmith_config::protocol::LogLevel;
use framesmith_config::{ModelFamily, RunConfig, RunPlan};
use framesmith_data::family::hunyuan_video15::cache::parse_hv15_latent_cache_name;
use framesmith_data::DatasetKind;

pub mod decode;
pub mod encoder;
pub mod generate;
mod help;
pub mod items;
pub mod pipeline;
pub mod plan;
pub mod prep;
pub mod run;
pub mod samples;
mod setup;
pub mod text_cache;
pub mod train;

#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;

/// HunyuanVideo 1.5: the runs whose `model.dit` is a HunyuanVideo transformer.
pub struct HunyuanVideo15Family;

impl CachedVideoFamily for HunyuanVideo15Family {
    const NAME: &'static str = "HunyuanVideo 1.5";
    const CONFIG_FAMILY: ModelFamily = ModelFamily::HunyuanVideo15;
    const VAE: VideoVae = items::VAE;
    const NOT_ITS_DIT: &'static str =
        "model.dit is not a HunyuanVideo 1.5 transformer; point it at a \
         transformer of tencent/HunyuanVideo-1.5 (e.g. transformer/480p_t2v) or ComfyUI's \
         hunyuanvideo1.5_*.safetensors";

    fn is_run(config: &RunConfig) -> bool {
        train::is_hv15_run(config)
    }

    fn is_dit_file(path: &Path) -> bool {
        train::is_hv15_file(path)
    }

    fn is_latent_cache(file_name: &str, kind: DatasetKind) -> bool {
        parse_hv15_latent_cache_name(file_name, kind).is_some()
    }

    fn claims_latent_pass(files: &LatentFiles) -> bool {
        prep::is_hv15_latent_pass(files)
    }

    fn plan_model(config: &RunConfig) -> Option<Result<PlanModel, PlanError>> {
        plan::plan_model(config)
    }

    fn start_run(
        plan: &RunPlan,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> Option<anyhow::Result<RunParts>> {
        train::hv15_dit_of(plan).map(|dit| setup::start_run(plan, &dit, log))
    }

    fn cache_latents(
        request: &CacheRequest<'_>,
        files: &LatentFiles,
        progress: &mut dyn CacheProgress,
        log: &mut dyn FnMut(&str),
    ) -> anyhow::Result<CacheSummary> {
        prep::latents(request, files, progress, log)
    }

    fn claims_text_pass(files: &TextFiles) -> bool {
        text_cache::is_hv15_text_pass(files)
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

    fn flag_help(command: CliCommand) -> Option<&'static str> {
        help::flag_help(command)
    }
}
