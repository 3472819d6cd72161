//! `framesmith plan`: peak VRAM and RAM of a training configuration before it runs, how many blocks to stream,
//! and what to change when it does not fit. Reads a run config (with presets), flags, or both (flags win).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use framesmith_config::protocol::memory::format_gib;
use framesmith_config::protocol::memory::Verdict;
use framesmith_config::run::{AutoKeyword, BlocksToSwap};
use framesmith_config::{
    check_settings, family_settings, presets, FamilySetting, HostInfo, RunConfig,
};
use framesmith_engine::plan::{
    clip_for_config, machine, model_for_config, plan, ClipShape, PlanInput,
};
use serde::de::DeserializeOwned;

/// Exit status when the configuration does not fit the budget (errors exit with 1, bad flags with 2).
pub const EXIT_DOES_NOT_FIT: u8 = 3;

const GIB: f64 = (1u64 << 30) as f64;

/// `plan` options. Exits with 0 when it fits (or no budget is known), 3 when it does not fit, 1 on an error (2: bad flags).
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Run config (TOML) to plan; the flags below override it
    #[arg(long)]
    config: Option<PathBuf>,
    /// Presets applied over the config, in order
    #[arg(long = "preset")]
    presets: Vec<String>,
    /// Model variant (each family's are listed under "Model families")
    #[arg(long)]
    variant: Option<String>,
    /// Training mode: auto, text_to_video (t2v) or image_to_video (i2v); image-to-video TI2V-5B steps carry
    /// per-token timesteps
    #[arg(long, value_parser = config_value::<framesmith_config::run::TrainingMode>)]
    mode: Option<framesmith_config::run::TrainingMode>,
    /// Base weights: f32, bf16, f16 or fp8
    #[arg(long, value_parser = config_value::<framesmith_config::run::BaseDtype>)]
    base: Option<framesmith_config::run::BaseDtype>,
    /// FP8 scales: tensor, channel or block64
    #[arg(long, value_parser = config_value::<framesmith_config::run::Fp8ScaleMode>)]
    fp8_scale: Option<framesmith_config::run::Fp8ScaleMode>,
    /// Residual stream: f32 or bf16
    #[arg(long, value_parser = config_value::<framesmith_config::run::ResidualDtype>)]
    residual: Option<framesmith_config::run::ResidualDtype>,
    /// Clip width in pixels (multiple of 16; 32 for ti2v-5b)
    #[arg(long)]
    width: Option<usize>,
    /// Clip height in pixels
    #[arg(long)]
    height: Option<usize>,
    /// Frames per clip (4k + 1; 1 for images)
    #[arg(long)]
    frames: Option<usize>,
    /// Samples per step
    #[arg(long)]
    batch: Option<usize>,
    /// LoRA rank
    #[arg(long)]
    rank: Option<usize>,
    /// Block streaming: off, pinned, staged or auto (the planner picks pinned or staged)
    #[arg(long, value_parser = config_value::<framesmith_config::run::StreamingMode>)]
    streaming: Option<framesmith_config::run::StreamingMode>,
    /// Blocks to stream: a count or `auto` (the fewest that fit the budget)
    #[arg(long, value_parser = blocks_value)]
    blocks_to_swap: Option<BlocksToSwap>,
    /// Saved block inputs: device, host, pinned, pageable or auto (the planner picks)
    #[arg(long, value_parser = config_value::<framesmith_config::run::ActivationPlacement>)]
    activations: Option<framesmith_config::run::ActivationPlacement>,
    /// What the step keeps from each block's forward: blocks (inputs only), attention, attention_projection (and
    /// the output projection's input where a block has one), off (everything) or auto (the most that fits)
    #[arg(long, value_parser = config_value::<framesmith_config::run::Checkpointing>)]
    checkpointing: Option<framesmith_config::run::Checkpointing>,
    #[command(flatten)]
    family: FamilyFlags,
    /// Page-locked staging buffers of `staged` streaming
    #[arg(long)]
    staging_slots: Option<usize>,
    /// GPU slots streamed blocks are copied into
    #[arg(long)]
    gpu_slots: Option<usize>,
    /// VRAM budget in GiB (default: the card's free memory minus headroom)
    #[arg(long, allow_negative_numbers = true)]
    vram_budget_gb: Option<f64>,
    /// Plan for a card with this much free memory (GiB) instead of this machine's
    #[arg(long, allow_negative_numbers = true)]
    free_vram_gb: Option<f64>,
    /// Plan a run over these GPUs of this machine (as `framesmith train --gpus`): one rank per GPU, each against
    /// its own card (the one with the least free memory decides), their RAM together against the machine's
    #[arg(long, value_delimiter = ',', value_name = "IDS")]
    gpus: Vec<usize>,
    /// Plan for a machine of this much RAM (GiB) instead of this one, all of it free
    #[arg(long, allow_negative_numbers = true)]
    ram_gb: Option<f64>,
    /// RAM budget in GiB (default: what this machine can give without swapping)
    #[arg(long, allow_negative_numbers = true)]
    ram_budget_gb: Option<f64>,
    /// Page-locked RAM budget in GiB (default: on Windows about half of RAM, elsewhere the RAM budget)
    #[arg(long, allow_negative_numbers = true)]
    pinned_budget_gb: Option<f64>,
    /// Leave out AdamW's moments and the CUDA context, as `framesmith-bench step|stream` measure peaks
    #[arg(long)]
    as_bench: bool,
    /// Print the plan as JSON
    #[arg(long)]
    json: bool,
}

