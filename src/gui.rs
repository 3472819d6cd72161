//! The GUI's `Backend`: connects the app (which never sees tensors) to the model inspector, the dataset checker,
//! the presets, validation, the system check and the engine thread; `main.rs` starts the app with it and the app's
//! integration tests (`tests/app_wiring.rs`, `tests/app_fit.rs`) drive the real modules through it.
//!
//! A run on several GPUs is not trained in the app: the app starts `framesmith train --gpus … --events-json`, the
//! launcher the command line uses (one process per GPU, every rank stopped when one dies), and shows rank 0's
//! events, which that process writes as JSON lines; the app's commands go to rank 0 the same way. So a lost rank
//! ends those processes, never the app, and NCCL is never loaded into the app.

mod lora;

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use framesmith_app::{
    Backend, DatasetSummary, FieldIssue, GenerateSettings, GenerateUpdate, GeneratedClip,
    ModelRole, PresetView, Severity,
};
use framesmith_config::protocol::doctor::SystemReport;
use framesmith_config::protocol::memory::PlanReport;
use framesmith_config::protocol::{
    channel_pair, wire, Command, EngineEnd, EngineHandle, Event, LogLevel, RunState, StartRun,
};
use framesmith_config::{presets, validate_for, HostInfo, RunConfig};
use framesmith_data::config::DatasetKind;
use framesmith_data::{check_path, DatasetReport, ScanOptions};
use framesmith_engine::generate::prompts::read_prompt_file;

/// Where the GUI's demo project writes its outputs.
pub const DEMO_DIR: &str = "framesmith-demo";
/// How often the GUI's demo project samples (it also samples before the first step).
const DEMO_SAMPLE_EVERY_N_STEPS: usize = 100;

/// Writes the start frames of the generated demo clips and the sample prompt file into `dir`; returns the file.
fn write_demo_samples(dir: &Path, seed: u64) -> anyhow::Result<PathBuf> {
    use framesmith_engine::demo::project::{
        write_sample_prompts, DEMO_CLIPS, DEMO_FRAMES, DEMO_SIZE,
    };
    let clips = framesmith_engine::demo::shapes::generate(DEMO_CLIPS, DEMO_FRAMES, DEMO_SIZE, seed);
    write_sample_prompts(dir, &clips)
}

/// The real modules behind the app.
pub struct EngineBackend {
    presets: Vec<presets::Preset>,
}

impl EngineBackend {
    /// Loads the built-in presets once.
    pub fn new() -> anyhow::Result<Self> {
        Ok(Self {
            presets: presets::builtins()?,
        })
    }
}

/// What the app's model picker shows for a file: what `framesmith inspect` says of it (which family's DiT, VAE or
/// autoencoder, or text encoder it is). A DiT it cannot name is an error; a VAE or text encoder it cannot name (e.g. an
/// official `.pth`) gets its size, checked when the run loads it.
fn describe_model(role: ModelRole, path: &Path) -> Result<String, String> {
    match (framesmith_models::identify::identify(path), role) {
        (Ok(report), _) => Ok(report.to_string()),
        (Err(err), ModelRole::Dit) => Err(format!("{err:#}")),
        (Err(_), ModelRole::Vae | ModelRole::TextEncoder) => std::fs::metadata(path)
            .map(|meta| {
                format!(
                    "{} (checked when the run loads it)",
                    framesmith_app::format_bytes(meta.len())
                )
            })
            .map_err(|err| format!("cannot read the file: {err}: {}", path.display())),
    }
}

impl Backend for EngineBackend {
    fn inspect_model(&self, role: ModelRole, path: &Path) -> Result<String, String> {
        describe_model(role, path)
    }

    fn scan_dataset(&self, folders: &[PathBuf]) -> Result<DatasetSummary, String> {
        let options = ScanOptions::locate();
        let mut summary = DatasetSummary {
            folders: folders.to_vec(),
            thumbnails: framesmith_app::thumbnails(folders, framesmith_app::THUMBNAILS),
            ..DatasetSummary::default()
        };
        for folder in folders {
            let report = check_path(folder, &options).map_err(|err| format!("{err:#}"))?;
            add_report(&mut summary, folder, &report);
        }
        Ok(summary)
    }

