//! `framesmith train` and its output folder, end to end on the demo: one run per folder at a time (the holder
//! named, a killed holder's lock file blocking nothing), damaged newest states passed over on resume, temporary
//! files of interrupted saves removed, checks that fail before the model loads, advice that works when followed,
//! identical LoRA bytes from identical runs, and a resume that changes the run's length saying what that does.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

use framesmith_config::RunConfig;

mod cli_support;
use cli_support::{read_until, spawn_with_stderr, StderrLines};

fn framesmith() -> Command {
    Command::new(env!("CARGO_BIN_EXE_framesmith"))
}

/// The demo on the CPU writing into `out`: `steps` steps, a LoRA and a training state at every step.
fn demo_config(out: &Path, steps: usize) -> RunConfig {
    let mut config = framesmith_config::presets::builtin("demo-cpu")
        .and_then(|p| p.apply(&RunConfig::default()))
        .unwrap()
        .config;
    config.dataset.synthetic = true;
    config.training.max_train_steps = steps;
    // The preset's 20 warmup steps are more than these short runs have, which validation refuses.
    config.optimizer.lr_warmup_steps = 0;
    config.output.output_dir = out.to_path_buf();
    config.output.save_every_n_steps = Some(1);
    config.output.save_every_n_epochs = Some(0);
    config.output.save_state = true;
    config.sampling = Default::default();
    config
}

fn save_config(config: &RunConfig, path: &Path) -> PathBuf {
    config.save(path).unwrap();
    path.to_path_buf()
}

fn train(config: &Path, extra: &[&Path]) -> Output {
    let mut command = framesmith();
    command.arg("train").arg("--config").arg(config);
    for (i, arg) in extra.iter().enumerate() {
        if i == 0 {
            command.arg("--resume");
        }
        command.arg(arg);
    }
    command.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Starts `framesmith train` and returns it with its stderr lines.
fn spawn_train(config: &Path, resume: Option<&Path>) -> (Child, StderrLines) {
    let mut command = framesmith();
    command.arg("train").arg("--config").arg(config);
    if let Some(resume) = resume {
        command.arg("--resume").arg(resume);
    }
    spawn_with_stderr(command)
}

fn model_loaded(stderr: &str) -> bool {
    stderr.lines().any(|l| l.starts_with("model: "))
}

#[test]
fn a_folder_in_use_is_refused_and_a_killed_runs_leftovers_are_dealt_with() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let config = save_config(&demo_config(&out, 100_000), &dir.path().join("run.toml"));

    let (mut first, mut lines) = spawn_train(&config, None);
    let seen = read_until(&mut lines, |l| {
        l.contains(": saved ") && l.starts_with("step 3")
    });
    assert!(
        seen.last().is_some_and(|l| l.starts_with("step 3")),
        "{seen:#?}"
    );

    // A second run into the same folder, and a resume of the run in progress: refused at once, naming it.
    let holder = format!("(PID {}, started ", first.id());
    for resume in [None, Some(out.as_path())] {
        // Read up to the refusal or the model load (where the run would train on), then end it either way.
        let (mut second, mut second_lines) = spawn_train(&config, resume);
        let seen = read_until(&mut second_lines, |l| {
            l.starts_with("error") || l.starts_with("model: ")
        });
        second.kill().unwrap();
        second.wait().unwrap();
        let text = seen.join("\n");
        assert!(
            seen.last().is_some_and(|l| l.starts_with("error"))
                && text.contains("another run is writing into this output folder")
                && text.contains(&holder)
                && text.contains(&format!("train --config {}", config.display())),
            "{text}"
        );
    }
    assert!(!out.join("run-2").exists(), "the refused run wrote nothing");

    // Killed: the lock file stays, the OS lock goes with the process.
    first.kill().unwrap();
    first.wait().unwrap();
    drop(lines);
    assert!(out.join(".framesmith.lock").exists());
    // What a save cut off by a kill leaves: a full-size hidden temporary file of a process that is gone.
    let temporary = out.join(".demo-lora.safetensors.tmp-4999999");
    std::fs::write(&temporary, vec![0u8; 1 << 20]).unwrap();
    // The newest state cut short (a crash while copying, a full disk): resume passes over it.
    let states = framesmith_config::outputs::states_in(&out, None);
    let (older, newest) = (&states[states.len() - 2], &states[states.len() - 1]);
    let lora = newest.dir.join("lora.safetensors");
    let bytes = std::fs::read(&lora).unwrap();
    std::fs::write(&lora, &bytes[..bytes.len() / 2]).unwrap();

    let (mut resumed, mut lines) = spawn_train(&config, Some(&out));
    let seen = read_until(&mut lines, |l| {
        l.contains("resumed at step") || l.starts_with("error")
    });
    resumed.kill().unwrap();
    resumed.wait().unwrap();
    let text = seen.join("\n");
    assert!(
        seen.last()
            .is_some_and(|l| l.contains(&format!("resumed at step {} from", older.step))),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "warning: skipped a damaged training state (lora.safetensors is cut short ({} of {} bytes)): {}",
            bytes.len() / 2,
            bytes.len(),
            newest.dir.display()
        )),
        "{text}"
    );
    assert!(text.contains("temporary file(s) and folder(s)"), "{text}");
    assert!(!temporary.exists(), "{text}");
}

