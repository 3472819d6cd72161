//! The `framesmith` binary: parses the command line and starts the GUI or a headless command. The only place
//! that wires the app and the engine together.

mod cli;
mod platform;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use framesmith_config::{presets, RunConfig};
use framesmith_engine::family::{flag_help, CliCommand};
use framesmith_engine::train::launch::{self, Launch};
use framesmith_engine::train::ranks::Ranks;

#[derive(Parser)]
#[command(
    name = "framesmith",
    version,
    about = "Train LoRA adapters for Wan video diffusion models"
)]
struct Cli {
    /// Render the app with the demo project into a PNG after a few frames, then exit
    #[arg(long, value_name = "PATH")]
    screenshot: Option<PathBuf>,
    /// With --screenshot: show the finished run in this output folder (run.toml, metrics.jsonl, samples/)
    #[arg(long, value_name = "DIR", requires = "screenshot")]
    run: Option<PathBuf>,
    /// With --screenshot and --run: first try the run's LoRA on this prompt in the Samples tab (as its Generate
    /// button does) and capture the clip it makes in the player
    #[arg(long, value_name = "PROMPT", requires = "run")]
    generate: Option<String>,
    /// Open the app on this run config (TOML) instead of the last session's project
    #[arg(long, value_name = "RUN_TOML", conflicts_with = "screenshot")]
    open: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Train a LoRA from a run config; several `--config` run one after another
    Train {
        /// Run config (TOML); repeat to queue several runs on one engine
        #[arg(long, required = true)]
        config: Vec<PathBuf>,
        /// Presets applied over the config, in order
        #[arg(long = "preset")]
        presets: Vec<String>,
        /// Continue from a training-state folder (or an output folder holding them); one config only
        #[arg(long)]
        resume: Option<PathBuf>,
        /// Use at most this many GB of VRAM (sets memory.vram_budget_gb over the config and presets)
        #[arg(long = "vram-budget-gb", value_name = "GB")]
        vram_budget_gb: Option<f64>,
        #[command(flatten)]
        ranks: cli::ranks::RankArgs,
        /// Write every engine event as a JSON line on stdout and read commands from stdin (for the app)
        #[arg(long = "events-json", hide = true)]
        events_json: bool,
    },
    /// Train the built-in tiny demo model on generated clips (CPU, no downloads)
    Demo {
        /// Folder for the demo dataset and outputs
        #[arg(long, default_value = "framesmith-demo")]
        out: PathBuf,
        /// Optimizer steps (default: the demo-cpu preset's)
        #[arg(long)]
        steps: Option<usize>,
    },
    /// List the presets, or show what one changes
    Presets {
        #[command(subcommand)]
        action: Option<PresetAction>,
    },
    /// Say what a model file or folder is
    Inspect { path: PathBuf },
    /// Adapter files: convert between key layouts, merge into a base model, resize, inspect
    Lora {
        #[command(subcommand)]
        action: cli::lora::LoraAction,
    },
    /// Datasets: check a musubi-tuner dataset TOML or a folder
    Dataset {
        #[command(subcommand)]
        action: DatasetAction,
    },
    /// Cache a dataset's VAE latents or text-encoder outputs (musubi-tuner's cache files)
    Cache {
        #[command(subcommand)]
        action: cli::cache::CacheAction,
    },
    /// Generate a clip or an image from a prompt with a DiT and LoRAs
    #[command(after_help = flag_help(CliCommand::Generate))]
    Generate(Box<cli::generate::GenerateArgs>),
    /// Predict peak VRAM and RAM of a training config, and how many blocks to stream
    #[command(after_help = flag_help(CliCommand::Plan))]
    Plan(Box<cli::plan::PlanArgs>),
    /// Check this build and machine for training (GPU, driver, CUDA libraries, memory, ffmpeg, disk): each problem
    /// with its fix; exits with 3 when something blocks training
    Doctor(cli::doctor::DoctorArgs),
    /// Compare a module against reference fixture directories made by the official Wan code
    CheckParity {
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
    },
}

#[derive(Subcommand)]
enum DatasetAction {
    /// List every problem in a dataset (a musubi-tuner TOML, or a folder of media and captions)
    Check {
        path: PathBuf,
        /// Count entries that cannot be read (a dangling link, a FIFO, a file that does not decode) as warnings,
        /// as training with `skip_unreadable = true` leaves them out, instead of as errors
        #[arg(long)]
        skip_unreadable: bool,
    },
}

