//! `framesmith plan`: the table, the JSON, the exit statuses, a config with a preset, and flag errors.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod cli_support;

/// Runs `framesmith plan` with `args`: (exit code, stdout, stderr).
fn framesmith(args: &[&str]) -> (Option<i32>, String, String) {
    cli_support::framesmith_status(&[&["plan"], args].concat())
}

const WAN14B_480P: &[&str] = &[
    "--variant",
    "t2v-14b",
    "--base",
    "fp8",
    "--fp8-scale",
    "block64",
    "--width",
    "832",
    "--height",
    "480",
    "--frames",
    "81",
    "--batch",
    "1",
    "--rank",
    "32",
    "--streaming",
    "pinned",
    "--blocks-to-swap",
    "auto",
    "--activations",
    "host",
    "--ram-gb",
    "128",
];

#[test]
fn prints_the_table_and_exits_by_verdict() {
    let mut args = WAN14B_480P.to_vec();
    args.extend(["--vram-budget-gb", "80"]);
    let (code, stdout, stderr) = framesmith(&args);
    println!("{stdout}");
    assert_eq!(code, Some(0), "{stderr}");
    for needle in [
        "t2v-14b (fp8 block64) — 832x480, 81 frames, batch 1, 32760 tokens",
        "component",
        "resident blocks (40 × 356.2 MiB)",
        "saved block inputs (40 × 32760 tokens, f32)",
        "24.99 GiB*",
        "Fits: peak VRAM",
        "of 80.00 GiB",
    ] {
        assert!(stdout.contains(needle), "`{needle}` missing from\n{stdout}");
    }

    // Issue #7's case: 14B FP8 at 480p × 81 frames on a 24 GB card streams part of its blocks (with auto's margin).
    let mut args = WAN14B_480P.to_vec();
    args.extend(["--vram-budget-gb", "24"]);
    let (code, stdout, _) = framesmith(&args);
    println!("{stdout}");
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("20 of 40 blocks streamed (chosen)"),
        "{stdout}"
    );

    let mut args = WAN14B_480P.to_vec();
    args.extend(["--vram-budget-gb", "12"]);
    let (code, stdout, _) = framesmith(&args);
    println!("{stdout}");
    assert_eq!(code, Some(3), "does not fit exits with 3");
    assert!(stdout.contains("Does not fit"), "{stdout}");
    assert!(
        stdout.contains("39 of 40 blocks streamed (chosen)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("suggestion: train on clips of at most"),
        "{stdout}"
    );
}