/// The flags of the settings only one family reads ([`family_settings`]), each with the value given.
#[derive(Debug, Default)]
struct FamilyFlags(Vec<(&'static FamilySetting, String)>);

impl FamilyFlags {
    /// `cfg` with each given setting applied.
    fn apply(&self, mut cfg: RunConfig) -> anyhow::Result<RunConfig> {
        for (setting, value) in &self.0 {
            cfg = setting.apply(&cfg, value)?;
        }
        Ok(cfg)
    }
}

impl clap::FromArgMatches for FamilyFlags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let given = family_settings()
            .filter_map(|s| Some((s, matches.get_one::<String>(s.flag)?.to_ascii_lowercase())))
            .collect();
        Ok(Self(given))
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for FamilyFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        family_settings().fold(cmd, |cmd, s| {
            cmd.arg(
                clap::Arg::new(s.flag)
                    .long(s.flag)
                    .help(s.help)
                    .ignore_case(true)
                    .value_parser(clap::builder::PossibleValuesParser::new(s.choices)),
            )
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// Parses a flag with the run config's own spelling (`fp8`, `block64`, `pinned`, …).
fn config_value<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(text.to_ascii_lowercase()))
        .map_err(|err| format!("`{text}`: {err}"))
}

fn blocks_value(text: &str) -> Result<BlocksToSwap, String> {
    if text.eq_ignore_ascii_case("auto") {
        return Ok(BlocksToSwap::Auto(AutoKeyword::Auto));
    }
    text.parse()
        .map(BlocksToSwap::Count)
        .map_err(|_| format!("`{text}` is not a block count or `auto`"))
}

fn gib(value: f64, flag: &str) -> anyhow::Result<u64> {
    if !(value.is_finite() && value > 0.0) {
        bail!("{flag} must be a positive number of GiB, not {value}");
    }
    Ok((value * GIB) as u64)
}

/// The run config the flags describe: the file with its presets (or the defaults), then the flags.
fn resolved_config(args: &PlanArgs) -> anyhow::Result<RunConfig> {
    // A key the config file sets wins over a preset's, as in `framesmith train`.
    let (mut cfg, explicit) = match &args.config {
        Some(path) => RunConfig::load_explicit(path)?,
        None => (RunConfig::default(), Default::default()),
    };
    for name in &args.presets {
        let applied = presets::builtin(name)?.apply_keeping(&cfg, &explicit)?;
        for kept in &applied.kept {
            eprintln!("preset {name}: {}", kept.kept_line());
        }
        cfg = applied.config;
    }
    let m = &mut cfg.model;
    if let Some(v) = &args.variant {
        m.variant = v.clone();
        m.demo = false;
    }
    m.base_dtype = args.base.unwrap_or(m.base_dtype);
    m.fp8_scale = args.fp8_scale.unwrap_or(m.fp8_scale);
    m.residual_dtype = args.residual.unwrap_or(m.residual_dtype);
    cfg.lora.rank = args.rank.unwrap_or(cfg.lora.rank);
    cfg.training.mode = args.mode.unwrap_or(cfg.training.mode);
    let mem = &mut cfg.memory;
    mem.streaming = args.streaming.unwrap_or(mem.streaming);
    mem.blocks_to_swap = args.blocks_to_swap.unwrap_or(mem.blocks_to_swap);
    mem.activations = args.activations.unwrap_or(mem.activations);
    mem.checkpointing = args.checkpointing.unwrap_or(mem.checkpointing);
    mem.staging_slots = args.staging_slots.unwrap_or(mem.staging_slots);
    if let Some(gb) = args.vram_budget_gb {
        gib(gb, "--vram-budget-gb")?;
        mem.vram_budget_gb = Some(gb);
    }
    if let Some(gb) = args.ram_budget_gb {
        gib(gb, "--ram-budget-gb")?;
        mem.ram_budget_gb = Some(gb);
    }
    if let Some(gb) = args.pinned_budget_gb {
        gib(gb, "--pinned-budget-gb")?;
        mem.pinned_budget_gb = Some(gb);
    }
    args.family.apply(cfg)
}

fn clip(args: &PlanArgs, cfg: &RunConfig) -> (ClipShape, Option<String>) {
    let (mut clip, note) = clip_for_config(cfg);
    let flags = [args.width, args.height, args.frames];
    clip.width = args.width.unwrap_or(clip.width);
    clip.height = args.height.unwrap_or(clip.height);
    clip.frames = args.frames.unwrap_or(clip.frames);
    clip.batch = args.batch.unwrap_or(clip.batch);
    // The flags may have named what the config did not.
    let note = note.filter(|_| flags.iter().any(Option::is_none));
    (clip, note)
}

/// `--gpus`: one rank per GPU on this machine, planned against the card with the least free memory (`free` reads
/// a card's; the ranks all stream the same blocks). Returns a note naming that card when the cards differ.
fn plan_gpus(
    input: &mut PlanInput,
    gpus: &[usize],
    free: impl Fn(usize) -> Option<u64>,
) -> anyhow::Result<Option<String>> {
    if gpus.is_empty() {
        return Ok(None);
    }
    let mut seen = gpus.to_vec();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != gpus.len() {
        bail!("--gpus names a GPU twice ({gpus:?}): list each GPU once, e.g. --gpus 0,1");
    }
    input.ranks_on_machine = gpus.len();
    let cards: Vec<(usize, u64)> = gpus
        .iter()
        .filter_map(|&g| free(g).map(|bytes| (g, bytes)))
        .collect();
    let Some(&(tightest, bytes)) = cards.iter().min_by_key(|(_, bytes)| *bytes) else {
        input.free_vram_bytes = None;
        return Ok(None);
    };
    input.free_vram_bytes = Some(bytes);
    let differ = cards.iter().any(|&(_, b)| b != bytes);
    Ok(differ.then(|| {
        format!(
            "planned against GPU {tightest}, the one of --gpus with the least free memory ({})",
            format_gib(bytes)
        )
    }))
}

/// Runs `framesmith plan`.
pub fn run(args: &PlanArgs) -> anyhow::Result<ExitCode> {
    if args.config.is_none() && args.variant.is_none() {
        bail!("name the model to plan: --variant t2v-14b (or --config run.toml)");
    }
    let cfg = resolved_config(args)?;
    let model = model_for_config(&cfg).context("cannot tell which model to plan")?;
    let family = model.family();
    for name in &args.presets {
        presets::builtin(name)?.check_family(family.config_family())?;
    }
    // What `framesmith train` would refuse in the settings, `plan` refuses too (files and devices aside: a plan
    // may be made before the files are there, or for another machine).
    let host = HostInfo::new(framesmith_nn::device::usable_count());
    let settings = family.settings_to_check(&cfg);
    check_settings(&settings, &host, family.config_family())?;
    let (clip, clip_note) = clip(args, &cfg);
    let mut input = PlanInput::from_config(&cfg, model, clip);
    input.probe_machine(cfg.training.device);
    let gpus_note = plan_gpus(&mut input, &args.gpus, machine::free_vram_bytes)?;
    input.optimizer_and_context = !args.as_bench;
    if let Some(slots) = args.gpu_slots {
        input.streaming.gpu_slots = slots;
    }
    if let Some(gb) = args.free_vram_gb {
        input.free_vram_bytes = Some(gib(gb, "--free-vram-gb")?);
    }
    if let Some(gb) = args.ram_gb {
        input.host_ram_bytes = Some(gib(gb, "--ram-gb")?);
        input.available_ram_bytes = None;
    }
    let mut report = plan(&input)?;
    report.notes.extend(clip_note);
    report.notes.extend(gpus_note);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(match report.verdict {
        Verdict::DoesNotFit => ExitCode::from(EXIT_DOES_NOT_FIT),
        Verdict::Fits | Verdict::NoBudget => ExitCode::SUCCESS,
    })
}
