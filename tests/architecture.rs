//! The dependency rules of DESIGN.md §3, checked by scanning `src/`: the app never touches candle or tensors;
//! `train`, `models`, `nn` and `data` never import egui/eframe; `models` and `nn` know nothing of channels,
//! config files or logging.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(rust_files(&path));
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out
}

/// Lines of non-test code (comments dropped) in `src/<module>` that mention any of `needles`. Test files
/// (`tests.rs`, `*_tests.rs`) and everything after a file's `#[cfg(test)]` are not the module's code.
fn offending(module: &str, needles: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(module);
    let mut found = Vec::new();
    for file in rust_files(&root) {
        if file
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with("tests.rs"))
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (i, line) in text
            .lines()
            .enumerate()
            .take_while(|(_, l)| !l.trim_start().starts_with("#[cfg(test)]"))
        {
            let code = line.split("//").next().unwrap_or_default();
            if needles.iter().any(|n| code.contains(n)) {
                found.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn app_never_touches_tensors() {
    let bad = offending(
        "app",
        &[
            "candle",
            "Tensor",
            "crate::nn",
            "crate::models::wan::WanModel",
            "crate::train::trainer",
        ],
    );
    assert!(
        bad.is_empty(),
        "the app must talk to the engine only through protocol:\n{}",
        bad.join("\n")
    );
}

#[test]
fn engine_never_imports_the_gui() {
    for module in ["train", "models", "nn", "data"] {
        let bad = offending(module, &["egui", "eframe", "crate::app"]);
        assert!(
            bad.is_empty(),
            "{module} must not depend on the GUI:\n{}",
            bad.join("\n")
        );
    }
}

#[test]
fn models_and_nn_know_no_channels_configs_or_logging() {
    for module in ["models", "nn"] {
        let bad = offending(
            module,
            &[
                "mpsc",
                "crate::protocol",
                "crate::config",
                "println!",
                "eprintln!",
                "log::",
            ],
        );
        assert!(
            bad.is_empty(),
            "{module} must stay pure tensor code:\n{}",
            bad.join("\n")
        );
    }
}
