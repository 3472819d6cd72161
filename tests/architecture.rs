//! The dependency rules of DESIGN.md §3. Most are facts of the crate graph, read here from the workspace's
//! manifests: the app never reaches candle; config reaches neither candle nor egui; nothing below the app reaches
//! egui/eframe; only `framesmith-nn` turns CUDA on in candle. The rest are rules about code, checked by scanning
//! sources: models and nn know nothing of channels or logging, the app names no tensors, no code outside nn
//! asks whether the build has CUDA, the engine's `generate/` names no model family, and its `train/`, `plan/` and
//! `prep/` reach no family's model.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A crate's direct dependencies (normal and target-specific, not dev) and the features its own features turn
/// on in them.
#[derive(Default)]
struct Manifest {
    deps: BTreeSet<String>,
    forwarded_features: BTreeSet<String>,
}

fn read_manifest(path: &Path) -> Manifest {
    let text = std::fs::read_to_string(path).unwrap();
    let doc: toml::Table = text.parse().unwrap();
    let mut m = Manifest::default();
    let mut tables = vec![doc.get("dependencies")];
    if let Some(targets) = doc.get("target").and_then(|t| t.as_table()) {
        tables.extend(targets.values().map(|t| t.get("dependencies")));
    }
    for table in tables.into_iter().flatten() {
        m.deps
            .extend(table.as_table().unwrap().keys().map(|k| k.to_string()));
    }
    if let Some(features) = doc.get("features").and_then(|f| f.as_table()) {
        for list in features.values() {
            for item in list.as_array().unwrap() {
                m.forwarded_features
                    .insert(item.as_str().unwrap().to_string());
            }
        }
    }
    m
}

/// Every workspace crate's manifest by package name, the root package included.
fn manifests() -> BTreeMap<String, Manifest> {
    let mut out = BTreeMap::new();
    out.insert(
        "framesmith".to_string(),
        read_manifest(&workspace().join("Cargo.toml")),
    );
    for entry in std::fs::read_dir(workspace().join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        out.insert(name, read_manifest(&dir.join("Cargo.toml")));
    }
    out
}

