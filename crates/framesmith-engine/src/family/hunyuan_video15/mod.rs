//! The HunyuanVideo 1.5 family: which runs are HunyuanVideo 1.5's and its batch ([`train`]), the cached items of
//! musubi-tuner's `_hv15` caches ([`items`]), the latent pass that makes them with the 3-D causal VAE ([`prep`]),
//! a run's setup (`setup`) and model ([`run`]), its plan description ([`plan`]) and the clip decoder samples and
//! generation will use ([`decode`]). The byT5 glyph encoder is not implemented, so the text pass, samples during
//! training and `framesmith generate` are refused with what is missing and where the caches come from.

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

pub mod decode;
pub mod items;
pub mod plan;
pub mod prep;
pub mod run;
mod setup;
pub mod train;

#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;

/// Why `framesmith generate` does not run a HunyuanVideo 1.5 DiT.
const NO_GENERATE: &str = "generating with HunyuanVideo 1.5 needs the byT5 glyph encoder, which Framesmith \
     does not have yet (its 3-D causal VAE decodes: `decode::Hv15Decoder`); use musubi-tuner's hv_1_5_generate_video.py \
     with the LoRA (its names are musubi-tuner's)";

/// HunyuanVideo 1.5: the runs whose `model.dit` is a HunyuanVideo transformer.
pub struct HunyuanVideo15Family;

impl Family for HunyuanVideo15Family {
    fn name(&self) -> &'static str {
        "HunyuanVideo 1.5"
    }

    fn claims(&self, config: &RunConfig) -> bool {
        train::is_hv15_run(config)
    }

    fn config_family(&self) -> ModelFamily {
        ModelFamily::HunyuanVideo15
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
            CachePass::Latents(files) => prep::is_hv15_latent_pass(files),
            // A text pass names Qwen2.5-VL alone, which Qwen-Image's caches take too.
            CachePass::Text(_) => false,
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
            CachePass::Text(_) => {
                anyhow::bail!(
                    "{}: {}",
                    items::MUSUBI_TEXT_CACHES,
                    request.dataset.display()
                )
            }
        }
    }

    fn start_run(
        &self,
        plan: &RunPlan,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> anyhow::Result<RunParts> {
        let Some(dit) = train::hv15_dit_of(plan) else {
            anyhow::bail!(
                "model.dit is not a HunyuanVideo 1.5 transformer; point it at a transformer of \
                 tencent/HunyuanVideo-1.5 (e.g. transformer/480p_t2v) or ComfyUI's hunyuanvideo1.5_*.safetensors"
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
            DitSource::File(path) => train::is_hv15_file(path),
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
