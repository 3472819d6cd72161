//! The Monitor tab and the spilling warning, fed a fixed telemetry history: no NVIDIA GPU leaves the rest
//! working, and VRAM full + shared memory growing + slower steps raises the warning where the user looks.

mod app_support;

use app_support::{harness_with, settle, FakeBackend};
use egui_kittest::kittest::Queryable;
use framesmith_app::{AppOptions, TelemetrySource};
use framesmith_config::protocol::{Command, Event, Progress, RunState};
use framesmith_telemetry::{BudgetHold, GpuSample, History, Sample, SharedMemorySample};

const GIB: u64 = 1 << 30;

fn options(history: History) -> (std::sync::Arc<FakeBackend>, AppOptions) {
    let backend = FakeBackend::new();
    let mut options = AppOptions::for_tests(backend.clone());
    options.telemetry = TelemetrySource::Fixed(history);
    (backend, options)
}

#[test]
fn without_an_nvidia_gpu_the_gpu_charts_say_so_and_ram_still_shows() {
    let mut history = History::new(10);
    history.gpu_status = Err("no NVIDIA GPU found (NVML: libnvidia-ml.so: cannot open)".into());
    history.shared_status = Err("shared GPU memory is a Windows (WDDM) counter".into());
    history.push(Sample {
        at_secs: 0.0,
        ram_used_bytes: 3 * GIB,
        ram_total_bytes: 16 * GIB,
        process_resident_bytes: 512 << 20,
        ..Sample::default()
    });
    let (_, options) = options(history);
    let mut h = harness_with(options);
    h.get_by_label("Monitor").click();
    settle(&mut h);
    h.get_by_label("GPU charts are off: no NVIDIA GPU found (NVML: libnvidia-ml.so: cannot open)");
    h.get_by_label("3.0 GiB of 16 GiB used · Framesmith 512 MiB");
    h.get_by_label("Not charted: shared GPU memory is a Windows (WDDM) counter");
    // The rest of the app keeps working.
    h.get_by_label("Config").click();
    settle(&mut h);
    h.get_by_label("Rank");
}

#[test]
fn gpu_readings_are_listed_per_device() {
    let mut history = History::new(10);
    history.gpu_status = Ok(());
    history.push(Sample {
        gpus: vec![GpuSample {
            index: 0,
            name: "NVIDIA GeForce RTX 4090".into(),
            memory_used_bytes: 20 * GIB,
            memory_total_bytes: 24 * GIB,
            process_memory_bytes: Some(18 * GIB),
            utilization_percent: Some(97),
            temperature_celsius: Some(71),
            power_watts: Some(410.0),
            pcie_tx_bytes_per_sec: Some(GIB),
            pcie_rx_bytes_per_sec: Some(12 * GIB),
            budget_hold: None,
        }],
        ..Sample::default()
    });
    let (_, options) = options(history);
    let mut h = harness_with(options);
    h.get_by_label("Monitor").click();
    settle(&mut h);
    h.get_by_label(
        "GPU 0 · NVIDIA GeForce RTX 4090 · 20 GiB of 24 GiB (Framesmith 18 GiB) · 97% busy · 71 °C · 410 W · PCIe out 1.0 GiB/s, in 12 GiB/s",
    );
}

#[test]
fn a_gpu_under_a_budget_reads_as_a_card_of_the_budget() {
    let mut history = History::new(10);
    history.gpu_status = Ok(());
    history.push(Sample {
        gpus: vec![GpuSample {
            index: 0,
            name: "NVIDIA H200".into(),
            memory_used_bytes: 136 * GIB,
            memory_total_bytes: 140 * GIB,
            process_memory_bytes: Some(134 * GIB),
            budget_hold: Some(BudgetHold {
                gpu: 0,
                held_bytes: 116 * GIB,
                budget_bytes: 24 * GIB,
            }),
            ..GpuSample::default()
        }],
        ..Sample::default()
    });
    let (_, options) = options(history);
    let mut h = harness_with(options);
    h.get_by_label("Monitor").click();
    settle(&mut h);
    h.get_by_label(
        "GPU 0 · NVIDIA H200 · 20 GiB of 24 GiB budget (Framesmith 18 GiB) · 116 GiB held back",
    );
    h.get_by_label("Framesmith: 18 GiB");
}