#[test]
fn json_carries_the_numbers() {
    let mut args = WAN14B_480P.to_vec();
    args.extend(["--vram-budget-gb", "20", "--json"]);
    let (code, stdout, stderr) = framesmith(&args);
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(report["tokens"], 32_760);
    assert_eq!(report["num_blocks"], 40);
    assert_eq!(report["verdict"], "fits");
    assert_eq!(report["blocks_chosen"], true);
    let streamed = report["blocks_to_swap"].as_u64().unwrap();
    assert!((1..40).contains(&streamed), "{streamed}");
    let peak = report["peak_vram_bytes"].as_u64().unwrap();
    assert!(peak <= 20 << 30);
    let lines = report["breakdown"].as_array().unwrap();
    let device: u64 = lines
        .iter()
        .filter(|l| l["placement"] == "device")
        .map(|l| l["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(device, peak);
}

#[test]
fn plans_a_config_with_a_preset() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("run.toml");
    std::fs::write(
        &config,
        "[model]\nvariant = \"t2v-14b\"\n[memory]\nvram_budget_gb = 16.0\n",
    )
    .unwrap();
    let path = config.to_str().unwrap();
    let (code, stdout, stderr) = framesmith(&[
        "--config",
        path,
        "--preset",
        "low-vram-windows",
        "--ram-gb",
        "64",
    ]);
    println!("{stdout}");
    assert!(matches!(code, Some(0 | 3)), "{stderr}");
    // The preset's clips: 480p, the longer of its 17- and 33-frame targets; staged streaming pins only the ring.
    assert!(stdout.contains("832x480, 33 frames"), "{stdout}");
    assert!(
        stdout.contains("pinned staging ring (4 × 8.0 MiB)"),
        "{stdout}"
    );
    assert!(stdout.contains("(chosen)"), "{stdout}");
}

#[test]
fn bad_input_is_an_error_naming_the_fix() {
    let (code, _, stderr) = framesmith(&["--width", "832"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("--variant"), "{stderr}");

    let (code, _, stderr) = framesmith(&["--variant", "t2v-14b", "--base", "fp4"]);
    assert_eq!(code, Some(2), "clap's usage error");
    assert!(stderr.contains("fp4"), "{stderr}");

    let (code, _, stderr) = framesmith(&[
        "--variant",
        "t2v-14b",
        "--streaming",
        "pinned",
        "--blocks-to-swap",
        "40",
    ]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("at most 39"), "{stderr}");

    let (code, _, stderr) = framesmith(&["--variant", "t2v-14b", "--frames", "80"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("80 frames"), "{stderr}");

    let (code, _, stderr) = framesmith(&["--variant", "t2v-2b"]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("unknown variant `t2v-2b`: use one of t2v-1.3b, t2v-14b"),
        "{stderr}"
    );

    // Negative sizes reach the check (not clap's "unexpected argument '-1'").
    for flag in [
        "--vram-budget-gb",
        "--free-vram-gb",
        "--ram-gb",
        "--ram-budget-gb",
    ] {
        let (code, _, stderr) = framesmith(&["--variant", "t2v-14b", flag, "-1"]);
        assert_eq!(code, Some(1));
        assert!(
            stderr.contains(&format!("{flag} must be a positive number of GiB, not -1")),
            "{stderr}"
        );
    }
}

#[test]
fn as_bench_leaves_out_the_optimizer_and_the_context() {
    let json = |extra: &[&str]| -> serde_json::Value {
        let mut args = WAN14B_480P.to_vec();
        args.extend(["--vram-budget-gb", "80", "--json"]);
        args.extend(extra);
        let (code, stdout, stderr) = framesmith(&args);
        assert_eq!(code, Some(0), "{stderr}");
        serde_json::from_str(&stdout).unwrap()
    };
    let full = json(&[]);
    let bench = json(&["--as-bench"]);
    let labelled = |r: &serde_json::Value, prefix: &str| -> u64 {
        r["breakdown"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["label"].as_str().unwrap().starts_with(prefix))
            .map(|l| l["bytes"].as_u64().unwrap())
            .sum()
    };
    let left_out = labelled(&full, "AdamW") + labelled(&full, "CUDA context");
    assert!(left_out > 0);
    assert_eq!(
        labelled(&bench, "AdamW") + labelled(&bench, "CUDA context"),
        0
    );
    assert_eq!(
        full["peak_vram_bytes"].as_u64().unwrap() - bench["peak_vram_bytes"].as_u64().unwrap(),
        left_out
    );
}

#[test]
fn checkpointing_flag_changes_what_is_kept() {
    let json = |mode: &str| -> serde_json::Value {
        let args = [
            "--variant",
            "t2v-1.3b",
            "--base",
            "bf16",
            "--checkpointing",
            mode,
            "--vram-budget-gb",
            "80",
            "--json",
        ];
        let (code, stdout, stderr) = framesmith(&args);
        assert!(matches!(code, Some(0 | 3)), "{stderr}");
        serde_json::from_str(&stdout).unwrap()
    };
    let labels = |r: &serde_json::Value| -> Vec<String> {
        r["breakdown"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["label"].as_str().unwrap().to_string())
            .collect()
    };
    let has = |r: &serde_json::Value, prefix: &str| labels(r).iter().any(|l| l.starts_with(prefix));
    let peak = |r: &serde_json::Value| r["peak_vram_bytes"].as_u64().unwrap();
    let (blocks, attention, off) = (json("blocks"), json("attention"), json("OFF"));
    assert!(has(&blocks, "saved block inputs") && !has(&blocks, "kept"));
    assert!(has(&attention, "saved block inputs (30 × "));
    assert!(has(&attention, "kept self-attention outputs (30 × "));
    assert!(has(&off, "kept block tapes") && !has(&off, "saved block inputs"));
    assert!(peak(&blocks) < peak(&attention) && peak(&attention) < peak(&off));

    let (code, _, stderr) = framesmith(&["--variant", "t2v-1.3b", "--checkpointing", "none"]);
    assert_eq!(code, Some(2), "clap's usage error");
    assert!(stderr.contains("none"), "{stderr}");
}

#[test]
fn ti2v_5b_plans_at_its_native_size_in_either_mode() {
    let args = |mode: &'static str| {
        vec![
            "--variant",
            "ti2v-5b",
            "--mode",
            mode,
            "--width",
            "1280",
            "--height",
            "704",
            "--frames",
            "121",
            "--vram-budget-gb",
            "80",
            "--json",
        ]
    };
    let peak = |mode| {
        let (code, stdout, stderr) = framesmith(&args(mode));
        assert_eq!(code, Some(0), "{stderr}");
        let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
        assert_eq!(report["tokens"], 27_280);
        assert_eq!(report["num_blocks"], 30);
        report["peak_vram_bytes"].as_u64().unwrap()
    };
    // Image-to-video steps carry per-token timesteps (the start frame's are 0): more memory.
    assert!(peak("i2v") > peak("t2v"));
    let mut bad = args("i2v");
    bad[5] = "848";
    let (code, _, stderr) = framesmith(&bad);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("multiples of 32"), "{stderr}");
}

#[test]
fn ranks_of_one_machine_share_its_ram() {
    let mut args = WAN14B_480P.to_vec();
    args.extend(["--vram-budget-gb", "24"]);
    let (_, one, _) = framesmith(&args);
    assert!(!one.contains("swapping"), "one rank fits 128 GiB:\n{one}");

    args.extend(["--gpus", "0,1"]);
    let (code, two, stderr) = framesmith(&args);
    println!("{two}");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(two.contains("per GPU (2 GPUs)"), "{two}");
    assert!(two.contains("each of the 2 ranks on this machine"), "{two}");
    assert!(!two.contains("swapping"), "{two}");

    let mut args = WAN14B_480P.to_vec();
    args.extend(["--vram-budget-gb", "24", "--gpus", "0,1,2,3"]);
    let (code, four, _) = framesmith(&args);
    println!("{four}");
    // A warning, not a refusal: the VRAM verdict stands.
    assert_eq!(code, Some(0));
    assert!(
        four.contains("for the 4 ranks, and this machine has 128.00 GiB: expect swapping")
            && four
                .contains("fewer GPUs (--gpus), fewer streamed blocks or activations on the GPU"),
        "{four}"
    );

    let mut args = WAN14B_480P.to_vec();
    args.extend(["--gpus", "1,1"]);
    let (code, _, stderr) = framesmith(&args);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("--gpus names a GPU twice"), "{stderr}");
}

