//! Small headless commands: `inspect`, `presets`, `dataset check`, `doctor`, with their exit statuses.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod cli_support;
use cli_support::framesmith;

#[test]
fn inspect_reports_a_dit_and_rejects_other_files() {
    let weights = cli_support::fixture("wan21_i2v_tiny");
    let (ok, stdout, _) = framesmith(&["inspect", &weights]);
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
        "fast-24gb",
        "16gb-32gb-ram",
        "16gb-64gb-ram",
        "full-speed-80gb",
        "demo-cpu",
        "flux-dev-24gb",
        "flux-dev-12gb",
        "qwen-image-24gb",
        "qwen-image-16gb",
        "hunyuan-video15-24gb",
        "hunyuan-video15-16gb",
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
fn doctor_prints_every_section_and_exits_by_its_verdict() {
    use framesmith_config::protocol::doctor::SystemReport;
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("runs/out");
    let out_arg = cli_support::s(&out);
    let (code, stdout, stderr) = cli_support::framesmith_status(&["doctor", "--output", out_arg]);
    for section in ["Build", "GPU", "CUDA libraries", "Memory", "Video", "Disk"] {
        assert!(
            stdout.lines().any(|l| l == section),
            "{section} missing:\n{stdout}{stderr}"
        );
    }
    assert!(
        stdout.contains(out_arg),
        "the output folder is named:\n{stdout}"
    );
    let verdict = stdout.lines().last().unwrap_or_default();
    match code {
        Some(0) => assert!(verdict.starts_with("Nothing blocks training"), "{stdout}"),
        Some(3) => {
            assert!(verdict.contains("block training") || verdict.contains("blocks training"))
        }
        other => panic!("exit {other:?}:\n{stdout}{stderr}"),
    }

    let (json_code, json, _) =
        cli_support::framesmith_status(&["doctor", "--output", out_arg, "--json"]);
    let report: SystemReport =
        serde_json::from_str(&json).expect("doctor --json is a SystemReport");
    assert_eq!(json_code, code);
    assert_eq!(report.blocks_training(), code == Some(3));
    assert_eq!(report.facts.build.cuda, cfg!(feature = "cuda"));
    if !cfg!(feature = "cuda") {
        // The CPU build says so plainly, says how to get the GPU build, and nothing about a GPU blocks it: only a
        // nearly full disk could.
        assert!(
            stdout.contains("GPU support: no CUDA: this build trains on the CPU only")
                && stdout.contains("warning: This build has no CUDA")
                && stdout.contains("Attention: portable tiled kernel (this build has no CUDA)"),
            "{stdout}"
        );
        let disk_ok = report
            .facts
            .disk
            .free_bytes
            .is_none_or(|b| b >= framesmith_engine::doctor::BLOCKING_FREE_DISK_BYTES);
        assert_eq!(code == Some(0), disk_ok, "{stdout}");
    }
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

#[test]
fn dataset_check_with_skip_unreadable_counts_unreadable_files_as_warnings() {
    let dir = tempfile::tempdir().expect("tempdir");
    image::RgbImage::new(16, 16)
        .save(dir.path().join("good.png"))
        .expect("png");
    std::fs::write(dir.path().join("good.txt"), "caption").expect("write");
    std::fs::write(dir.path().join("a.png"), b"not a png").expect("write");
    std::fs::write(dir.path().join("a.txt"), "caption").expect("write");
    let path = dir.path().to_str().expect("utf-8 path");
    let (ok, stdout, _) = framesmith(&["dataset", "check", path]);
    assert!(!ok, "{stdout}");
    assert!(stdout.contains("--skip-unreadable"), "{stdout}");
    let (ok, stdout, stderr) = framesmith(&["dataset", "check", path, "--skip-unreadable"]);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("left out (skip_unreadable)") && stdout.contains("a.png"),
        "{stdout}"
    );
}

/// Runs `framesmith` with `args` and changes to its environment: (success, stdout + stderr).
fn framesmith_env(args: &[&str], set: &[(&str, &str)], remove: &[&str]) -> (bool, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_framesmith"));
    cmd.args(args);
    for (k, v) in set {
        cmd.env(k, v);
    }
    for k in remove {
        cmd.env_remove(k);
    }
    let out = cmd.output().expect("framesmith runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn save(path: &std::path::Path, tensors: &[(&str, &[usize])]) {
    let map: std::collections::HashMap<String, candle_core::Tensor> = tensors
        .iter()
        .map(|(name, shape)| {
            let t = candle_core::Tensor::zeros(
                *shape,
                candle_core::DType::BF16,
                &candle_core::Device::Cpu,
            )
            .expect("tensor");
            (name.to_string(), t)
        })
        .collect();
    candle_core::safetensors::save(&map, path).expect("saved");
}

#[test]
fn inspect_says_what_any_model_file_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lora = dir.path().join("style.safetensors");
    save(
        &lora,
        &[
            ("lora_unet_blocks_0_self_attn_q.lora_down.weight", &[4, 64]),
            ("lora_unet_blocks_0_self_attn_q.lora_up.weight", &[64, 4]),
            ("lora_unet_blocks_1_ffn_0.lora_down.weight", &[4, 64]),
            ("lora_unet_blocks_1_ffn_0.lora_up.weight", &[256, 4]),
        ],
    );
    let clip = dir.path().join("clip_vision_h.safetensors");
    save(
        &clip,
        &[
            ("visual.conv1.weight", &[8, 3, 2, 2]),
            (
                "visual.transformer.resblocks.0.attn.in_proj_weight",
                &[24, 8],
            ),
            (
                "visual.transformer.resblocks.1.attn.in_proj_weight",
                &[24, 8],
            ),
        ],
    );
    let vae = cli_support::fixture("wan21_vae_tiny");
    let umt5 = cli_support::fixture("umt5_tiny");
    let cases: [(&str, &[&str]); 4] = [
        (
            cli_support::s(&lora),
            &[
                "LoRA adapter",
                "musubi-tuner",
                "rank        4",
                "2 LoRA in 2 blocks",
            ],
        ),
        (
            vae.as_str(),
            &["Wan2.1 VAE (16 latent channels", "model.vae"],
        ),
        (
            umt5.as_str(),
            &["umT5 text encoder", "layers      2", "model.text_encoder"],
        ),
        (
            cli_support::s(&clip),
            &["CLIP image encoder", "2 in the image tower", "--clip"],
        ),
    ];
    for (path, expected) in cases {
        let (ok, stdout, stderr) = framesmith(&["inspect", path]);
        assert!(ok, "{path}: {stdout}{stderr}");
        for part in expected {
            assert!(
                stdout.contains(part),
                "{part} missing for {path}:\n{stdout}"
            );
        }
        assert!(stdout.trim_end().ends_with(path), "{stdout}");
    }
}

#[test]
fn a_config_error_is_printed_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("run.toml");
    std::fs::write(&config, "[lora]\nrnk = 8\n").expect("write");
    let (ok, text) = framesmith_env(&["train", "--config", cli_support::s(&config)], &[], &[]);
    assert!(!ok, "{text}");
    assert_eq!(text.matches("unknown key `lora.rnk`").count(), 1, "{text}");
}

