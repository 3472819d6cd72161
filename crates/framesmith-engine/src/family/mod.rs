//! Model families, the engine's one axis (DESIGN.md §4.8). Everything model-specific goes through two traits:
//! [`Family`] (which runs are the family's and how one starts: load, streaming, FP8, the model the planner describes,
//! the memory plan, the cached items, the LoRA and its metadata, samples, the cache passes) and [`FamilyRun`] (the
//! family's models in a started run: the micro-step, validation, samples, a second expert or device).
//! [`Family::generate`] is the family's part of the one generation call ([`crate::generate::run`]). Adding a family
//! is a folder here, an impl of both and one line in [`FAMILIES`]; `train/`, `plan/`, `prep/` and `generate/` name
//! no family.

use std::path::Path;

use crate::train::noise::StepRng;
use candle_core::Device;

use crate::generate::request::{DitSource, GenerationOutput, GenerationRequest};
use crate::generate::run::Session;
use crate::plan::{clip_pixels, ClipShape, PlanError, PlanModel};
use crate::prep::pass::{CachePass, CacheRequest};
use crate::prep::{CacheProgress, CacheSummary};
use crate::train::data::TrainItem;
use crate::train::optimizer::AdamW;
use crate::train::samples::SampleFiles;
use crate::train::setup::RunParts;
use crate::train::step::{StepError, StepOptions, StepOutput};
use crate::train::trainer::ExpertStep;
use crate::train::validation::Validation;
use framesmith_config::protocol::LogLevel;
use framesmith_config::training::TimestepConfig;
use framesmith_config::{ModelFamily, RunConfig, RunPlan};
use framesmith_data::ValidConfig;
use framesmith_nn::lora::LoraSet;
use framesmith_nn::lora_file::SaveLayout;

pub mod flux;
pub mod hunyuan_video15;
pub mod image;
pub mod ltx2;
pub mod qwen_image;
#[cfg(test)]
pub(crate) mod testkit;
pub mod wan;

/// A model family: which runs are its own and how one of them starts.
pub trait Family: Sync {
    /// The family's name in logs and errors (`Wan`, `FLUX.1`).
    fn name(&self) -> &'static str;
    /// Whether the run `config` describes trains this family's model (what its `model.dit` file is).
    fn claims(&self, config: &RunConfig) -> bool;
    /// The settings the config validator checks this family's runs for.
    fn config_family(&self) -> ModelFamily;
    /// The model the run `config` names, as the planner sees it, when it is one of this family's (a variant it
    /// names, or a file of the family's); `None` when it is not.
    fn plan_model(&self, config: &RunConfig) -> Option<Result<PlanModel, PlanError>>;
    /// `config` as a plan's check of the settings takes it: a plan may name the family's model by a variant that a
    /// run reads from its file instead.
    fn settings_to_check(&self, config: &RunConfig) -> RunConfig {
        config.clone()
    }
    /// The largest clip among this family's latent caches of `valid`'s datasets (a run trains what is cached; `demo`:
    /// the caches are the demo model's); `None` when there is none.
    fn largest_cached_clip(&self, _valid: &ValidConfig, _demo: bool) -> Option<ClipShape> {
        None
    }
    /// Whether the cache pass `pass` names this family's files (its autoencoder, its text encoders).
    fn claims_cache(&self, pass: &CachePass) -> bool;
    /// Caches the dataset of `request`, a pass [`Family::claims_cache`] said is this family's: its encoders loaded
    /// on the device `request.open` gives, `progress` following the items, `log` taking the lines worth showing.
    fn cache(
        &self,
        request: &CacheRequest<'_>,
        progress: &mut dyn CacheProgress,
        log: &mut dyn FnMut(&str),
    ) -> anyhow::Result<CacheSummary>;
    /// The family's part of a run from a plan validated for it: the device opened, the model loaded (streamed
    /// and in FP8 as the plan says), the LoRA attached, the training items loaded, the samples prepared.
    fn start_run(
        &self,
        plan: &RunPlan,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> anyhow::Result<RunParts>;
    /// The generation request for the models of the run `config` (its prompt and settings left to the caller),
    /// written to `out_stem` with the family's extension; a family that makes clips sets `frames`.
    fn run_request(&self, config: &RunConfig, out_stem: &Path) -> GenerationRequest;
    /// Whether `dit` is this family's DiT, for generation.
    fn claims_dit(&self, dit: &DitSource) -> bool;
    /// Generates what `request` asks for with this family's models: the request checked before anything loads
    /// (options the family does not take refused by name), the models loaded one after the other, the clip or
    /// image written; the steps, the log and the cancel poll go through `session`.
    fn generate(
        &self,
        request: &GenerationRequest,
        session: &mut Session,
    ) -> anyhow::Result<GenerationOutput>;
    /// What the family's models take from the flags of `command` (which files, which defaults), for its
    /// `--help`; `None` when the family says nothing there.
    fn flag_help(&self, _command: CliCommand) -> Option<&'static str> {
        None
    }
    /// Whether the family's models can make sound with a clip (a request's `sound`); others refuse `--sound`.
    fn makes_sound(&self) -> bool {
        false
    }
}

/// A command whose flags mean something different for each family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CliCommand {
    /// `framesmith generate`.
    Generate,
    /// `framesmith cache latents`.
    CacheLatents,
    /// `framesmith cache text`.
    CacheText,
    /// `framesmith plan`.
    Plan,
}

/// The `--help` section of `command` that says, family by family, what each family takes from its flags.
pub fn flag_help(command: CliCommand) -> String {
    let mut text = String::from("Model families:");
    for family in FAMILIES.iter().rev() {
        if let Some(help) = family.flag_help(command) {
            text.push_str(&format!("\n  {}: {help}", family.name()));
        }
    }
    text
}