/// Every dependency `krate` reaches through the workspace's crates (external crates' own dependencies are not
/// followed: none of the rules' crates come in through them).
fn reaches(all: &BTreeMap<String, Manifest>, krate: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![krate.to_string()];
    while let Some(k) = todo.pop() {
        let Some(m) = all.get(&k) else { continue };
        for d in &m.deps {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

fn assert_reaches_none(all: &BTreeMap<String, Manifest>, krate: &str, banned: &[&str], why: &str) {
    let reached = reaches(all, krate);
    let bad: Vec<&&str> = banned.iter().filter(|b| reached.contains(**b)).collect();
    assert!(bad.is_empty(), "{krate} reaches {bad:?}: {why}");
}

#[test]
fn the_workspace_has_the_crates_of_the_design() {
    let names: Vec<String> = manifests().into_keys().collect();
    for expected in [
        "framesmith",
        "framesmith-app",
        "framesmith-bench",
        "framesmith-config",
        "framesmith-data",
        "framesmith-engine",
        "framesmith-models",
        "framesmith-nn",
        "framesmith-telemetry",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing: {names:?}"
        );
    }
}

#[test]
fn the_app_never_reaches_candle() {
    let all = manifests();
    assert_reaches_none(
        &all,
        "framesmith-app",
        &[
            "candle-core",
            "candle-nn",
            "framesmith-nn",
            "framesmith-models",
            "framesmith-engine",
            "framesmith-data",
        ],
        "the app talks to the engine only through the protocol",
    );
}

#[test]
fn config_is_plain_data() {
    let all = manifests();
    assert_reaches_none(
        &all,
        "framesmith-config",
        &[
            "candle-core",
            "candle-nn",
            "egui",
            "eframe",
            "framesmith-nn",
        ],
        "config and the protocol are plain data the app and the engine share",
    );
}

#[test]
fn nothing_below_the_app_reaches_the_gui() {
    let all = manifests();
    for krate in [
        "framesmith-config",
        "framesmith-nn",
        "framesmith-models",
        "framesmith-data",
        "framesmith-engine",
        "framesmith-telemetry",
        "framesmith-bench",
    ] {
        assert_reaches_none(
            &all,
            krate,
            &["egui", "eframe", "egui_plot", "rfd", "framesmith-app"],
            "only the app draws",
        );
    }
}

#[test]
fn models_and_nn_know_no_config_or_channels_by_their_dependencies() {
    let all = manifests();
    for krate in ["framesmith-nn", "framesmith-models"] {
        assert_reaches_none(
            &all,
            krate,
            &["framesmith-config", "framesmith-data", "framesmith-engine"],
            "models and nn are tensor code",
        );
    }
}

#[test]
fn only_nn_turns_cuda_on_in_candle() {
    for (name, m) in manifests() {
        let cuda: Vec<&String> = m
            .forwarded_features
            .iter()
            .filter(|f| f.starts_with("candle-core/") || f.starts_with("candle-nn/"))
            .collect();
        if name != "framesmith-nn" {
            assert!(
                cuda.is_empty(),
                "{name} turns on candle features {cuda:?}: CUDA lives in framesmith-nn"
            );
        }
    }
}

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

/// Lines of non-test code (comments dropped) in crate `krate` that mention any of `needles`. Test files
/// (`tests.rs` and the files of a `tests/` folder) and everything after a file's `#[cfg(test)]` are not the
/// crate's code.
fn offending(krate: &str, needles: &[&str]) -> Vec<String> {
    let root = workspace().join("crates").join(krate).join("src");
    let mut found = Vec::new();
    for file in rust_files(&root) {
        let in_tests = file
            .strip_prefix(&root)
            .is_ok_and(|rel| rel.components().any(|c| c.as_os_str() == "tests"));
        if in_tests
            || file
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
fn models_and_nn_know_no_channels_or_logging() {
    for krate in ["framesmith-models", "framesmith-nn"] {
        let bad = offending(krate, &["mpsc", "println!", "eprintln!", "log::"]);
        assert!(
            bad.is_empty(),
            "{krate} must stay pure tensor code:\n{}",
            bad.join("\n")
        );
    }
}

#[test]
fn models_call_nn_ops_never_its_cuda_module() {
    let bad = offending(
        "framesmith-models",
        &["framesmith_nn::cuda", "feature = \"cuda\"", "candle_nn::"],
    );
    assert!(
        bad.is_empty(),
        "CUDA dispatch lives in framesmith-nn (nn::ops, nn::attention, nn::norm; candle-nn's ops have CUDA \
         kernels only where nn turns them on):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_app_never_names_tensors() {
    let bad = offending("framesmith-app", &["candle", "Tensor"]);
    assert!(
        bad.is_empty(),
        "the app must talk to the engine only through the protocol:\n{}",
        bad.join("\n")
    );
}

/// Lines (comments dropped) of every Rust file under `dir`, tests included, that mention any of `needles`.
fn mentions(dir: &Path, needles: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in rust_files(dir) {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if needles.iter().any(|n| code.contains(n)) {
                found.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn only_nn_asks_whether_this_build_has_cuda() {
    // The bench's CUDA-only benchmarks move behind `framesmith_nn::device` next.
    let others = ["framesmith-nn", "framesmith-bench"];
    let mut dirs = vec![workspace().join("src")];
    for entry in std::fs::read_dir(workspace().join("crates"))
        .unwrap()
        .flatten()
    {
        if !others.iter().any(|n| entry.file_name() == *n) {
            dirs.push(entry.path());
        }
    }
    let needles = [
        "feature = \"cuda\"",
        "feature = \"cudnn\"",
        "framesmith_nn::cuda",
    ];
    let bad: Vec<String> = dirs.iter().flat_map(|d| mentions(d, &needles)).collect();
    assert!(
        bad.is_empty(),
        "device code lives in framesmith-nn behind `framesmith_nn::device` (DESIGN.md §3): ask it, not a cfg on \
         CUDA:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_engines_generate_folder_names_no_family() {
    let dir = workspace().join("crates/framesmith-engine/src/generate");
    let needles = [
        "wan::",
        "flux::",
        "qwen_image::",
        "Wan",
        "Flux",
        "QwenImage",
    ];
    let bad = mentions(&dir, &needles);
    assert!(
        bad.is_empty(),
        "generate/ holds the family-neutral call, request, samplers and prompt files; what a family generates with \
         lives in its folder under family/ (DESIGN.md §4.8):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_engines_train_plan_and_prep_folders_reach_no_family_model() {
    let engine = workspace().join("crates/framesmith-engine/src");
    let needles = ["wan::", "flux::", "qwen_image::"];
    let bad: Vec<String> = ["train", "plan", "prep"]
        .iter()
        .flat_map(|folder| mentions(&engine.join(folder), &needles))
        // Tests of the generic code may train a family's tiny model; the code itself goes through the family.
        .filter(|line| !in_test_file(line))
        .collect();
    assert!(
        bad.is_empty(),
        "train/, plan/ and prep/ are the same for every family: a family's models, files and arithmetic live in its \
         folder under family/ and are reached through the `Family` traits (DESIGN.md §4.8):\n{}",
        bad.join("\n")
    );
}

/// Whether a line of [`mentions`] is from a test file (`tests.rs`, `*_tests.rs`).
fn in_test_file(line: &str) -> bool {
    let path = line.split(':').next().unwrap_or_default();
    path.ends_with("tests.rs")
}

/// Every Rust file of the workspace's own code: `src/`, `tests/` and each crate's `src/` and `tests/`.
fn workspace_rust_files() -> Vec<PathBuf> {
    let mut dirs = vec![workspace().join("src"), workspace().join("tests")];
    for entry in std::fs::read_dir(workspace().join("crates"))
        .unwrap()
        .flatten()
    {
        dirs.push(entry.path().join("src"));
        dirs.push(entry.path().join("tests"));
    }
    dirs.iter().flat_map(|d| rust_files(d)).collect()
}

#[test]
fn tests_are_in_their_module_or_in_tests_and_none_is_wired_by_path() {
    let path_attribute = concat!("#[", "path");
    let mut bad = Vec::new();
    for file in workspace_rust_files() {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.ends_with("_tests.rs") {
            bad.push(format!("{}: a test file beside its module", file.display()));
        }
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with(path_attribute) {
                bad.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "unit tests live in the module they test (inline `mod tests`, or its own `foo/tests.rs`), integration \
         tests in the crate's tests/, and nothing is wired in by #[path] (STYLE.md):\n{}",
        bad.join("\n")
    );
}

/// Whether `line` names a model family the way the family count of issue 42 finds it: `flux` anywhere, `wan`
/// starting a word, `ModelFamily::` or `RunModel`, in any case.
fn names_a_family(line: &str) -> bool {
    let line = line.to_ascii_lowercase();
    let word_start = |i: usize| {
        i == 0 || !line.as_bytes()[i - 1].is_ascii_alphanumeric() && line.as_bytes()[i - 1] != b'_'
    };
    line.contains("flux")
        || line.contains("modelfamily::")
        || line.contains("runmodel")
        || line.match_indices("wan").any(|(i, _)| word_start(i))
}

#[test]
fn the_generic_folders_the_cli_and_the_app_name_no_family() {
    let dirs = [
        "crates/framesmith-engine/src/train",
        "crates/framesmith-engine/src/plan",
        "crates/framesmith-engine/src/prep",
        "crates/framesmith-engine/src/generate",
        "src/cli",
        "crates/framesmith-app/src",
    ];
    let mut bad = Vec::new();
    for dir in dirs {
        for file in rust_files(&workspace().join(dir)) {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            for (i, line) in text.lines().enumerate() {
                if names_a_family(line) {
                    bad.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "what is one family's lives in its folder (engine family/, config family/, its `flag_help` and \
         `FamilySetting`s), not in the generic folders, the CLI or the app (docs/ARCHITECTURE.md):\n{}",
        bad.join("\n")
    );
}