/// A run that died before its first save left its run files and no state: the next run writes beside it and
/// does not offer `--resume`, which would find nothing to continue.
#[test]
fn a_run_beside_one_that_saved_nothing_offers_no_resume() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut config = demo_config(&out, 2);
    config.output.save_state = false;
    let path = save_config(&config, &dir.path().join("run.toml"));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(&path, out.join("run.toml")).unwrap();
    std::fs::write(out.join("metrics.jsonl"), "").unwrap();

    let run = train(&path, &[]);
    let text = stderr(&run);
    assert!(run.status.success(), "{text}");
    let note = text
        .lines()
        .find(|l| l.contains("already holds"))
        .unwrap_or_else(|| panic!("no note on the earlier run in\n{text}"));
    assert!(note.contains("no training state saved"), "{note}");
    assert!(!note.contains("--resume"), "{note}");
    assert!(out.join("run-2/demo-lora.safetensors").exists());

    // A run that reached its last step is not offered to a run of the same length (nothing is left to train)...
    let mut with_state = demo_config(&out, 2);
    with_state.output.save_state = true;
    let path = save_config(&with_state, &dir.path().join("state.toml"));
    let run = train(&path, &[]);
    assert!(run.status.success(), "{}", stderr(&run));
    let again = train(&path, &[]);
    let text = stderr(&again);
    let note = text.lines().find(|l| l.contains("already holds")).unwrap();
    assert!(!note.contains("--resume"), "{note}");

    // ...but to a longer one, and following the advice continues it.
    with_state.training.max_train_steps = 4;
    let longer = save_config(&with_state, &dir.path().join("longer.toml"));
    let (mut child, mut lines) = spawn_train(&longer, None);
    let seen = read_until(&mut lines, |l| {
        l.contains("already holds") || l.starts_with("error")
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let note = seen.last().unwrap();
    assert!(
        note.ends_with(&format!("start with --resume {})", out.display())),
        "{note}"
    );
    let resumed = train(&longer, &[&out]);
    let text = stderr(&resumed);
    assert!(
        resumed.status.success() && text.contains("resumed at step "),
        "{text}"
    );
}

#[test]
fn an_unwritable_output_folder_fails_before_the_model_loads() {
    let dir = tempfile::tempdir().unwrap();
    // A file where a folder must be made: no permission bits involved, so it holds for root too.
    let file = dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    let out = file.join("out");
    let config = save_config(&demo_config(&out, 2), &dir.path().join("run.toml"));
    let run = train(&config, &[]);
    let text = stderr(&run);
    assert!(!run.status.success(), "{text}");
    // Validation or the pre-load check refuses it, each naming the folder.
    assert!(
        text.contains("cannot create the output folder") || text.contains("cannot be made"),
        "{text}"
    );
    assert!(text.contains(&out.display().to_string()), "{text}");
    assert!(
        !model_loaded(&text),
        "checked only after the model loaded: {text}"
    );
}

#[test]
fn a_nan_in_lora_init_from_is_refused_before_the_model_loads() {
    let dir = tempfile::tempdir().unwrap();
    // A LoRA the demo trained, with one value made NaN.
    let trained = dir.path().join("trained");
    let mut config = demo_config(&trained, 1);
    config.output.save_state = false;
    let path = save_config(&config, &dir.path().join("trained.toml"));
    let run = train(&path, &[]);
    assert!(run.status.success(), "{}", stderr(&run));
    let lora = trained.join("demo-lora.safetensors");
    let tensors = candle_core::safetensors::load(&lora, &candle_core::Device::Cpu).unwrap();
    let key = "lora_unet_blocks_1_ffn_2.lora_up.weight";
    let mut changed = tensors.clone();
    let up = &tensors[key];
    let mut values = up.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    values[1] = f32::NAN;
    changed.insert(
        key.to_string(),
        candle_core::Tensor::from_vec(values, up.dims(), &candle_core::Device::Cpu).unwrap(),
    );
    let init = dir.path().join("nan.safetensors");
    candle_core::safetensors::save(&changed, &init).unwrap();

    let mut config = demo_config(&dir.path().join("out"), 2);
    config.lora.init_from = Some(init.clone());
    let path = save_config(&config, &dir.path().join("run.toml"));
    let run = train(&path, &[]);
    let text = stderr(&run);
    assert!(!run.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "lora.init_from: LoRA tensor `{key}` in the file holds NaN or infinite values: {}",
            init.display()
        )),
        "{text}"
    );
    assert!(
        !model_loaded(&text),
        "refused only after the model loaded: {text}"
    );
}

#[test]
fn two_runs_with_the_same_seed_write_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut loras = Vec::new();
    for name in ["a", "b"] {
        let out = dir.path().join(name);
        let mut config = demo_config(&out, 3);
        config.output.save_state = false;
        let path = save_config(&config, &dir.path().join(format!("{name}.toml")));
        let run = train(&path, &[]);
        assert!(run.status.success(), "{}", stderr(&run));
        loras.push(std::fs::read(out.join("demo-lora.safetensors")).unwrap());
    }
    assert!(loras[0] == loras[1], "the two LoRA files differ");
}

/// Resuming with a longer run stretches the learning-rate schedule over the new length, and says so.
#[test]
fn a_resume_that_changes_the_runs_length_says_what_the_schedule_does() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut config = demo_config(&out, 4);
    config.optimizer.lr_scheduler = framesmith_config::run::LrScheduler::Linear;
    config.optimizer.lr_warmup_steps = 0;
    let path = save_config(&config, &dir.path().join("run.toml"));
    let run = train(&path, &[]);
    assert!(run.status.success(), "{}", stderr(&run));

    config.training.max_train_steps = 8;
    let longer = save_config(&config, &dir.path().join("longer.toml"));
    let run = train(&longer, &[&out]);
    let text = stderr(&run);
    assert!(run.status.success(), "{text}");
    let warning = text
        .lines()
        .find(|l| l.starts_with("warning: the run now ends at step 8 instead of step 4"))
        .unwrap_or_else(|| panic!("no word on the schedule in\n{text}"));
    assert!(
        warning.contains("linear learning-rate schedule is stretched over the new length"),
        "{warning}"
    );
}
