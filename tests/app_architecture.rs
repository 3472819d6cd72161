//! DESIGN.md §3's dependency rules for the app, checked on the source: the app never touches candle, tensors or
//! the engine's modules (only `protocol` and `config`), and the engine side never imports egui or eframe.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

fn offenders(dirs: &[&str], forbidden: &[&str]) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for dir in dirs {
        for file in rust_files(&src.join(dir)) {
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|err| panic!("cannot read {}: {err}", file.display()));
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                for word in forbidden {
                    if code.contains(word) {
                        found.push(format!("{}:{}: {word}", file.display(), n + 1));
                    }
                }
            }
        }
    }
    found
}

#[test]
fn app_and_telemetry_never_touch_candle_or_the_engine_modules() {
    let forbidden = [
        "candle",
        "Tensor",
        "crate::train",
        "crate::models",
        "crate::nn",
        "crate::data",
        "crate::parity",
    ];
    let found = offenders(&["app", "telemetry"], &forbidden);
    assert!(found.is_empty(), "forbidden imports:\n{}", found.join("\n"));
}

#[test]
fn engine_side_never_imports_the_gui() {
    let found = offenders(
        &["train", "models", "nn", "data", "protocol", "config"],
        &["egui", "eframe"],
    );
    assert!(
        found.is_empty(),
        "GUI imports outside the app:\n{}",
        found.join("\n")
    );
}

#[test]
fn telemetry_knows_nothing_of_egui() {
    let found = offenders(&["telemetry"], &["egui", "eframe"]);
    assert!(found.is_empty(), "{}", found.join("\n"));
}