    fn presets(&self) -> Vec<PresetView> {
        self.presets
            .iter()
            .map(|preset| PresetView {
                name: preset.name.clone(),
                summary: preset.summary.clone(),
                reasons: preset
                    .settings()
                    .into_iter()
                    .map(|s| (s.key, s.why))
                    .collect(),
            })
            .collect()
    }

    fn apply_preset(&self, name: &str, config: &RunConfig) -> Result<RunConfig, String> {
        let preset = self
            .presets
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| format!("no preset named {name}"))?;
        preset
            .apply(config)
            .map(|applied| applied.config)
            .map_err(|err| format!("{err:#}"))
    }

    fn validate(&self, config: &RunConfig) -> Vec<FieldIssue> {
        // Validation runs on a job thread; counting CUDA devices (and reading model.dit's header for the family)
        // there never stalls the UI.
        let host = HostInfo::new(framesmith_nn::device::usable_count());
        let family = framesmith_engine::family::family_of(config).config_family();
        match validate_for(config, &host, family) {
            Ok(_) => Vec::new(),
            Err(errors) => errors
                .problems
                .into_iter()
                .map(|p| FieldIssue {
                    key: p.key,
                    message: format!("{}; {}", p.message, p.fix),
                    severity: Severity::Error,
                })
                .collect(),
        }
    }

    fn plan_memory(
        &self,
        config: &RunConfig,
        dataset_toml: Option<&str>,
    ) -> Result<PlanReport, String> {
        framesmith_engine::plan::plan_config(config, dataset_toml).map_err(|err| format!("{err:#}"))
    }

    fn system_check(&self, output_dir: &Path) -> Result<SystemReport, String> {
        Ok(framesmith_engine::doctor::check(output_dir))
    }

    fn lora_tool(
        &self,
        task: &framesmith_app::LoraTask,
    ) -> Result<framesmith_app::LoraReport, String> {
        lora::lora_tool(task)
    }

    fn demo_project(&self) -> RunConfig {
        // demo-cpu over the defaults trains on generated data: nothing to download first.
        let mut config = self
            .apply_preset("demo-cpu", &RunConfig::default())
            .unwrap_or_default();
        let dir = std::path::absolute(DEMO_DIR).unwrap_or_else(|_| PathBuf::from(DEMO_DIR));
        config.output.output_dir = dir.join("output");
        // Samples need the start frames of the generated clips on disk (a few KiB): without them the project
        // still trains, with no samples.
        match write_demo_samples(&dir, config.training.seed) {
            Ok(prompts) => {
                config.sampling.prompts = Some(prompts);
                config.sampling.sample_every_n_steps = Some(DEMO_SAMPLE_EVERY_N_STEPS);
                config.sampling.sample_at_first = true;
            }
            Err(err) => eprintln!("the demo project makes no samples: {err:#}"),
        }
        config
    }

    fn generate_defaults(&self, config: &RunConfig) -> GenerateSettings {
        let mut settings = framesmith_app::default_generate_settings(config);
        let prompts = config.sampling.prompts.as_deref();
        let first = prompts
            .and_then(|path| read_prompt_file(path).ok())
            .and_then(|specs| specs.into_iter().next());
        if let Some(first) = first {
            settings.frames = first.clip_frames();
            (settings.prompt, settings.image) = (first.prompt, first.image);
            (settings.width, settings.height) = (first.width, first.height);
            (settings.steps, settings.seed) = (first.steps, first.seed);
        }
        settings
    }

    fn generate(
        &self,
        config: &RunConfig,
        settings: &GenerateSettings,
        updates: &mut dyn FnMut(GenerateUpdate),
        cancelled: &dyn Fn() -> bool,
    ) -> Result<GeneratedClip, String> {
        use framesmith_engine::generate::request::{GenerationEvent, LoraChoice};
        let mut request = framesmith_engine::generate::run::request_for_run(config, &settings.out);
        request.prompt.clone_from(&settings.prompt);
        request.loras = vec![LoraChoice {
            path: settings.lora.clone(),
            strength: settings.strength,
        }];
        request.image.clone_from(&settings.image);
        (request.seed, request.steps) = (Some(settings.seed), Some(settings.steps));
        (request.width, request.height) = (Some(settings.width), Some(settings.height));
        if request.frames.is_some() {
            request.frames = Some(settings.frames);
        }
        let mut events = |event| {
            updates(match event {
                GenerationEvent::StepStarted { step, steps } => {
                    GenerateUpdate::Step { step, steps }
                }
                GenerationEvent::Log(line) => GenerateUpdate::Log(line),
            })
        };
        let output = framesmith_engine::generate::run(&request, &mut events, cancelled)
            .map_err(|err| format!("{err:#}"))?;
        Ok(GeneratedClip {
            frames: output.frames_dir.unwrap_or_else(|| output.file.clone()),
            file: output.file,
        })
    }

    fn spawn_engine(&self, gpus: &[usize]) -> Result<EngineHandle, String> {
        use framesmith_engine::train::{engine, ranks};
        let spawned = match gpus {
            [] => engine::spawn(),
            [gpu] => engine::spawn_ranked(ranks::Ranks::on_gpu(
                Some(*gpu),
                Duration::from_secs(ranks::DEFAULT_TIMEOUT_SECS),
            )),
            several => return spawn_ranks(several.to_vec()),
        };
        spawned.map_err(|err| format!("cannot start the engine thread: {err}"))
    }
}