#[derive(Subcommand)]
enum PresetAction {
    /// Show the fields a preset sets and why
    Show { name: String },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        None => {
            let detached = cli.screenshot.is_none() && platform::release_own_console();
            open_app(cli.screenshot, (cli.run, cli.generate), cli.open).inspect_err(|err| {
                if detached {
                    show_startup_error(err);
                }
            })
        }
        Some(Command::Train {
            config,
            presets,
            resume,
            vram_budget_gb,
            ranks,
            events_json,
        }) => train(
            &config,
            &presets,
            TrainOptions {
                resume,
                vram_budget_gb,
                events_json,
            },
            &ranks,
        ),
        Some(Command::Demo { out, steps }) => {
            cli::demo::run_demo(&out, steps).map(|_| ExitCode::SUCCESS)
        }
        Some(Command::Presets { action }) => show_presets(action),
        Some(Command::Inspect { path }) => inspect(&path),
        Some(Command::Lora { action }) => cli::lora::run(action),
        Some(Command::Dataset {
            action:
                DatasetAction::Check {
                    path,
                    skip_unreadable,
                },
        }) => dataset_check(&path, skip_unreadable),
        Some(Command::CheckParity { dirs }) => check_parity(&dirs),
        Some(Command::Cache { action }) => cli::cache::run(&action).map(|_| ExitCode::SUCCESS),
        Some(Command::Generate(args)) => cli::generate::run(&args).map(|_| ExitCode::SUCCESS),
        Some(Command::Plan(args)) => cli::plan::run(&args),
        Some(Command::Doctor(args)) => cli::doctor::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Opens the desktop app (or renders it into a PNG with `--screenshot`).
#[cfg(feature = "gui")]
fn open_app(
    screenshot: Option<PathBuf>,
    (run, generate): (Option<PathBuf>, Option<String>),
    open: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    use std::sync::Arc;
    if let Some(why) = framesmith_app::display_missing() {
        anyhow::bail!(why);
    }
    if let Some(path) = &open {
        if !path.is_file() {
            anyhow::bail!(
                "cannot open {}: no such run config (give the path of a run TOML, e.g. one saved from the app)",
                path.display()
            );
        }
    }
    let mut options =
        framesmith_app::AppOptions::new(Arc::new(framesmith::gui::EngineBackend::new()?));
    options.project = open;
    match (screenshot, run, generate) {
        (Some(path), Some(run), Some(prompt)) => {
            framesmith_app::screenshot_of_generation(options, &path, &run, &prompt)?
        }
        (Some(path), Some(run), None) => framesmith_app::screenshot_of_run(options, &path, &run)?,
        (Some(path), None, _) => framesmith_app::screenshot_with(options, &path)?,
        (None, _, _) => framesmith_app::run_app(options)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The app's console is gone when it was started from a shortcut: a failure to open the window goes to a
/// message box, or nobody would see it.
#[cfg(feature = "gui")]
fn show_startup_error(err: &anyhow::Error) {
    rfd::MessageDialog::new()
        .set_level(rfd::MessageLevel::Error)
        .set_title("Framesmith could not start")
        .set_description(format!("{err:#}"))
        .show();
}

#[cfg(not(feature = "gui"))]
fn show_startup_error(_err: &anyhow::Error) {}

/// Without the GUI feature, `framesmith` alone runs the headless demo.
#[cfg(not(feature = "gui"))]
fn open_app(
    screenshot: Option<PathBuf>,
    _run: (Option<PathBuf>, Option<String>),
    open: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    if screenshot.is_some() || open.is_some() {
        anyhow::bail!("this build has no GUI (built without the `gui` feature)");
    }
    cli::demo::run_demo(&cli::demo::default_demo_dir(), None)?;
    Ok(ExitCode::SUCCESS)
}

/// The options of `framesmith train` besides its configs, presets and ranks.
struct TrainOptions {
    resume: Option<PathBuf>,
    vram_budget_gb: Option<f64>,
    /// `--events-json`: events on stdout and commands on stdin as JSON lines, for the app.
    events_json: bool,
}

/// Runs the configs one after another on one engine thread; fails when any run failed.
fn train(
    configs: &[PathBuf],
    names: &[String],
    options: TrainOptions,
    rank_args: &cli::ranks::RankArgs,
) -> anyhow::Result<ExitCode> {
    // The first run's time to its first step counts from here.
    framesmith_engine::train::startup::program_started();
    let TrainOptions {
        resume,
        vram_budget_gb,
        events_json,
    } = options;
    if let Some(gb) = vram_budget_gb {
        if !(gb.is_finite() && gb > 0.0) {
            anyhow::bail!("--vram-budget-gb must be a positive number of GB, not {gb}");
        }
    }
    if resume.is_some() && configs.len() > 1 {
        anyhow::bail!(
            "--resume continues one run, but {} configs were given: resume with a single --config",
            configs.len()
        );
    }
    let ranks = match ranks_of(configs.len(), rank_args, events_json)? {
        Start::Train(ranks) => ranks,
        Start::Launched(code) => return Ok(code),
    };
    let load = |path: &std::path::Path| load_config(path, names, vram_budget_gb);
    let output = if events_json {
        // Rank 0 alone takes commands (the others have no stdin, and follow rank 0's stop).
        cli::run::Output::EventsJson {
            commands: ranks.rank() == 0,
        }
    } else {
        cli::run::Output::Terminal
    };
    let ends = cli::run::run_queue(configs, load, resume, ranks, output)?;
    // One run has said how it ended; a queue gets a line per config.
    if configs.len() > 1 {
        for line in cli::run::summary_lines(&ends) {
            println!("{line}");
        }
    }
    let failed = ends
        .iter()
        .any(|(_, end)| matches!(end, Some(cli::run::RunEnd::Failed(_))));
    if cli::interrupt::interrupted() {
        // Stopped by Ctrl-C (or SIGTERM): saved, but not finished, as a script running it should learn.
        return Ok(ExitCode::from(cli::interrupt::EXIT_INTERRUPTED));
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// What `train` does after reading the rank flags.
enum Start {
    /// Train in this process, as these ranks.
    Train(Ranks),
    /// One process per GPU was started and has ended (`--gpus 0,1`), with this exit code.
    Launched(ExitCode),
}

/// The ranks this process trains as, or the exit of the processes it started, one per GPU.
fn ranks_of(
    configs: usize,
    rank_args: &cli::ranks::RankArgs,
    events_json: bool,
) -> anyhow::Result<Start> {
    let ranks = match launch::resolve(&rank_args.options(), |name| std::env::var(name).ok())? {
        Launch::One => Ranks::One,
        launch if configs > 1 => {
            anyhow::bail!(
                "a run over several GPUs trains one config at a time, but {configs} were given ({launch:?})"
            )
        }
        Launch::Local(gpus) if gpus.len() > 1 => {
            let own: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
            return Ok(Start::Launched(cli::ranks::launch_local(
                &gpus,
                rank_args.master_port,
                rank_args.rank_timeout_secs,
                &own,
                events_json,
            )?));
        }
        Launch::Local(gpus) => Ranks::on_gpu(
            gpus.first().copied(),
            std::time::Duration::from_secs(rank_args.rank_timeout_secs),
        ),
        Launch::Rank(spec) => {
            let rank = spec.rank;
            // A rank waiting on one that is gone would wait forever inside NCCL: end it, saying why (rank 0's
            // last saved checkpoint is on disk; the launcher reports the exit).
            framesmith_nn::collective::on_stuck(Box::new(move |why: &str| {
                eprintln!("error: rank {rank} stops: {why}; it waited past --rank-timeout inside a collective");
                std::process::exit(1);
            }));
            Ranks::Join(spec)
        }
    };
    Ok(Start::Train(ranks))
}

/// The run config at `path` with the presets `names` applied (a key the file sets wins over a preset's, and each
/// preset says so) and `--vram-budget-gb` over both.
fn load_config(
    path: &std::path::Path,
    names: &[String],
    vram_budget_gb: Option<f64>,
) -> anyhow::Result<RunConfig> {
    let (mut cfg, explicit) = RunConfig::load_explicit(path)?;
    let chosen = names
        .iter()
        .map(|name| presets::builtin(name))
        .collect::<Result<Vec<_>, _>>()?;
    for preset in &chosen {
        let name = &preset.name;
        let applied = preset.apply_keeping(&cfg, &explicit)?;
        for change in &applied.changes {
            eprintln!("preset {name}: {change}");
        }
        for kept in &applied.kept {
            eprintln!("preset {name}: {}", kept.kept_line());
        }
        cfg = applied.config;
    }
    let family = framesmith_engine::family::family_of(&cfg).config_family();
    for preset in &chosen {
        preset.check_family(family)?;
    }
    if vram_budget_gb.is_some() {
        cfg.memory.vram_budget_gb = vram_budget_gb;
    }
    Ok(cfg)
}

fn show_presets(action: Option<PresetAction>) -> anyhow::Result<ExitCode> {
    match action {
        None => {
            for preset in presets::builtins()? {
                println!("{:<20} {}", preset.name, preset.summary);
            }
        }
        Some(PresetAction::Show { name }) => {
            let preset = presets::builtin(&name)?;
            println!("{} — {}\n{}\n", preset.name, preset.title, preset.summary);
            for setting in preset.settings() {
                println!("{} = {}  — {}", setting.key, setting.value, setting.why);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Says what any model file is; fails only when it is not a model Framesmith can name.
fn inspect(path: &std::path::Path) -> anyhow::Result<ExitCode> {
    let report = framesmith_models::identify::identify(path)?;
    println!("{report}");
    Ok(ExitCode::SUCCESS)
}

fn dataset_check(path: &std::path::Path, skip_unreadable: bool) -> anyhow::Result<ExitCode> {
    let options = framesmith_data::ScanOptions::locate();
    let report = framesmith_data::check_path(path, &options)?
        .with_unreadable(framesmith_data::Unreadable::skip_if(skip_unreadable));
    print!("{report}");
    Ok(if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn check_parity(dirs: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let (mut passed, mut failed) = (0usize, 0usize);
    for dir in dirs {
        println!("{}", dir.display());
        match framesmith_engine::parity::check_fixture(dir) {
            Ok(rows) => {
                for row in rows {
                    println!("  {row}");
                    if row.passed {
                        passed += 1;
                    } else {
                        failed += 1;
                    }
                }
            }
            Err(err) => {
                println!("  FAIL {err:#}");
                failed += 1;
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