/// [`WAN14B_480P`] with `changes` (flag, value): each replaces the flag's value there, or is added.
fn wan14b_with<'a>(changes: &[(&'a str, &'a str)]) -> Vec<&'a str> {
    let mut args = WAN14B_480P.to_vec();
    for &(flag, value) in changes {
        match args.iter().position(|a| *a == flag) {
            Some(i) => args[i + 1] = value,
            None => args.extend([flag, value]),
        }
    }
    args
}

#[test]
fn a_ram_budget_is_what_the_plan_must_fit() {
    let roomy = wan14b_with(&[("--vram-budget-gb", "24"), ("--ram-budget-gb", "100")]);
    let (code, stdout, stderr) = framesmith(&roomy);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("Fits: peak VRAM") && stdout.contains("of 100.00 GiB"),
        "{stdout}"
    );
    let tight = wan14b_with(&[("--vram-budget-gb", "24"), ("--ram-budget-gb", "8")]);
    let (code, stdout, stderr) = framesmith(&tight);
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(
        stdout.contains("the RAM budget (memory.ram_budget_gb) is 8.00 GiB"),
        "{stdout}"
    );
}

#[test]
fn a_plan_the_ram_cannot_hold_does_not_fit() {
    // 14B at 480p with every block but one streamed from page-locked RAM and the saved inputs there too: the VRAM
    // fits a 24 GB card, the page-locked RAM does not fit 8 GiB.
    let roomy = framesmith(&wan14b_with(&[
        ("--vram-budget-gb", "24"),
        ("--blocks-to-swap", "39"),
    ]));
    assert_eq!(roomy.0, Some(0), "{}{}", roomy.1, roomy.2);
    let args = wan14b_with(&[
        ("--vram-budget-gb", "24"),
        ("--blocks-to-swap", "39"),
        ("--ram-gb", "8"),
    ]);
    let (code, stdout, stderr) = framesmith(&args);
    println!("{stdout}");
    assert_eq!(code, Some(3), "does not fit exits with 3: {stdout}{stderr}");
    assert!(stdout.contains("Does not fit in RAM"), "{stdout}");
    assert!(
        stdout.contains(
            "of page-locked RAM, which cannot be swapped out, and this machine has 8.00 GiB"
        ) && stdout.contains("memory.streaming = \"staged\""),
        "{stdout}"
    );
    assert!(!stdout.contains("expect swapping"), "{stdout}");
    let (code, json, _) = framesmith(&[&args[..], &["--json"]].concat());
    assert_eq!(code, Some(3));
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(report["verdict"], "does_not_fit");
    assert!(report["ram_shortfall"].as_str().is_some(), "{json}");
}