/// VRAM 97% full and shared memory growing by 500 MiB.
fn spilling_history() -> History {
    let mut history = History::new(10);
    history.gpu_status = Ok(());
    history.shared_status = Ok(());
    for (i, shared_mib) in [100u64, 300, 600].into_iter().enumerate() {
        history.push(Sample {
            at_secs: i as f64,
            gpus: vec![GpuSample {
                memory_used_bytes: 97,
                memory_total_bytes: 100,
                ..GpuSample::default()
            }],
            shared: Some(SharedMemorySample {
                adapter_bytes: shared_mib << 20,
                process_bytes: 0,
            }),
            ..Sample::default()
        });
    }
    history
}

const SPILL_WARNING: &str = "The driver is spilling VRAM into shared memory: VRAM 97% full, shared memory +500 MiB, steps 3.1× slower. Stream more blocks or lower the resolution";

/// Starts a run (with `preset` clicked first, if any), then reports steps that slow down threefold. Returns the
/// commands the app sent after `StartRun`.
fn run_that_slows_down(
    h: &mut egui_kittest::Harness<'static, framesmith_app::FramesmithApp>,
    backend: &FakeBackend,
    preset: Option<&str>,
) -> Result<(framesmith_config::protocol::EngineEnd, Vec<Command>), std::sync::mpsc::SendError<Event>>
{
    if let Some(preset) = preset {
        h.get_by_label("Config").click();
        settle(h);
        h.get_by_label(preset).click();
        settle(h);
    }
    h.get_by_label("Train").click();
    settle(h);
    let engine = app_support::start_run(h, backend);
    assert!(
        h.query_by_label("spilling into shared memory").is_none(),
        "steady so far"
    );
    engine
        .events
        .send(Event::StateChanged(RunState::Training))?;
    for (step, step_secs) in [1.0, 1.0, 1.1, 1.0, 1.0, 3.0, 3.2, 3.1]
        .into_iter()
        .enumerate()
    {
        engine.events.send(Event::Progress(Progress {
            step: step + 1,
            total_steps: 100,
            epoch: 1,
            loss: 0.1,
            smoothed_loss: 0.1,
            learning_rate: 1e-4,
            step_secs,
            eta_secs: 100.0,
        }))?;
    }
    settle(h);
    let sent = engine.commands.try_iter().collect();
    Ok((engine, sent))
}

#[test]
fn spilling_raises_a_warning_on_the_train_tab_and_the_monitor() {
    let (backend, options) = options(spilling_history());
    let mut h = harness_with(options);
    let (_engine, sent) = run_that_slows_down(&mut h, &backend, None).unwrap();
    assert!(
        sent.is_empty(),
        "without the guard the run goes on: {sent:?}"
    );
    h.get_by_label(SPILL_WARNING);
    h.get_by_label("spilling into shared memory");
    h.get_by_label("Monitor").click();
    settle(&mut h);
    h.get_by_label(SPILL_WARNING);
    h.get_by_label("Shared GPU memory");
}

#[test]
fn the_shared_memory_guard_pauses_a_spilling_run_once() {
    let (backend, options) = options(spilling_history());
    let mut h = harness_with(options);
    let (engine, sent) = run_that_slows_down(&mut h, &backend, Some(app_support::PRESET)).unwrap();
    assert!(
        matches!(sent.as_slice(), [Command::Pause]),
        "the guard of {} pauses the run: {sent:?}",
        app_support::PRESET
    );
    h.get_by_label(&format!(
        "[warn] Paused by memory.shared_memory_guard. {SPILL_WARNING}. Resume continues anyway (the guard does not pause \
         this run again); or Stop, then stream more blocks (memory.blocks_to_swap = \"auto\" with a lower \
         memory.vram_budget_gb) or lower dataset.resolution."
    ));

    // The engine pauses, the user resumes: still spilling, but the guard has had its say.
    engine
        .events
        .send(Event::StateChanged(RunState::Paused))
        .unwrap();
    settle(&mut h);
    h.get_by_label("Resume").click();
    settle(&mut h);
    assert!(matches!(engine.commands.try_recv(), Ok(Command::Resume)));
    engine
        .events
        .send(Event::StateChanged(RunState::Training))
        .unwrap();
    settle(&mut h);
    let sent: Vec<Command> = engine.commands.try_iter().collect();
    assert!(sent.is_empty(), "paused once only: {sent:?}");
    h.get_by_label(SPILL_WARNING);
}