/// How often the thread of a run over several GPUs looks whether its processes have ended.
const RANKS_POLL: Duration = Duration::from_millis(200);

/// The engine of runs over `gpus` (several): each run is a `framesmith train --gpus` process (see the module
/// comment); a thread of the app speaks the protocol for it.
fn spawn_ranks(gpus: Vec<usize>) -> Result<EngineHandle, String> {
    let (handle, end) = channel_pair();
    std::thread::Builder::new()
        .name("framesmith-ranks".into())
        .spawn(move || ranks_main(&end, &gpus))
        .map_err(|err| format!("cannot start the thread that runs the GPUs' processes: {err}"))?;
    Ok(handle)
}

fn ranks_main(end: &EngineEnd, gpus: &[usize]) {
    while let Ok(command) = end.commands.recv() {
        match command {
            Command::StartRun(start) => {
                if let Err(message) = run_ranks(&start, gpus, end) {
                    let _ = end.events.send(Event::StateChanged(RunState::Failed));
                    let _ = end.events.send(Event::Failed { message });
                }
            }
            other => {
                let _ = end.events.send(Event::Log {
                    level: LogLevel::Warn,
                    message: format!("no run in progress: {other:?} ignored"),
                });
            }
        }
        let _ = end.events.send(Event::StateChanged(RunState::Idle));
    }
}

/// The command line of the launcher of a run over `gpus`, its config in `config`.
fn launcher_arguments(config: &Path, resume_from: Option<&Path>, gpus: &[usize]) -> Vec<OsString> {
    let list = gpus
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut args: Vec<OsString> = vec![
        "train".into(),
        "--config".into(),
        config.into(),
        "--gpus".into(),
        list.into(),
        "--events-json".into(),
    ];
    if let Some(state) = resume_from {
        args.extend(["--resume".into(), state.into()]);
    }
    args
}

