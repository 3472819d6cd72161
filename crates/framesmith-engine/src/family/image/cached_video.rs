//! What a video family that trains from caches made elsewhere shares: the whole [`Family`] impl around what differs
//! ([`CachedVideoFamily`]: its names, its files and caches, its VAE's compression, its plan and its setup). Such a
//! family reads its `model.dit` alone, plans its clip from its latent caches' headers, refuses the cache passes it
//! cannot run and `framesmith generate` with what is missing (a family that has them gives its own), and writes a
//! run's clips as `.mp4`.

use std::path::Path;

use super::items::VideoVae;
use crate::family::{CliCommand, Family};
use crate::generate::request::{DitSource, GenerationOutput, GenerationRequest};
use crate::generate::run::{given, Session};
use crate::plan::{ClipShape, PlanError, PlanModel};
use crate::prep::pass::{CachePass, CacheRequest, LatentFiles, TextFiles};
use crate::prep::{CacheProgress, CacheSummary};
use crate::train::setup::RunParts;
use framesmith_config::protocol::LogLevel;
use framesmith_config::{ModelFamily, RunConfig, RunPlan};
use framesmith_data::{DatasetKind, ValidConfig};

/// What one video family trained from caches says; [`Family`] comes with it.
pub(crate) trait CachedVideoFamily: Sync {
    /// The family's name in logs and errors.
    const NAME: &'static str;
    /// The settings the config validator checks the family's runs for.
    const CONFIG_FAMILY: ModelFamily;
    /// The video VAE's compression, for the clips of cached latents.
    const VAE: VideoVae;
    /// Why a run's `model.dit` is refused when it is not the family's transformer, and what to point it at.
    const NOT_ITS_DIT: &'static str;
    /// What Framesmith lacks to make the caches a refused pass would, and the scripts that make them (a family
    /// that runs both passes leaves it out).
    const NO_CACHE_PASS: &'static str = "Framesmith cannot make this family's caches";
    /// Why `framesmith generate` does not run the family's DiT, and what does (a family that generates leaves it
    /// out).
    const NO_GENERATE: &'static str = "Framesmith cannot generate with this family's DiT";

    /// Whether the run `config` describes trains the family's model.
    fn is_run(config: &RunConfig) -> bool;
    /// Whether `path` is the family's DiT file (read from its header, not its weights).
    fn is_dit_file(path: &Path) -> bool;
    /// Whether `file_name` is one of the family's latent caches in a dataset of `kind`.
    fn is_latent_cache(file_name: &str, kind: DatasetKind) -> bool;
    /// Whether the latent pass of `files` is the family's.
    fn claims_latent_pass(files: &LatentFiles) -> bool;
    /// The model the run `config` names, as the planner sees it, when it is the family's.
    fn plan_model(config: &RunConfig) -> Option<Result<PlanModel, PlanError>>;
    /// The family's part of a run from `plan`; `None` when `model.dit` is not the family's transformer.
    fn start_run(
        plan: &RunPlan,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> Option<anyhow::Result<RunParts>>;
    /// The latent pass of `request` over `files`; refused with [`Self::NO_CACHE_PASS`] unless the family has one.
    fn cache_latents(
        request: &CacheRequest<'_>,
        _files: &LatentFiles,
        _progress: &mut dyn CacheProgress,
        _log: &mut dyn FnMut(&str),
    ) -> anyhow::Result<CacheSummary> {
        anyhow::bail!("{}: {}", Self::NO_CACHE_PASS, request.dataset.display())
    }
    /// Whether the text pass of `files` is the family's (never, unless the family caches captions: its text
    /// encoder alone may be another family's too).
    fn claims_text_pass(_files: &TextFiles) -> bool {
        false
    }
    /// The text pass of `request` over `files`; refused with [`Self::NO_CACHE_PASS`] unless the family has one.
    fn cache_text(
        request: &CacheRequest<'_>,
        _files: &TextFiles,
        _progress: &mut dyn CacheProgress,
        _log: &mut dyn FnMut(&str),
    ) -> anyhow::Result<CacheSummary> {
        anyhow::bail!("{}: {}", Self::NO_CACHE_PASS, request.dataset.display())
    }
    /// `framesmith generate` with the family's DiT; refused with [`Self::NO_GENERATE`] unless the family has it.
    fn generate(
        request: &GenerationRequest,
        _session: &mut Session,
    ) -> anyhow::Result<GenerationOutput> {
        let dit = match &request.dit {
            DitSource::File(path) => path.display().to_string(),
            DitSource::Demo => String::new(),
        };
        anyhow::bail!("{}: {dit}", Self::NO_GENERATE)
    }
    /// What the family's models take from the flags of `command`, for its `--help` (`None`: nothing said).
    fn flag_help(_command: CliCommand) -> Option<&'static str> {
        None
    }
    /// Whether the family's models can make sound with a clip.
    const MAKES_SOUND: bool = false;
}

impl<F: CachedVideoFamily> Family for F {
    fn name(&self) -> &'static str {
        F::NAME
    }

    fn claims(&self, config: &RunConfig) -> bool {
        F::is_run(config)
    }

    fn config_family(&self) -> ModelFamily {
        F::CONFIG_FAMILY
    }

    fn plan_model(&self, config: &RunConfig) -> Option<Result<PlanModel, PlanError>> {
        F::plan_model(config)
    }

    fn largest_cached_clip(&self, valid: &ValidConfig, _demo: bool) -> Option<ClipShape> {
        F::VAE.largest_cached_clip(valid, F::is_latent_cache)
    }

    fn settings_to_check(&self, config: &RunConfig) -> RunConfig {
        super::settings_with_auto_variant(config)
    }

    fn claims_cache(&self, pass: &CachePass) -> bool {
        match pass {
            CachePass::Latents(files) => F::claims_latent_pass(files),
            CachePass::Text(files) => F::claims_text_pass(files),
        }
    }

    fn cache(
        &self,
        request: &CacheRequest<'_>,
        progress: &mut dyn CacheProgress,
        log: &mut dyn FnMut(&str),
    ) -> anyhow::Result<CacheSummary> {
        match &request.pass {
            CachePass::Latents(files) => F::cache_latents(request, files, progress, log),
            CachePass::Text(files) => F::cache_text(request, files, progress, log),
        }
    }

    fn start_run(
        &self,
        plan: &RunPlan,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> anyhow::Result<RunParts> {
        F::start_run(plan, log).unwrap_or_else(|| anyhow::bail!("{}", F::NOT_ITS_DIT))
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
            DitSource::File(path) => F::is_dit_file(path),
            DitSource::Demo => false,
        }
    }

    fn generate(
        &self,
        request: &GenerationRequest,
        session: &mut Session,
    ) -> anyhow::Result<GenerationOutput> {
        F::generate(request, session)
    }

    fn flag_help(&self, command: CliCommand) -> Option<&'static str> {
        F::flag_help(command)
    }

    fn makes_sound(&self) -> bool {
        F::MAKES_SOUND
    }
}