#[test]
fn a_video_given_as_a_config_is_named_as_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let video = dir.path().join("clip.mp4");
    std::fs::write(&video, b"\0\0\0\x18ftypisom\0\0\x02\0isomiso2\x80\xff\xfe").expect("write");
    let path = cli_support::s(&video);
    let (ok, text) = framesmith_env(&["train", "--config", path], &[], &[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("not a TOML file: it looks like a video (MP4/MOV); give a run config")
            && !text.contains("UTF-8"),
        "{text}"
    );
    let (ok, text) = framesmith_env(&["dataset", "check", path], &[], &[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(
            "not a TOML file: it looks like a video (MP4/MOV); give a musubi-tuner dataset config"
        ) && text.trim_end().ends_with(path),
        "{text}"
    );
}

#[test]
fn a_vae_pickle_the_reader_cannot_read_is_explained_once_without_a_backtrace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let images = dir.path().join("images");
    std::fs::create_dir(&images).expect("mkdir");
    image::RgbImage::new(16, 16)
        .save(images.join("a.png"))
        .expect("png");
    std::fs::write(images.join("a.txt"), "a square").expect("write");
    let dataset = dir.path().join("dataset.toml");
    std::fs::write(
        &dataset,
        "[[datasets]]\nimage_directory = \"images\"\ncaption_extension = \".txt\"\ncache_directory = \"cache\"\n",
    )
    .expect("write");
    let vae = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/framesmith-models/src/wan/vae/testdata/protocol4.pth"
    );
    let args = [
        "cache",
        "latents",
        "--dataset",
        cli_support::s(&dataset),
        "--vae",
        vae,
        "--device",
        "cpu",
    ];
    let (ok, text) = framesmith_env(&args, &[("RUST_BACKTRACE", "1")], &[]);
    assert!(!ok, "{text}");
    assert_eq!(text.matches("op-code 149 (FRAME").count(), 1, "{text}");
    assert!(
        !text.contains("backtrace") && !text.contains(".rs:") && text.trim_end().ends_with(vae),
        "{text}"
    );
}

