//! The `framesmith` binary end to end on the demo: the loss falls, the LoRA loads back, the sample clip decodes
//! with ffmpeg; and a process killed while writing checkpoints leaves every finished checkpoint loadable.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use candle_core::Device;
use framesmith_engine::demo::project::{DEMO_FRAMES, DEMO_SIZE};
use framesmith_nn::lora_file::LoraFile;

fn framesmith() -> Command {
    Command::new(env!("CARGO_BIN_EXE_framesmith"))
}

fn losses(metrics: &Path) -> Vec<f64> {
    std::fs::read_to_string(metrics)
        .expect("metrics.jsonl")
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON line");
            v["loss"].as_f64().expect("finite loss")
        })
        .collect()
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

#[test]
fn demo_trains_saves_and_samples() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = framesmith()
        .args(["demo", "--steps", "60", "--out"])
        .arg(dir.path())
        .output()
        .expect("framesmith runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The start is accounted for once, at the end of the first step, with the setup among its parts.
    let startup: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("first step done "))
        .collect();
    assert_eq!(startup.len(), 1, "{stderr}");
    assert!(
        startup[0].contains(" s after the start: ") && startup[0].contains("the first step "),
        "{}",
        startup[0]
    );

    let losses = losses(&dir.path().join("output/metrics.jsonl"));
    assert_eq!(losses.len(), 60);
    let (first, last) = (mean(&losses[..10]), mean(&losses[50..]));
    assert!(
        last < 0.85 * first,
        "loss did not fall: first 10 steps {first:.4}, last 10 {last:.4}"
    );

    let lora = LoraFile::load(
        &dir.path().join("output/demo-lora.safetensors"),
        &Device::Cpu,
    )
    .expect("LoRA loads");
    assert_eq!(lora.modules.len(), 2 * 10, "2 blocks × 10 linears");
    assert_eq!(
        lora.metadata.get("ss_steps").map(String::as_str),
        Some("60")
    );

    let clip = dir.path().join("output/samples/000060-00.mp4");
    assert!(clip.exists(), "{stderr}");
    let probe = Command::new("ffprobe")
        .args(["-v", "error", "-count_frames", "-select_streams", "v:0"])
        .args([
            "-show_entries",
            "stream=nb_read_frames,width,height,codec_name",
            "-of",
            "csv=p=0",
        ])
        .arg(&clip)
        .output()
        .expect("ffprobe is installed (apt install ffmpeg)");
    assert_eq!(
        String::from_utf8_lossy(&probe.stdout).trim(),
        format!("h264,{DEMO_SIZE},{DEMO_SIZE},{DEMO_FRAMES}")
    );
    assert!(dir
        .path()
        .join("output/samples/000060-00/frame_0004.png")
        .exists());
    assert!(dir.path().join("dataset/clip_000.mp4").exists());
    assert!(dir.path().join("dataset/clip_000.txt").exists());
}

#[test]
fn killed_during_checkpoints_leaves_them_loadable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("run.toml");
    let output = dir.path().join("out");
    std::fs::write(
        &config,
        format!(
            "[model]\ndemo = true\nbase_dtype = \"f32\"\n[dataset]\nsynthetic = true\n[lora]\nrank = 4\n\
             [training]\ndevice = \"cpu\"\nmax_train_steps = 1000\n[output]\noutput_dir = {:?}\n\
             save_every_n_steps = 1\nsave_every_n_epochs = 0\n",
            output.display().to_string()
        ),
    )
    .expect("config");
    // Kill right after the k-th "saved" line, while the next step and save are under way; whatever was being
    // written then, completed checkpoints must stay loadable.
    for kill_after in [2usize, 5, 9] {
        let mut child = framesmith()
            .args(["train", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("framesmith starts");
        let stderr = child.stderr.take().expect("stderr");
        let saves = BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .filter(|l| l.contains(": saved "))
            .take(kill_after)
            .count();
        child.kill().expect("kill");
        child.wait().expect("wait");
        assert_eq!(saves, kill_after, "the run ended before {kill_after} saves");
    }
    let mut checked = 0;
    for entry in std::fs::read_dir(&output).expect("output folder") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if name.ends_with(".safetensors") {
            LoraFile::load(&path, &Device::Cpu).unwrap_or_else(|e| panic!("{name}: {e}"));
            checked += 1;
        }
    }
    assert!(checked > 0, "no checkpoint was written before the kills");
    // And the newest complete training state resumes.
    let mut resumed = framesmith()
        .args(["train", "--config"])
        .arg(&config)
        .arg("--resume")
        .arg(&output)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("framesmith starts");
    let stderr = resumed.stderr.take().expect("stderr");
    let line = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("resumed at step") || l.starts_with("error"));
    resumed.kill().expect("kill");
    resumed.wait().expect("wait");
    assert!(
        line.as_deref()
            .is_some_and(|l| l.contains("resumed at step")),
        "{line:?}"
    );
}

/// Ctrl-C during `framesmith train`: the run stops, saves the LoRA and the training state at the step it
/// reached, says where and how to go on, and exits with 130; what it wrote loads back.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_saves_and_says_how_to_resume() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut config = framesmith_config::presets::builtin("demo-cpu")
        .and_then(|p| p.apply(&framesmith_config::RunConfig::default()))
        .unwrap()
        .config;
    config.dataset.synthetic = true;
    config.training.max_train_steps = 100_000;
    config.output.output_dir = out.clone();
    config.output.save_every_n_steps = Some(1);
    config.output.save_every_n_epochs = Some(0);
    config.output.save_state = true;
    config.sampling = Default::default();
    let config_path = dir.path().join("run.toml");
    config.save(&config_path).unwrap();

    let mut child = framesmith()
        .arg("train")
        .arg("--config")
        .arg(&config_path)
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // The first step's save means the run is training.
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let saved = line.starts_with("step ") && line.contains("saved");
        seen.push(line);
        if saved {
            break;
        }
    }
    assert!(
        seen.last().is_some_and(|l| l.contains("saved")),
        "{seen:#?}"
    );
    let killed = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let status = child.wait().unwrap();
    let text = rest.join("\n");
    assert_eq!(status.code(), Some(130), "{text}");
    assert!(text.contains("stopping: saving the LoRA"), "{text}");
    let hint = rest
        .iter()
        .find(|l| l.starts_with("to go on later: framesmith train --config"))
        .unwrap_or_else(|| panic!("no resume command in\n{text}"));
    let state = std::path::PathBuf::from(hint.rsplit_once(" --resume ").unwrap().1);

    // The state and the final LoRA are at the same step, and both load.
    let record = framesmith_config::outputs::StateRecord::read(&state).unwrap();
    assert!(record.step >= 1 && record.step < 100_000);
    let lora = LoraFile::load(
        &out.join("demo-lora.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    assert_eq!(lora.metadata["ss_steps"], record.step.to_string());
    LoraFile::load(&state.join("lora.safetensors"), &candle_core::Device::Cpu).unwrap();
    assert!(
        text.contains(&format!("step {}: saved", record.step)),
        "{text}"
    );
}
