//! Hostile paths given to the command line: `/dev/zero`, a FIFO, a 3 GiB sparse file and a damaged all-zero TOML
//! as a run config, a dataset config, a model file or a dataset's `dataset.config` are each refused at once,
//! naming the file and what is wrong (the limit, or what the path is), never read to the end or waited on.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cli_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use cli_support::{framesmith_within, s};

/// Long enough for a loaded test machine to start the binary; a read of /dev/zero or a blocked open never ends.
const HANG: Duration = Duration::from_secs(60);

/// Runs `framesmith` and returns (exit code, stdout + stderr), failing the test if it had to be killed.
fn run(args: &[&str]) -> (Option<i32>, String) {
    let (code, stdout, stderr) = framesmith_within(args, HANG)
        .unwrap_or_else(|| panic!("framesmith {args:?} hung and was killed"));
    (code, format!("{stdout}{stderr}"))
}

fn fifo(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
    path
}

fn sparse(dir: &Path, name: &str, bytes: u64) -> PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    path
}

#[test]
fn dev_zero_a_fifo_and_a_huge_sparse_file_are_refused_as_configs() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = fifo(dir.path(), "run.toml");
    let huge = sparse(dir.path(), "huge.toml", 3 << 30);
    let cases: [(&str, &str); 3] = [
        ("/dev/zero", "this is a character device, not a file"),
        (s(&pipe), "this is a FIFO (named pipe), not a file"),
        (
            s(&huge),
            "the file is 3 GiB, over the 16 MiB limit for a TOML file",
        ),
    ];
    for (path, why) in cases {
        for args in [
            ["train", "--config", path].as_slice(),
            &["plan", "--config", path],
            &["dataset", "check", path],
        ] {
            let (code, text) = run(args);
            assert_eq!(code, Some(1), "{args:?}: {text}");
            assert!(
                text.contains(why) && text.contains(path),
                "{args:?}: {text}"
            );
        }
    }
}

#[test]
fn a_damaged_all_zero_toml_gets_a_short_error() {
    let dir = tempfile::tempdir().unwrap();
    // Under the limit, so it is parsed: the error must not quote its endless line.
    let zeros = dir.path().join("zeros.toml");
    std::fs::write(&zeros, vec![0u8; 4 << 20]).unwrap();
    for args in [
        ["plan", "--config", s(&zeros)].as_slice(),
        &["dataset", "check", s(&zeros)],
    ] {
        let (code, text) = run(args);
        assert_eq!(code, Some(1), "{args:?}: {}", &text[..text.len().min(2000)]);
        assert!(
            text.len() < 2000 && text.contains(s(&zeros)),
            "{args:?}: {} bytes: {}",
            text.len(),
            &text[..text.len().min(2000)]
        );
    }
}

#[test]
fn a_fifo_or_device_as_the_dataset_config_of_a_run_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = fifo(dir.path(), "dataset.toml");
    for (dataset, why) in [
        (
            s(&pipe),
            "dataset config is a FIFO (named pipe), not a file",
        ),
        (
            "/dev/zero",
            "dataset config is a character device, not a file",
        ),
    ] {
        let config = dir.path().join("run.toml");
        std::fs::write(&config, format!("[dataset]\nconfig = \"{dataset}\"\n")).unwrap();
        let (code, text) = run(&["train", "--config", s(&config)]);
        assert_eq!(code, Some(1), "{text}");
        assert!(text.contains(why), "{text}");
    }
}

#[test]
fn inspect_refuses_a_fifo_and_a_device_without_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = fifo(dir.path(), "model.safetensors");
    for (path, why) in [
        (s(&pipe), "this is a FIFO (named pipe), not a model file"),
        ("/dev/zero", "this is a character device, not a model file"),
    ] {
        let (code, text) = run(&["inspect", path]);
        assert_eq!(code, Some(1), "{text}");
        assert!(text.contains(why) && text.contains(path), "{text}");
    }
}