#[test]
fn absurd_sizes_and_ranks_are_refused_by_name() {
    let with = |extra: &[(&str, &str)]| {
        framesmith(&wan14b_with(
            &[&[("--vram-budget-gb", "24")], extra].concat(),
        ))
    };
    let (code, stdout, stderr) = with(&[
        ("--width", "100000"),
        ("--height", "100000"),
        ("--frames", "100001"),
    ]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("100000x100000 is more than 16384 pixels a side")
            && stderr.contains("dataset.resolution (--width / --height)"),
        "{stderr}"
    );
    let (code, _, stderr) = with(&[("--frames", "100001")]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("100001 frames is more than 4093"),
        "{stderr}"
    );
    let (code, _, stderr) = with(&[("--batch", "100000000")]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("batch 100000000 is more than"), "{stderr}");
    for rank in ["100000", "10000000000", "18446744073709551615"] {
        let (code, _, stderr) = with(&[("--rank", rank)]);
        assert_eq!(code, Some(1), "{rank}: {stderr}");
        assert!(
            stderr.contains(&format!("lora.rank = {rank} is more than"))
                && stderr.contains("use lora.rank <= 5120"),
            "{stderr}"
        );
    }
    // The largest clip the planner takes is planned, not refused or overflowed.
    let (code, stdout, stderr) = with(&[
        ("--width", "16384"),
        ("--height", "16384"),
        ("--frames", "4093"),
        ("--rank", "5120"),
    ]);
    assert!(matches!(code, Some(0 | 3)), "{stdout}{stderr}");
    assert!(stdout.contains("1073741824 tokens"), "{stdout}");
}

#[test]
fn a_preset_for_another_model_family_is_refused() {
    let (code, stdout, stderr) = framesmith(&["--variant", "t2v-14b", "--preset", "flux-dev-24gb"]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains(
            "the preset `flux-dev-24gb` is made for FLUX.1 runs, and this run trains a Wan model"
        ),
        "{stderr}"
    );
    let (code, _, stderr) = framesmith(&[
        "--variant",
        "flux-dev",
        "--preset",
        "flux-dev-24gb",
        "--ram-gb",
        "64",
    ]);
    assert!(matches!(code, Some(0 | 3)), "{stderr}");
}

/// A TOML string naming a file that is not a regular file: a FIFO made in `dir` (`NUL` off Unix).
fn fifo_toml(dir: &std::path::Path) -> String {
    if !cfg!(unix) {
        return "\"NUL\"".to_string();
    }
    let fifo = dir.join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    format!("{:?}", fifo.to_str().unwrap())
}

#[test]
fn settings_that_train_refuses_plan_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = fifo_toml(dir.path());
    let cases: &[(&str, &str, &str)] = &[
        (
            "[lora]\nalpha = nan",
            "lora.alpha",
            "positive number, not NaN",
        ),
        ("[lora]\nalpha = -inf", "lora.alpha", "positive number"),
        (
            "[optimizer]\nlearning_rate = -1.0",
            "optimizer.learning_rate",
            "positive",
        ),
        (
            "[training]\nmax_train_steps = 0",
            "training.max_train_steps",
            "",
        ),
        (
            "[training]\ngradient_accumulation_steps = 0",
            "training.gradient_accumulation_steps",
            "",
        ),
        (
            "[output]\noutput_name = \"../../etc/passwd\"",
            "output.output_name",
            "",
        ),
        ("[output]\noutput_name = \"\"", "output.output_name", ""),
        (
            "[lora]\ninit_from = \"/dev/zero\"",
            "lora.init_from",
            "not a file",
        ),
        (
            &format!("[lora]\ninit_from = {fifo}"),
            "lora.init_from",
            "not a file",
        ),
    ];
    for (i, (toml, key, words)) in cases.iter().enumerate() {
        let config = dir.path().join(format!("run{i}.toml"));
        std::fs::write(&config, format!("[model]\nvariant = \"t2v-14b\"\n{toml}\n")).unwrap();
        let (code, stdout, stderr) = framesmith(&[
            "--config",
            config.to_str().unwrap(),
            "--ram-gb",
            "64",
            "--free-vram-gb",
            "24",
        ]);
        assert_eq!(code, Some(1), "{toml}: {stdout}{stderr}");
        assert!(
            stderr.contains(&format!("`{key}`")) && stderr.contains(words),
            "{toml}: {stderr}"
        );
    }
}