#[cfg(all(target_os = "linux", feature = "gui"))]
#[test]
fn without_a_display_the_app_suggests_the_headless_commands() {
    let (ok, text) = framesmith_env(&[], &[], &["DISPLAY", "WAYLAND_DISPLAY"]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("neither DISPLAY nor WAYLAND_DISPLAY is set")
            && text.contains("framesmith demo")
            && text.contains("framesmith --help"),
        "{text}"
    );
    assert!(!text.contains(".rs:"), "{text}");
}

/// Writes the caches of one item as `framesmith cache` does, for Wan and FLUX.1, into `dir`; returns their paths.
fn write_caches(dir: &std::path::Path, caption: &str) -> [std::path::PathBuf; 4] {
    use candle_core::{DType, Device, Tensor};
    use framesmith_data::cache::{
        write_wan_latent_cache, write_wan_text_cache, LatentCacheMetadata, WanLatentCache,
    };
    use framesmith_data::family::flux::cache::{
        write_flux_latent_cache, write_flux_text_cache, FluxTextCache,
    };
    let zeros = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &Device::Cpu).expect("zeros");
    let wan_latents = dir.join("clip_00000-005_0064x0064_wan.safetensors");
    let latents = WanLatentCache {
        latents: zeros(&[16, 2, 8, 8]),
        latents_image: None,
        latents_control: None,
        clip: None,
        f_indices: None,
    };
    let meta = LatentCacheMetadata {
        architecture: "wan".into(),
        width: 64,
        height: 64,
        format_version: "1.0.1".into(),
        frame_count: Some(5),
    };
    write_wan_latent_cache(&wan_latents, &latents, &meta).expect("latent cache");
    let wan_text = dir.join("clip_wan_te.safetensors");
    write_wan_text_cache(&wan_text, &zeros(&[3, 32]), caption).expect("text cache");
    let flux_latents = dir.join("fox_0064x0064_flux.safetensors");
    write_flux_latent_cache(&flux_latents, &zeros(&[16, 1, 8, 8]), (64, 64)).expect("latents");
    let flux_text = dir.join("fox_flux_te.safetensors");
    let text = FluxTextCache {
        t5: zeros(&[4, 32]),
        clip_l_pooler: zeros(&[8]),
        caption: caption.into(),
    };
    write_flux_text_cache(&flux_text, &text).expect("text cache");
    [wan_latents, wan_text, flux_latents, flux_text]
}

/// An AdamW optimizer state of one LoRA pair and a fragment of a FLUX.1 model, written into `dir`.
fn write_optimizer_and_fragment(dir: &std::path::Path) -> [std::path::PathBuf; 2] {
    let optimizer = dir.join("optimizer.safetensors");
    save(
        &optimizer,
        &[
            ("blocks.0.self_attn.q.lora_down.weight.exp_avg", &[4, 64]),
            ("blocks.0.self_attn.q.lora_down.weight.exp_avg_sq", &[4, 64]),
            ("blocks.0.self_attn.q.lora_up.weight.exp_avg", &[64, 4]),
            ("blocks.0.self_attn.q.lora_up.weight.exp_avg_sq", &[64, 4]),
            ("step", &[1]),
        ],
    );
    let fragment = dir.join("part.safetensors");
    save(
        &fragment,
        &[
            ("double_blocks.3.img_attn.proj.weight", &[8, 8]),
            ("single_blocks.7.linear2.weight", &[8, 16]),
        ],
    );
    [optimizer, fragment]
}

/// `inspect` on `path` succeeds, and says each of `expected` and none of the advice meant for other files.
fn assert_inspect_says(path: &std::path::Path, expected: &[&str]) {
    let (ok, stdout, stderr) = framesmith(&["inspect", cli_support::s(path)]);
    assert!(ok, "{}: {stdout}{stderr}", path.display());
    for part in expected {
        assert!(stdout.contains(part), "{part} missing:\n{stdout}");
    }
    for wrong in [
        "framesmith generate --lora",
        "not a Wan",
        "framesmith inspect`",
    ] {
        assert!(!stdout.contains(wrong), "{wrong}:\n{stdout}");
    }
}

