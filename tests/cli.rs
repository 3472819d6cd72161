//! Small headless commands: `inspect`, `presets`, `dataset check`, with their exit statuses.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod cli_support;
use cli_support::framesmith;

#[test]
fn inspect_reports_a_dit_and_rejects_other_files() {
    let weights = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/fixtures/wan/wan21_i2v_tiny/weights.safetensors"
    );
    let (ok, stdout, _) = framesmith(&["inspect", weights]);
    assert!(ok);
    assert!(
        stdout.contains("I2V") && stdout.contains("2 layers"),
        "{stdout}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let text = dir.path().join("model.safetensors");
    std::fs::write(&text, "<html>not a model</html>").expect("write");
    let (ok, _, stderr) = framesmith(&["inspect", text.to_str().expect("utf-8 path")]);
    assert!(!ok);
    assert!(stderr.contains("model.safetensors"), "{stderr}");
}

#[test]
fn presets_list_and_show() {
    let (ok, stdout, _) = framesmith(&["presets"]);
    assert!(ok);
    for name in [
        "e7adb86-compatible",
        "low-vram-windows",
        "balanced-24gb",
        "full-speed-80gb",
        "demo-cpu",
    ] {
        assert!(stdout.contains(name), "{name} missing from\n{stdout}");
    }
    let (ok, stdout, _) = framesmith(&["presets", "show", "e7adb86-compatible"]);
    assert!(ok);
    assert!(
        stdout.contains("model.fp8_scale") && stdout.contains("memory.streaming"),
        "{stdout}"
    );
    let (ok, _, stderr) = framesmith(&["presets", "show", "no-such-preset"]);
    assert!(!ok);
    assert!(stderr.contains("no-such-preset"), "{stderr}");
}

#[test]
fn dataset_check_lists_problems_and_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.png"), b"not a png").expect("write");
    std::fs::write(dir.path().join("a.txt"), "caption").expect("write");
    std::fs::write(dir.path().join("b.png"), b"also not a png").expect("write");
    let (ok, stdout, _) =
        framesmith(&["dataset", "check", dir.path().to_str().expect("utf-8 path")]);
    assert!(!ok, "{stdout}");
    assert!(
        stdout.contains("a.png") && stdout.contains("b.png"),
        "{stdout}"
    );
}