#[test]
fn files_not_there_yet_and_a_gpu_not_here_are_planned() {
    // Files that are not there yet and a GPU this machine may not have are not the plan's business.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("later.toml");
    std::fs::write(
        &config,
        "[model]\nvariant = \"t2v-14b\"\ndit = \"not-downloaded-yet.safetensors\"\n\
         [dataset]\nconfig = \"later/dataset.toml\"\n[training]\ndevice = \"cuda:0\"\n",
    )
    .unwrap();
    let (code, stdout, stderr) = framesmith(&[
        "--config",
        config.to_str().unwrap(),
        "--ram-gb",
        "64",
        "--free-vram-gb",
        "80",
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
}

#[test]
fn a_familys_own_setting_is_a_flag_that_changes_its_plan() {
    let plan = |order: &str| {
        let (code, stdout, stderr) = framesmith(&[
            "--variant",
            "flux-dev",
            "--streaming",
            "pinned",
            "--blocks-to-swap",
            "10",
            "--free-vram-gb",
            "80",
            "--ram-gb",
            "128",
            "--flux-stream-order",
            order,
            "--json",
        ]);
        assert!(matches!(code, Some(0 | 3)), "{stdout}{stderr}");
        stdout
    };
    // Ten double-stream blocks weigh more than ten single-stream ones; the flag is read as the config spells it.
    assert_ne!(plan("single_first"), plan("double_first"));
    assert_eq!(plan("double_first"), plan("DOUBLE_FIRST"));
    let (code, _, stderr) =
        framesmith(&["--variant", "flux-dev", "--flux-stream-order", "sideways"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("single_first"), "{stderr}");
}

#[test]
fn a_run_that_samples_plans_its_sampling_phase() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for file in ["ae.safetensors", "t5.safetensors", "clip.safetensors"] {
        std::fs::write(d.join(file), b"").unwrap();
    }
    std::fs::write(
        d.join("prompts.txt"),
        "a fox --w 1024 --h 1024 --s 20 --d 7\n",
    )
    .unwrap();
    let toml = |sampling: bool| {
        let mut text = format!(
            "[model]\nvariant = \"flux-dev\"\nbase_dtype = \"fp8\"\nvae = \"{0}/ae.safetensors\"\n\
             text_encoder = \"{0}/t5.safetensors\"\nclip = \"{0}/clip.safetensors\"\n[dataset]\n\
             resolution = [1024, 1024]\ntarget_frames = [1]\n[memory]\nstreaming = \"pinned\"\n\
             blocks_to_swap = \"auto\"\nactivations = \"host\"\nvram_budget_gb = 12.0\n",
            d.display()
        );
        if sampling {
            text += &format!(
                "[sampling]\nprompts = \"{}/prompts.txt\"\nsample_every_n_steps = 2\n",
                d.display()
            );
        }
        text
    };
    let plan = |name: &str, sampling: bool| {
        let config = d.join(name);
        std::fs::write(&config, toml(sampling)).unwrap();
        let (code, stdout, stderr) =
            framesmith(&["--config", config.to_str().unwrap(), "--ram-gb", "64"]);
        println!("{stdout}");
        assert_eq!(code, Some(0), "{stderr}");
        stdout
    };
    let sampled = plan("samples.toml", true);
    for needle in [
        "training step peak",
        "sampling during training — 1024x1024, 1 frame, 20 steps",
        "samples: autoencoder (encoder and decoder)",
        "sampling working set",
        "sampling peak",
        "while sampling (the training step: ",
    ] {
        assert!(
            sampled.contains(needle),
            "`{needle}` missing from\n{sampled}"
        );
    }
    let plain = plan("plain.toml", false);
    assert!(!plain.contains("sampling"), "{plain}");
    let streamed = |text: &str| -> usize {
        let at = text.find(" blocks streamed").unwrap();
        let words: Vec<&str> = text[..at].rsplit(", ").next().unwrap().split(' ').collect();
        words[0].parse().unwrap()
    };
    // The 1024² decode needs more than the step: `auto` streams more blocks so that both fit.
    assert!(streamed(&sampled) > streamed(&plain), "{sampled}\n{plain}");
}