/// Every family, in the order they are asked whether a run is theirs; the last takes any run no other claims.
static FAMILIES: [&dyn Family; 5] = [
    &ltx2::Ltx2Family,
    &hunyuan_video15::HunyuanVideo15Family,
    &qwen_image::QwenImageFamily,
    &flux::FluxFamily,
    &wan::WanFamily,
];

/// The family the run `config` trains.
pub fn family_of(config: &RunConfig) -> &'static dyn Family {
    FAMILIES
        .iter()
        .find(|f| f.claims(config))
        .copied()
        .unwrap_or(FAMILIES[FAMILIES.len() - 1])
}

/// The family whose DiT `dit` is (the last family takes any DiT no other claims).
pub fn family_of_dit(dit: &DitSource) -> &'static dyn Family {
    FAMILIES
        .iter()
        .find(|f| f.claims_dit(dit))
        .copied()
        .unwrap_or(FAMILIES[FAMILIES.len() - 1])
}

/// The largest clip among the latent caches of `valid`'s datasets, every family's caches looked at.
pub(crate) fn largest_cached_clip(valid: &ValidConfig, demo: bool) -> Option<ClipShape> {
    FAMILIES
        .iter()
        .filter_map(|f| f.largest_cached_clip(valid, demo))
        .max_by_key(clip_pixels)
}

/// The family whose files the cache pass `pass` names; the last takes any pass no other claims.
pub(crate) fn family_of_cache(pass: &CachePass) -> &'static dyn Family {
    FAMILIES
        .iter()
        .find(|f| f.claims_cache(pass))
        .copied()
        .unwrap_or(FAMILIES[FAMILIES.len() - 1])
}

/// The model the run `config` names, as its family describes it to the planner: the first family that knows it.
pub fn plan_model_of(config: &RunConfig) -> Result<PlanModel, PlanError> {
    FAMILIES
        .iter()
        .find_map(|f| f.plan_model(config))
        .unwrap_or(Err(PlanError::UnknownModel))
}

/// What a micro-step needs from the run besides its batch.
pub struct StepContext<'a> {
    /// How timesteps are drawn and weighted (`[training.timesteps]`).
    pub timesteps: &'a TimestepConfig,
    /// The run's LoRA (the only one, or the first of two).
    pub loras: &'a LoraSet,
    /// The run's memory settings and the cancel poll.
    pub options: &'a StepOptions<'a>,
}

/// What one micro-step did.
pub struct MicroStep {
    /// Whether it ran through the run's second model (Wan2.2 A14B's low-noise expert), whose LoRA, when it has
    /// its own ([`FamilyRun::second_lora`]), takes its gradients.
    pub second: bool,
    /// The step's output (its gradients on the first model's device), or why there is none.
    pub result: Result<StepOutput, StepError>,
}

/// A family's models in a started run: what the trainer asks of them, the same for every family.
pub trait FamilyRun {
    /// The device the run's (first) model computes on; its LoRA and optimizer live there.
    fn device(&self) -> &Device;
    /// A second device the run computes on (a low-noise expert on a GPU of its own).
    fn second_device(&self) -> Option<&Device> {
        None
    }
    /// A second LoRA, trained with its own optimizer beside the first (Wan2.2 A14B's `split` experts).
    fn second_lora(&self) -> Option<&(LoraSet, AdamW)> {
        None
    }
    /// [`FamilyRun::second_lora`], mutable.
    fn second_lora_mut(&mut self) -> Option<&mut (LoraSet, AdamW)> {
        None
    }
    /// The keys the run's saved LoRA files use (the training state's copy is always musubi-tuner's).
    fn lora_layout(&self) -> SaveLayout {
        SaveLayout::Musubi
    }
    /// Sets the copies of `loras` on other devices equal to it (after an update or a resume).
    fn sync_lora(&self, _loras: &LoraSet) -> anyhow::Result<()> {
        Ok(())
    }
    /// One micro-batch: its timesteps and noise drawn from `rng`, the family's batch, the checkpointed step.
    fn micro_step(
        &mut self,
        batch: &[&TrainItem],
        rng: &mut StepRng,
        ctx: &StepContext<'_>,
    ) -> anyhow::Result<MicroStep>;
    /// The experts' part of a step's report, the last micro-step having run on the `second` model (`None` for a
    /// run of one model).
    fn expert_step(&self, _second: bool) -> Option<ExpertStep> {
        None
    }
    /// How many times two models changed places on the GPU (0 for a run of one model).
    fn expert_switches(&self) -> usize {
        0
    }
    /// The summed loss over `validation`'s items × its timesteps, forward only, with the LoRA as it is now.
    fn validation_loss(
        &mut self,
        validation: &Validation,
        timesteps: &TimestepConfig,
        interrupted: &dyn Fn() -> bool,
    ) -> anyhow::Result<f64>;
    /// How many samples the run makes each time (0 without samples).
    fn sample_count(&self) -> usize;
    /// The prompt of sample `i`.
    fn sample_prompt(&self, i: usize) -> &str;
    /// Makes sample `i` with the LoRA being trained, written into `dir` under the name `stem`; `cancelled` is
    /// polled between denoising steps, and a true answer ends the sample with an error.
    fn sample(
        &mut self,
        i: usize,
        dir: &Path,
        stem: &str,
        cancelled: &dyn Fn() -> bool,
    ) -> anyhow::Result<SampleFiles>;
    /// The run's models as `Any`, for tests that look inside them.
    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any;
}