/// A Windows CPU build on a PC with an old GPU and a nearly full disk: one blocking problem, one warning.
fn system_report() -> framesmith_config::protocol::doctor::SystemReport {
    use framesmith_config::protocol::doctor::*;
    SystemReport {
        facts: SystemFacts {
            build: BuildFacts {
                version: "0.1.0".into(),
                platform: "windows x86_64".into(),
                cuda: false,
                cudnn: false,
                reads_machine: true,
            },
            gpus: GpuScan {
                driver: Some(DriverFacts {
                    version: "581.29".into(),
                    cuda: Some(CudaVersion {
                        major: 13,
                        minor: 0,
                    }),
                }),
                gpus: vec![GpuFacts {
                    index: 0,
                    name: "NVIDIA GeForce RTX 4070".into(),
                    compute_capability: Some(ComputeCapability { major: 8, minor: 9 }),
                    memory_total_bytes: 12 * GIB,
                    memory_free_bytes: 11 * GIB,
                    driver_model: Some(DriverModel::Wddm),
                }],
                error: None,
            },
            cuda: None,
            memory: MemoryFacts {
                ram_total_bytes: Some(64 * GIB),
                ram_available_bytes: Some(40 * GIB),
                page_locked: PageLockedLimit::HalfOfRam(32 * GIB),
            },
            media: MediaFacts {
                ffmpeg: None,
                ffprobe: None,
                media_foundation: true,
            },
            disk: DiskFacts {
                folder: "C:\\Users\\me\\Documents\\Framesmith\\output".into(),
                mount_point: Some("C:\\".into()),
                free_bytes: Some(300 << 20),
                total_bytes: Some(500 * GIB),
                error: None,
            },
        },
        findings: vec![
            Finding {
                severity: Severity::Blocking,
                problem: "Only 300.0 MiB free for the output folder".into(),
                fix: "free disk space".into(),
            },
            Finding {
                severity: Severity::Warning,
                problem: "This build has no CUDA: training runs on the CPU".into(),
                fix: "install the GPU build, Framesmith-Setup-0.1.0-cuda.exe".into(),
            },
        ],
    }
}

#[test]
fn the_system_check_runs_when_the_monitor_is_shown_and_lists_each_problem_with_its_fix() {
    let backend = app_support::FakeBackend::with_system_report(system_report());
    let mut options = AppOptions::for_tests(backend.clone());
    options.telemetry = TelemetrySource::Off;
    let mut h = harness_with(options);
    settle(&mut h);
    assert_eq!(backend.system_checks(), 0, "not before the tab is shown");
    h.get_by_label("Monitor").click();
    settle(&mut h);
    assert_eq!(backend.system_checks(), 1);
    assert_eq!(
        backend.checked_folder.lock().unwrap().as_deref(),
        Some(h.state().config().output.output_dir.as_path()),
        "the disk checked is the output folder's"
    );
    // A blocking problem opens the section.
    h.get_by_label_contains("System check · 1 problem blocks training (1 warning)");
    h.get_by_label("Blocks training: Only 300.0 MiB free for the output folder");
    h.get_by_label("Fix: free disk space");
    h.get_by_label("Warning: This build has no CUDA: training runs on the CPU");
    h.get_by_label("Fix: install the GPU build, Framesmith-Setup-0.1.0-cuda.exe");
    // The facts, in the command line's words.
    h.get_by_label("GPU support: no CUDA: this build trains on the CPU only");
    h.get_by_label_contains("GPU 0 · NVIDIA GeForce RTX 4070 · compute capability 8.9");
    h.get_by_label_contains("Sysmem fallback: cannot be read here");
    h.get_by_label_contains("Windows allows about half of RAM");
    h.get_by_label("ffmpeg: not found (Windows Media Foundation reads the videos)");
    assert!(h.state().system_report().is_some());

    h.get_by_label("Check again").click();
    settle(&mut h);
    assert_eq!(backend.system_checks(), 2);
    settle(&mut h);
    assert_eq!(backend.system_checks(), 2, "once per click");
}

#[test]
fn a_backend_without_a_system_check_says_so() {
    let (backend, options) = options(History::new(1));
    let mut h = harness_with(options);
    h.get_by_label("Monitor").click();
    settle(&mut h);
    assert_eq!(backend.system_checks(), 1);
    h.get_by_label_contains("System check · not available")
        .click();
    settle(&mut h);
    h.get_by_label("No system check: the system check is not connected");
}
