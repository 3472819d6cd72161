//! `framesmith lora convert | merge | resize | inspect` on small files: what each prints, the files it writes,
//! and the errors that name the file and the fix.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod cli_support;
use cli_support::{framesmith, s, write_lora};

use candle_core::Device;

fn tensors(path: &std::path::Path) -> Vec<(String, Vec<f32>)> {
    let mut out: Vec<(String, Vec<f32>)> = candle_core::safetensors::load(path, &Device::Cpu)
        .expect("load")
        .into_iter()
        .map(|(k, t)| {
            let v = t
                .flatten_all()
                .unwrap()
                .to_dtype(candle_core::DType::F32)
                .unwrap();
            (k, v.to_vec1::<f32>().unwrap())
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn lora_convert_goes_to_comfyui_and_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lora = dir.path().join("lora.safetensors");
    write_lora(&lora);
    let comfy = dir.path().join("comfy.safetensors");
    let (ok, stdout, stderr) =
        framesmith(&["lora", "convert", s(&lora), s(&comfy), "--to", "comfyui"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("converted 1 modules of a wan adapter from the musubi layout to comfyui"),
        "{stdout}"
    );
    let back = dir.path().join("back.safetensors");
    let (ok, _, stderr) = framesmith(&["lora", "convert", s(&comfy), s(&back), "--to", "musubi"]);
    assert!(ok, "{stderr}");
    assert_eq!(tensors(&back), tensors(&lora));
    let (ok, _, stderr) = framesmith(&["lora", "convert", s(&lora), s(&back), "--to", "a1111"]);
    assert!(
        !ok && stderr.contains("musubi, comfyui or diffusers"),
        "{stderr}"
    );
}

#[test]
fn lora_merge_writes_a_new_base_and_refuses_the_base_as_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lora = dir.path().join("lora.safetensors");
    write_lora(&lora);
    let base = cli_support::fixture("wan21_i2v_tiny");
    let out = dir.path().join("merged.safetensors");
    let arg = format!("{}:0.5", s(&lora));
    let (ok, stdout, stderr) = framesmith(&["lora", "merge", &base, s(&out), "--lora", &arg]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("merged 1 modules at strength 0.5"),
        "{stdout}"
    );
    assert!(stdout.contains("wrote 1 changed weights"), "{stdout}");
    let (ok, stdout, _) = framesmith(&["inspect", s(&out)]);
    assert!(
        ok && stdout.contains("I2V"),
        "the merged file is the same model: {stdout}"
    );

    let (ok, _, stderr) = framesmith(&["lora", "merge", &base, &base, "--lora", s(&lora)]);
    assert!(
        !ok && stderr.contains("never overwrites")
            && stderr.trim_end().ends_with("weights.safetensors"),
        "{stderr}"
    );
    let missing = dir.path().join("missing.safetensors");
    let (ok, _, stderr) = framesmith(&["lora", "merge", &base, s(&out), "--lora", s(&missing)]);
    assert!(!ok && stderr.contains("missing.safetensors"), "{stderr}");
    let odd = dir.path().join("odd.safetensors");
    let dev = Device::Cpu;
    let t = candle_core::Tensor::zeros((2, 2), candle_core::DType::F32, &dev).unwrap();
    candle_core::safetensors::save(
        &[("lora_unet_blocks_0_ffn_0.diff".to_string(), t)]
            .into_iter()
            .collect(),
        &odd,
    )
    .unwrap();
    let (ok, _, stderr) = framesmith(&["lora", "merge", &base, s(&out), "--lora", s(&odd)]);
    assert!(
        !ok && stderr.contains("full weight differences")
            && stderr.trim_end().ends_with("odd.safetensors"),
        "{stderr}"
    );
}

#[test]
fn lora_resize_reports_the_energy_kept_and_inspect_the_norms_per_block() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lora = dir.path().join("lora.safetensors");
    write_lora(&lora);
    let small = dir.path().join("rank1.safetensors");
    let (ok, stdout, stderr) = framesmith(&["lora", "resize", s(&lora), s(&small), "--rank", "1"]);
    assert!(ok, "{stderr}");
    // Factors of ones: up · down has rank 1, so rank 1 keeps all of it.
    assert!(
        stdout.contains("cut 1 modules to rank 1: energy kept min 100.00%"),
        "{stdout}"
    );
    let (ok, stdout, stderr) = framesmith(&["lora", "inspect", s(&small)]);
    assert!(ok, "{stderr}");
    let rank_1 = stdout
        .lines()
        .any(|l| l.split_whitespace().eq(["rank", "1"]));
    assert!(stdout.contains("LoRA adapter") && rank_1, "{stdout}");
    // ‖2/2 · up · down‖ of ones [64, 2] · [2, 64]: every entry 2, so 2 · 64.
    assert!(
        stdout.contains("‖ΔW‖ per block, blocks: 0: 128.000"),
        "{stdout}"
    );
    let base = cli_support::fixture("wan21_i2v_tiny");
    let (ok, _, stderr) = framesmith(&["lora", "inspect", &base]);
    assert!(!ok && stderr.contains("not an adapter file"), "{stderr}");
}