/// Runs `start` over `gpus` in a launcher process and relays its events until it ends. `Err` when it could not
/// start, or ended without saying how the run ended.
fn run_ranks(start: &StartRun, gpus: &[usize], end: &EngineEnd) -> Result<(), String> {
    let _ = end.events.send(Event::StateChanged(RunState::Preparing));
    let config = &start.config;
    let path = config
        .output
        .output_dir
        .join(format!("{}_gpus.toml", config.output.output_name));
    let dir = &config.output.output_dir;
    std::fs::create_dir_all(dir)
        .map_err(|err| format!("cannot create the output folder: {err}: {}", dir.display()))?;
    config.save(&path).map_err(|err| format!("{err:#}"))?;
    let exe = std::env::current_exe().map_err(|err| {
        format!("cannot find the framesmith program to start the GPUs' processes ({err})")
    })?;
    let mut child = std::process::Command::new(exe)
        .args(launcher_arguments(
            &path,
            start.resume_from.as_deref(),
            gpus,
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| format!("cannot start the processes for GPUs {gpus:?}: {err}"))?;
    let ended = Arc::new(AtomicBool::new(false));
    let readers = [
        child.stdout.take().map(|out| {
            let (events, ended) = (end.events.clone(), ended.clone());
            std::thread::spawn(move || relay_events(out, &events, &ended))
        }),
        child.stderr.take().map(|err| {
            let events = end.events.clone();
            std::thread::spawn(move || relay_lines(err, &events))
        }),
    ];
    let status = relay_commands(&mut child, end);
    for reader in readers.into_iter().flatten() {
        let _ = reader.join();
    }
    match status {
        _ if ended.load(Ordering::SeqCst) => Ok(()),
        Ok(status) => Err(format!(
            "the GPUs' processes ended ({status}) without finishing the run; the log above says why"
        )),
        Err(err) => Err(format!("lost the GPUs' processes: {err}")),
    }
}

/// Writes the app's commands to rank 0 until the launcher ends. The app going away closes rank 0's stdin, which
/// stops the run and saves (as Ctrl-C does).
fn relay_commands(child: &mut Child, end: &EngineEnd) -> std::io::Result<std::process::ExitStatus> {
    let mut stdin: Option<ChildStdin> = child.stdin.take();
    loop {
        match end.commands.recv_timeout(RANKS_POLL) {
            Ok(Command::StartRun(_)) => {
                let _ = end.events.send(Event::Log {
                    level: LogLevel::Warn,
                    message: "a run is already in progress; queue the next one".into(),
                });
            }
            Ok(command) => {
                if let (Some(pipe), Ok(line)) = (stdin.as_mut(), wire::command_line(&command)) {
                    let _ = writeln!(pipe, "{line}").and_then(|()| pipe.flush());
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                drop(stdin.take());
                return child.wait();
            }
        }
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
    }
}

/// Rank 0's events (JSON lines on the launcher's stdout) to the app; `ended` is set once one says how the run
/// ended.
fn relay_events(out: impl std::io::Read, events: &SyncSender<Event>, ended: &AtomicBool) {
    for line in BufReader::new(out).lines().map_while(Result::ok) {
        // A line that is no event (a library writing to stdout) is shown as it is.
        let event = match wire::parse_event(&line) {
            Ok(event) => event,
            Err(_) => Event::Log {
                level: LogLevel::Info,
                message: line,
            },
        };
        if matches!(
            event,
            Event::Failed { .. }
                | Event::StateChanged(RunState::Finished | RunState::Stopped | RunState::Failed)
        ) {
            ended.store(true, Ordering::SeqCst);
        }
        // As the engine does: progress is dropped when the app is behind, nothing else is.
        match events.try_send(event) {
            Ok(()) | Err(TrySendError::Full(Event::Progress(_))) => {}
            Err(TrySendError::Full(event)) => {
                let _ = events.send(event);
            }
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}

/// The launcher's own lines (a rank's error, "training on GPUs …") to the app's log.
fn relay_lines(err: impl std::io::Read, events: &SyncSender<Event>) {
    for line in BufReader::new(err).lines().map_while(Result::ok) {
        let line = line.trim_start_matches('\r').to_owned();
        if line.trim().is_empty() {
            continue;
        }
        // "[rank 1, GPU 1] error: …" is a rank's own line.
        let body = line
            .split_once("] ")
            .map_or(line.as_str(), |(_, body)| body);
        let level = if body.starts_with("error") {
            LogLevel::Error
        } else if body.starts_with("warning") {
            LogLevel::Warn
        } else {
            LogLevel::Info
        };
        if events
            .send(Event::Log {
                level,
                message: line,
            })
            .is_err()
        {
            return;
        }
    }
}

/// Folds one folder's dataset report into the app's summary.
fn add_report(summary: &mut DatasetSummary, folder: &Path, report: &DatasetReport) {
    for dataset in &report.datasets {
        match dataset.kind {
            DatasetKind::Image => summary.images += dataset.media_found,
            DatasetKind::Video => {
                summary.videos += dataset.media_found;
                summary.video_folders.push(folder.to_path_buf());
            }
        }
        summary.captions += dataset.captions;
        summary
            .missing_captions
            .extend(dataset.missing_captions.iter().cloned());
        summary.unreadable.extend(
            dataset
                .unreadable
                .iter()
                .map(|p| (p.clone(), "cannot be read".to_owned())),
        );
        for (&size, &count) in &dataset.sizes {
            *summary.resolutions.entry(size).or_insert(0) += count;
        }
        if let Some(spread) = dataset.frame_counts {
            let (min, max) = summary
                .frame_range
                .map_or((spread.min, spread.max), |(a, b)| {
                    (a.min(spread.min), b.max(spread.max))
                });
            summary.frame_range = Some((min, max));
        }
    }
    summary
        .problems
        .extend(report.problems.iter().map(ToString::to_string));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chosen_gpus_become_the_launchers_gpus_and_world_size() {
        let args = launcher_arguments(
            Path::new("/out/cat_gpus.toml"),
            Some(Path::new("/out/state")),
            &[0, 1, 2, 3],
        );
        let text: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            text.join(" "),
            "train --config /out/cat_gpus.toml --gpus 0,1,2,3 --events-json --resume /out/state"
        );
        let gpus: Vec<usize> = text[4].split(',').map(|g| g.parse().unwrap()).collect();
        let options = framesmith_engine::train::launch::RankOptions {
            gpus,
            ..Default::default()
        };
        let launch = framesmith_engine::train::launch::resolve(&options, |_| None).unwrap();
        assert_eq!(
            launch,
            framesmith_engine::train::launch::Launch::Local(vec![0, 1, 2, 3])
        );
        // Rank 1's own command line: world size 4, on GPU 1, rank 0's events and commands as JSON.
        let rank1 =
            framesmith_engine::train::launch::rank_arguments(&args, 1, &[0, 1, 2, 3], 9, 60);
        let rank1: Vec<String> = rank1
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let rank1 = rank1.join(" ");
        assert!(
            rank1.contains("--rank 1 --world-size 4 --gpus 1"),
            "{rank1}"
        );
        assert!(rank1.contains("--events-json"), "{rank1}");
    }

    #[test]
    fn rank_zeros_lines_become_events_and_the_launchers_become_log_lines() {
        let (tx, rx) = std::sync::mpsc::sync_channel(16);
        let ended = AtomicBool::new(false);
        let progress = wire::event_line(&Event::StateChanged(RunState::Training)).unwrap();
        let stopped = wire::event_line(&Event::StateChanged(RunState::Stopped)).unwrap();
        let out = format!("{progress}\nnot json\n{stopped}\n");
        relay_events(out.as_bytes(), &tx, &ended);
        assert!(ended.load(Ordering::SeqCst));
        relay_lines(
            "training on GPUs 0, 1 (2 ranks)\n[rank 1, GPU 1] error: out of memory\n\nwarning: slow\n".as_bytes(),
            &tx,
        );
        drop(tx);
        let got: Vec<Event> = rx.iter().collect();
        let log = |level, message: &str| Event::Log {
            level,
            message: message.into(),
        };
        assert_eq!(
            got,
            vec![
                Event::StateChanged(RunState::Training),
                log(LogLevel::Info, "not json"),
                Event::StateChanged(RunState::Stopped),
                log(LogLevel::Info, "training on GPUs 0, 1 (2 ranks)"),
                log(LogLevel::Error, "[rank 1, GPU 1] error: out of memory"),
                log(LogLevel::Warn, "warning: slow"),
            ]
        );
    }

    fn flux_fixture(case: &str) -> PathBuf {
        framesmith_models::fixtures::case_dir("flux", case).join("weights.safetensors")
    }

    #[test]
    fn the_model_picker_names_flux_files_and_refuses_what_is_no_dit() {
        let dit = describe_model(ModelRole::Dit, &flux_fixture("flux_dit"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(dit.contains("FLUX.1"), "{dit}");
        let ae = describe_model(ModelRole::Vae, &flux_fixture("flux_ae"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            ae.contains("FLUX.1") && !ae.contains("checked when"),
            "{ae}"
        );
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let junk = dir.path().join("notes.safetensors");
        std::fs::write(&junk, b"not a model").unwrap_or_else(|e| panic!("{e}"));
        assert!(describe_model(ModelRole::Dit, &junk).is_err());
        let vae = describe_model(ModelRole::Vae, &junk).unwrap_or_else(|e| panic!("{e}"));
        assert!(vae.contains("checked when the run loads it"), "{vae}");
        assert!(describe_model(ModelRole::Vae, &dir.path().join("missing.pth")).is_err());
    }
}
