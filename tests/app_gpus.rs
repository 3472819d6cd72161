//! The Train tab's GPU picker and the Monitor's GPUs, fed a fixed telemetry history: no GPU, one, four with one
//! busy; the choice becomes the GPUs the engine is started for (several: one process per GPU), and the Monitor
//! charts every GPU with the run's memory summed over its processes.

mod app_support;

use std::sync::Arc;

use app_support::{harness_with, settle, start_run as start, FakeBackend};
use egui_kittest::kittest::Queryable;
use egui_kittest::Harness;
use framesmith_app::{AppOptions, FramesmithApp, TelemetrySource};
use framesmith_config::protocol::{Event, RunState};
use framesmith_telemetry::{GpuSample, History, Sample};

const GIB: u64 = 1 << 30;

/// `count` H100s; `busy` has 30 GiB held by another program, `ours` 20 GiB of the run's.
fn history(count: u32, busy: Option<u32>, ours: &[u32]) -> History {
    let mut history = History::new(4);
    history.gpu_status = Ok(());
    let gpus = (0..count)
        .map(|index| {
            let mine = ours.contains(&index).then_some(20 * GIB);
            let others = if busy == Some(index) {
                30 * GIB
            } else {
                GIB / 4
            };
            GpuSample {
                index,
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_used_bytes: others + mine.unwrap_or(0),
                memory_total_bytes: 80 * GIB,
                process_memory_bytes: mine,
                ..GpuSample::default()
            }
        })
        .collect();
    history.push(Sample {
        ram_total_bytes: 64 * GIB,
        gpus,
        ..Sample::default()
    });
    history
}

fn harness(history: History) -> (Arc<FakeBackend>, Harness<'static, FramesmithApp>) {
    let backend = FakeBackend::new();
    let mut options = AppOptions::for_tests(backend.clone());
    options.telemetry = TelemetrySource::Fixed(history);
    let h = harness_with(options);
    (backend, h)
}

fn line(index: u32, others: &str) -> String {
    format!("GPU {index} · NVIDIA H100 80GB HBM3 · 80 GiB · {others} used by other processes")
}

#[test]
fn without_a_gpu_the_picker_says_so_and_the_run_trains_as_today() {
    let mut history = History::new(4);
    history.gpu_status = Err("no NVIDIA GPU found (NVML: libnvidia-ml.so: cannot open)".into());
    history.push(Sample::default());
    let (backend, mut h) = harness(history);
    settle(&mut h);
    h.get_by_label("no NVIDIA GPU found (NVML: libnvidia-ml.so: cannot open)");
    h.get_by_label("No NVIDIA GPU found: the run trains on the CPU, as its config says");
    let _engine = start(&mut h, &backend);
    assert_eq!(backend.engine_gpus(), vec![Vec::<usize>::new()]);
}

#[test]
fn one_gpu_chosen_trains_on_that_gpu() {
    let (backend, mut h) = harness(history(1, None, &[]));
    settle(&mut h);
    h.get_by_label("No GPU chosen: the run trains on the config's training.device");
    h.get_by_label(&line(0, "256 MiB")).click();
    settle(&mut h);
    h.get_by_label("Trains on GPU 0");
    let _engine = start(&mut h, &backend);
    assert_eq!(backend.engine_gpus(), vec![vec![0]]);
}

#[test]
fn four_gpus_make_a_run_of_four_processes_and_a_busy_one_is_marked() {
    let (backend, mut h) = harness(history(4, Some(2), &[]));
    settle(&mut h);
    h.get_by_label(&format!("{} (busy)", line(2, "30 GiB")));
    assert!(h
        .query_by_label(&format!("{} (busy)", line(1, "256 MiB")))
        .is_none());
    for index in [3, 0, 1, 2] {
        let busy = if index == 2 { " (busy)" } else { "" };
        let others = if index == 2 { "30 GiB" } else { "256 MiB" };
        h.get_by_label(&format!("{}{busy}", line(index, others)))
            .click();
        settle(&mut h);
    }
    h.get_by_label(
        "Trains on GPUs 0, 1, 2, 3: one process per GPU, world size 4 (as framesmith train --gpus 0,1,2,3)",
    );
    let engine = start(&mut h, &backend);
    assert_eq!(backend.engine_gpus(), vec![vec![0, 1, 2, 3]]);

    // The run ends; the next one on GPU 1 alone gets an engine of its own (the four-GPU one is dropped).
    engine
        .events
        .send(Event::StateChanged(RunState::Finished))
        .unwrap();
    settle(&mut h);
    for index in [0, 2, 3] {
        let busy = if index == 2 { " (busy)" } else { "" };
        let others = if index == 2 { "30 GiB" } else { "256 MiB" };
        h.get_by_label(&format!("{}{busy}", line(index, others)))
            .click();
        settle(&mut h);
    }
    h.get_by_label("Trains on GPU 1");
    let _second = start(&mut h, &backend);
    assert_eq!(backend.engine_gpus(), vec![vec![0, 1, 2, 3], vec![1]]);
}

#[test]
fn the_monitor_charts_every_gpu_and_the_runs_memory_over_its_processes() {
    let (backend, mut h) = harness(history(2, None, &[0, 1]));
    settle(&mut h);
    let engine = start(&mut h, &backend);
    h.get_by_label("Monitor").click();
    settle(&mut h);
    for index in 0..2 {
        h.get_by_label(&format!(
            "GPU {index} · NVIDIA H100 80GB HBM3 · 20 GiB of 80 GiB (Framesmith 20 GiB)"
        ));
        h.get_by_label(&format!("VRAM of GPU {index}"));
    }
    h.get_by_label("Framesmith on all GPUs: 40 GiB");
    // The launcher names the rank processes: they count as the run's from then on.
    engine
        .events
        .send(Event::ProcessesStarted {
            pids: vec![4_000_001, 4_000_002],
        })
        .unwrap();
    settle(&mut h);
    h.get_by_label("Framesmith on all GPUs: 40 GiB (3 processes)");
}