#[test]
fn inspect_names_optimizer_states_caches_and_fragments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let [optimizer, fragment] = write_optimizer_and_fragment(dir.path());
    let [wan_latents, wan_text, flux_latents, flux_text] = write_caches(dir.path(), "a red fox");
    let cases: [(&std::path::Path, &[&str]); 6] = [
        (
            &optimizer,
            &[
                "AdamW optimizer state",
                "not a LoRA",
                "of 2 LoRA tensors",
                "--resume",
            ],
        ),
        (
            &wan_latents,
            &[
                "Wan latent cache",
                "[16, 2, 8, 8]",
                "64x64 pixels",
                "cache latents",
            ],
        ),
        (
            &wan_text,
            &[
                "Wan text-encoder cache",
                "umT5",
                "\"a red fox\"",
                "cache text",
            ],
        ),
        (&flux_latents, &["FLUX.1 latent cache", "[16, 1, 8, 8]"]),
        (
            &flux_text,
            &[
                "FLUX.1 text-encoder cache",
                "T5-XXL and CLIP-L",
                "\"a red fox\"",
            ],
        ),
        (
            &fragment,
            &[
                "part of a FLUX.1 model",
                "1 double-stream, 1 single-stream",
                "flux1-dev.safetensors",
            ],
        ),
    ];
    for (path, expected) in cases {
        assert_inspect_says(path, expected);
    }
}

#[test]
fn inspect_escapes_control_characters_of_names_and_metadata() {
    let dir = tempfile::tempdir().expect("tempdir");
    let named = dir.path().join("named.safetensors");
    save(&named, &[("\u{1b}]0;owned\u{7}\u{1b}[2Jname", &[2])]);
    let (ok, _, stderr) = framesmith(&["inspect", cli_support::s(&named)]);
    assert!(!ok);
    assert!(
        !stderr.contains('\u{1b}') && stderr.contains("\\u{1b}]0;owned\\u{7}"),
        "{stderr:?}"
    );
    let [_, wan_text, ..] = write_caches(dir.path(), "red\u{1b}[31m fox\r\u{202e}");
    let (ok, stdout, stderr) = framesmith(&["inspect", cli_support::s(&wan_text)]);
    assert!(ok, "{stderr}");
    assert!(
        !stdout.contains(['\u{1b}', '\r', '\u{202e}']) && stdout.contains("red\\u{1b}[31m fox"),
        "{stdout:?}"
    );
}

#[test]
fn the_readme_shows_a_dataset_toml_and_that_own_data_needs_the_real_encoders() {
    let readme = include_str!("../README.md");
    let block = readme
        .split("```toml\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("```").map(|(block, _)| block))
        .find(|block| block.contains("[[datasets]]"))
        .expect("a dataset TOML in the README");
    let parsed =
        framesmith_data::config::DatasetConfig::parse(block, std::path::Path::new("README.md"))
            .expect("the README's dataset TOML parses");
    assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
    assert_eq!(parsed.config.datasets.len(), 1);
    let one_line = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        one_line.contains("Your own data trains only from caches made with the real Wan VAE and umT5 text encoder"),
        "the README says own data needs the real VAE and text encoder"
    );
}

#[test]
fn train_refuses_a_preset_made_for_another_model_family() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("run.toml");
    std::fs::write(&config, "[model]\ndemo = true\n").expect("write");
    let args = [
        "train",
        "--config",
        cli_support::s(&config),
        "--preset",
        "flux-dev-12gb",
    ];
    let (ok, text) = framesmith_env(&args, &[], &[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(
            "the preset `flux-dev-12gb` is made for FLUX.1 runs, and this run trains a Wan model"
        ),
        "{text}"
    );
    assert!(!dir.path().join("output").exists(), "nothing ran");
}

#[test]
fn help_says_which_flags_each_model_family_takes() {
    for (command, expected) in [
        (
            &["generate", "--help"][..],
            &[
                "Model families:",
                "Wan: a clip",
                "--text-encoder umT5",
                "FLUX.1: one image",
                "--clip-l clip_l",
                "HunyuanVideo 1.5: a clip",
                "SigLIP",
            ][..],
        ),
        (
            &["cache", "latents", "--help"][..],
            &[
                "Wan: images and clips",
                "FLUX.1: images only",
                "HunyuanVideo 1.5: images and clips",
                "image-encoder",
            ][..],
        ),
        (
            &["cache", "text", "--help"][..],
            &["Wan: --text-encoder umT5", "FLUX.1: --t5"][..],
        ),
        (
            &["plan", "--help"][..],
            &[
                "--variant t2v-1.3b",
                "--variant flux-dev",
                "--flux-stream-order",
                "spread",
            ][..],
        ),
    ] {
        let (ok, stdout, stderr) = framesmith(command);
        assert!(ok, "{command:?}: {stderr}");
        for text in expected {
            assert!(
                stdout.contains(text),
                "{command:?} lacks {text:?}:\n{stdout}"
            );
        }
    }
}
