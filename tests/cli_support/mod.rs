//! What the command-line tests share: running the built binary, the fixture weights, a tiny tokenizer.
// Each test binary uses its own subset of these.
#![allow(dead_code, clippy::expect_used)]

use std::io::{BufRead, BufReader, Lines};
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Stdio};

use tokenizers::models::unigram::Unigram;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::Tokenizer;

/// Runs `framesmith` with `args`: (success, stdout, stderr).
pub fn framesmith(args: &[&str]) -> (bool, String, String) {
    let (code, stdout, stderr) = framesmith_status(args);
    (code == Some(0), stdout, stderr)
}

/// Runs `framesmith` with `args`: (exit code, stdout, stderr).
pub fn framesmith_status(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_framesmith"))
        .args(args)
        .output()
        .expect("framesmith runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A Wan fixture's weights (`framesmith_models::fixtures` finds the shared folder).
pub fn fixture(case: &str) -> String {
    framesmith_models::fixtures::wan_case(case)
        .join("weights.safetensors")
        .display()
        .to_string()
}

/// A Unigram tokenizer over the letters and `words` (each prefixed `▁`), `</s>` = 1: it fits the tiny umT5's
/// 100-token vocabulary.
pub fn write_tokenizer(path: &Path, words: &[&str]) {
    let mut vocab: Vec<(String, f64)> = ["<pad>", "</s>", "<unk>", "▁"]
        .iter()
        .map(|s| (s.to_string(), 0.0))
        .collect();
    vocab.extend(('a'..='z').map(|c| (c.to_string(), -5.0)));
    vocab.extend(words.iter().map(|w| (format!("▁{w}"), -1.0)));
    let mut tokenizer = Tokenizer::new(Unigram::from(vocab, Some(2), false).expect("unigram"));
    tokenizer.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::Always, true)));
    tokenizer.save(path, false).expect("tokenizer saved");
}

/// A path as the `&str` an argument list takes.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A started process's stderr, line by line.
pub type StderrLines = Lines<BufReader<ChildStderr>>;

/// Starts `command` with its stdout discarded and its stderr read line by line.
pub fn spawn_with_stderr(mut command: Command) -> (Child, StderrLines) {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    let lines = BufReader::new(child.stderr.take().expect("stderr piped")).lines();
    (child, lines)
}

/// Reads lines until one satisfies `until` (included); every line read.
pub fn read_until(lines: &mut StderrLines, until: impl Fn(&str) -> bool) -> Vec<String> {
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("stderr is text");
        let done = until(&line);
        seen.push(line);
        if done {
            break;
        }
    }
    seen
}

/// Runs `framesmith` with `args` and stdin closed, killing it if it has not finished within `limit`: (exit
/// code, stdout, stderr), or `None` when it had to be killed — a test of something that must not hang fails
/// instead of hanging the suite.
#[cfg(unix)]
pub fn framesmith_within(
    args: &[&str],
    limit: std::time::Duration,
) -> Option<(Option<i32>, String, String)> {
    let child = Command::new(env!("CARGO_BIN_EXE_framesmith"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("framesmith runs");
    let pid = child.id().to_string();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match finished.recv_timeout(limit) {
        Ok(out) => {
            let out = out.expect("framesmith's output");
            Some((
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ))
        }
        Err(_) => {
            // The waiting thread still owns the child; it returns once the process is gone.
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            None
        }
    }
}

/// A rank-2 LoRA for one attention projection of the tiny Wan DiT fixture, in musubi-tuner's layout.
pub fn write_lora(path: &Path) {
    let dev = candle_core::Device::Cpu;
    let ones = |shape: (usize, usize)| {
        candle_core::Tensor::ones(shape, candle_core::DType::F32, &dev).expect("tensor")
    };
    let name = "lora_unet_blocks_0_self_attn_q";
    let tensors: std::collections::HashMap<String, candle_core::Tensor> = [
        (format!("{name}.lora_down.weight"), ones((2, 64))),
        (format!("{name}.lora_up.weight"), ones((64, 2))),
        (
            format!("{name}.alpha"),
            candle_core::Tensor::new(2f32, &dev).expect("tensor"),
        ),
    ]
    .into_iter()
    .collect();
    candle_core::safetensors::save(&tensors, path).expect("lora saved");
}
