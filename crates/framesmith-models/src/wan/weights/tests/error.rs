//! Every way a path can fail, on small files in temporary folders: the right error, worded with what the file is,
//! what was expected and the fix, and the path last.

use std::path::Path;

use anyhow::Result;
use candle_core::Device;

use crate::wan::weights::testkit::{
    dit_specs, fp8, safetensors_bytes, write, write_sharded, Scales, Spec,
};
use crate::wan::weights::*;
use crate::wan::ModelType;

fn err_of<T>(r: Result<T, ModelFormatError>) -> ModelFormatError {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

/// Asserts the message holds every part and ends with the path.
fn assert_says(e: &ModelFormatError, parts: &[&str], path: &Path) {
    let message = e.to_string();
    for part in parts {
        assert!(message.contains(part), "`{part}` not in: {message}");
    }
    assert!(
        message.ends_with(&format!(": {}", path.display())),
        "path not last: {message}"
    );
}

fn inspect_err(path: &Path) -> ModelFormatError {
    err_of(inspect(path))
}

#[test]
fn missing_empty_and_truncated_files() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let nowhere = dir.path().join("nope.safetensors");
    let e = inspect_err(&nowhere);
    assert!(matches!(e, ModelFormatError::NotFound { .. }));
    assert_says(&e, &["no file or folder", "download"], &nowhere);

    let empty = dir.path().join("empty.safetensors");
    std::fs::write(&empty, b"")?;
    let e = inspect_err(&empty);
    assert!(matches!(e, ModelFormatError::Empty { .. }));
    assert_says(&e, &["empty (0 bytes)", "download it again"], &empty);

    let full = safetensors_bytes(&dit_specs(&WanConfig::tiny(2), "F16"), &[]);
    let cut = dir.path().join("cut.safetensors");
    std::fs::write(&cut, &full[..full.len() - 100])?;
    let e = inspect_err(&cut);
    assert!(matches!(e, ModelFormatError::Truncated { .. }));
    let described = crate::wan::weights::report::group_digits(full.len() as u64);
    let has = crate::wan::weights::report::group_digits(full.len() as u64 - 100);
    let detail = format!("its header describes {described} bytes but the file has {has}");
    assert_says(&e, &["cut short", &detail, "interrupted download"], &cut);
    assert!(matches!(
        err_of(load(&cut, None, &Device::Cpu)),
        ModelFormatError::Truncated { .. }
    ));

    std::fs::write(&cut, &full[..200])?;
    let e = inspect_err(&cut);
    assert_says(&e, &["cut short", "its header alone needs"], &cut);

    let device = Path::new("/dev/null");
    if device.exists() {
        let e = inspect_err(device);
        assert!(matches!(e, ModelFormatError::NotAFile { .. }));
        assert_says(
            &e,
            &["this is a character device, not a model file"],
            device,
        );
    }
    Ok(())
}

#[test]
fn files_that_are_not_safetensors() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cases: [(&str, &[u8], &str); 7] = [
        (
            "model.pth",
            b"PK\x03\x04\x14\x00\x00\x00\x08\x00archive/data.pkl",
            "PyTorch archive (.pth/.pt, zip format)",
        ),
        (
            "old.pth",
            b"\x80\x02\x8a\x0alZ\xfc\x9cF\xf9 j\xa8P\x19.\x80\x02M\xe9\x03.",
            "legacy PyTorch pickle",
        ),
        (
            "wan-Q4_K_M.gguf",
            b"GGUF\x03\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00",
            "GGUF file",
        ),
        (
            "lfs.safetensors",
            b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n",
            "Git LFS pointer",
        ),
        (
            "page.safetensors",
            b"<!DOCTYPE html>\n<html><head><title>Sign in</title>",
            "web page (HTML)",
        ),
        (
            "notes.safetensors",
            b"these are my notes\nsecond line",
            "text file (it starts with \"these are my notes\")",
        ),
        (
            "noise.bin",
            &[0xde, 0xad, 0xbe, 0xef, 0xff, 0xff, 0xff, 0xff, 0x01, 0x02],
            "first bytes are de ad be ef",
        ),
    ];
    for (name, bytes, says) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes)?;
        let e = inspect_err(&path);
        assert!(
            matches!(e, ModelFormatError::NotSafetensors { .. }),
            "{name}: {e}"
        );
        assert_says(&e, &[says], &path);
    }
    Ok(())
}

#[test]
fn header_lengths_past_the_limit_or_the_file_say_so() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let huge = dir.path().join("huge.safetensors");
    let mut bytes = (1u64 << 40).to_le_bytes().to_vec();
    bytes.extend_from_slice(br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#);
    std::fs::write(&huge, &bytes)?;
    let e = inspect_err(&huge);
    assert!(matches!(e, ModelFormatError::BadHeader { .. }), "{e}");
    assert_says(
        &e,
        &[
            "header length field says 1,099,511,627,776 bytes",
            &format!("more than the whole file's {}", bytes.len()),
        ],
        &huge,
    );

    // A header just past the 100 MB limit, in a sparse file that large.
    let big = dir.path().join("big.safetensors");
    let mut file = std::fs::File::create(&big)?;
    let n = 100_000_001u64;
    std::io::Write::write_all(&mut file, &n.to_le_bytes())?;
    std::io::Write::write_all(&mut file, b"{")?;
    file.set_len(8 + n + 16)?;
    drop(file);
    let e = inspect_err(&big);
    assert!(matches!(e, ModelFormatError::BadHeader { .. }), "{e}");
    assert_says(
        &e,
        &["header of 100,000,001 bytes exceeds the limit of 100,000,000 bytes"],
        &big,
    );
    Ok(())
}

#[test]
fn damaged_headers() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bad.safetensors");
    let mut bytes = 9u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{not json");
    std::fs::write(&path, &bytes)?;
    let e = inspect_err(&path);
    assert!(matches!(e, ModelFormatError::BadHeader { .. }));
    assert_says(
        &e,
        &[
            "header is damaged",
            "not valid JSON",
            "download the file again",
        ],
        &path,
    );

    let mut bytes = safetensors_bytes(&[Spec::new("a", "F32", &[2])], &[]);
    bytes.extend_from_slice(&[0; 4]);
    std::fs::write(&path, &bytes)?;
    assert_says(
        &inspect_err(&path),
        &["4 unexplained bytes follow the last tensor"],
        &path,
    );

    let json = br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json);
    bytes.extend_from_slice(&[0; 12]);
    std::fs::write(&path, &bytes)?;
    assert_says(&inspect_err(&path), &["overlap or leave gaps"], &path);
    Ok(())
}

#[test]
fn diffusers_layouts() -> Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("model_index.json"), "{}")?;
    let e = inspect_err(dir.path());
    assert!(matches!(e, ModelFormatError::DiffusersFolder { .. }));
    assert_says(
        &e,
        &["diffusers-format pipeline folder", "without `-Diffusers`"],
        dir.path(),
    );

    let dir = tempfile::tempdir()?;
    std::fs::create_dir(dir.path().join("transformer"))?;
    assert!(matches!(
        inspect_err(dir.path()),
        ModelFormatError::DiffusersFolder { .. }
    ));

    let path = dir
        .path()
        .join("transformer")
        .join("diffusion_pytorch_model.safetensors");
    let specs = [
        Spec::new(
            "condition_embedder.time_embedder.linear_1.weight",
            "BF16",
            &[64, 32],
        ),
        Spec::new("blocks.0.attn1.to_q.weight", "BF16", &[64, 64]),
        Spec::new("patch_embedding.weight", "BF16", &[64, 16, 1, 2, 2]),
    ];
    write(&path, &specs)?;
    let e = inspect_err(&path);
    assert!(matches!(e, ModelFormatError::DiffusersTransformer { .. }));
    assert_says(
        &e,
        &["Wan transformer in diffusers format", "condition_embedder."],
        &path,
    );
    Ok(())
}

#[test]
fn other_models_given_as_the_dit() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cases: [(&[&str], &str); 7] = [
        (
            &[
                "double_blocks.0.img_attn_qkv.weight",
                "txt_in.individual_token_refiner.blocks.0.norm1.weight",
            ],
            "HunyuanVideo",
        ),
        (
            &[
                "double_blocks.0.img_attn.qkv.weight",
                "single_blocks.0.linear1.weight",
                "img_in.weight",
                "guidance_in.in_layer.weight",
            ],
            "FLUX",
        ),
        (
            &[
                "encoder.downsamples.0.residual.0.gamma",
                "decoder.upsamples.0.residual.0.gamma",
                "conv1.weight",
            ],
            "the Wan VAE",
        ),
        (
            &[
                "token_embedding.weight",
                "blocks.0.attn.q.weight",
                "blocks.0.ffn.gate.0.weight",
            ],
            "the umT5 text encoder",
        ),
        (
            &["vision_model.encoder.layers.0.self_attn.q_proj.weight"],
            "a CLIP vision encoder",
        ),
        (
            &[
                "lora_unet_blocks_0_self_attn_q.lora_down.weight",
                "lora_unet_blocks_0_self_attn_q.lora_up.weight",
            ],
            "a LoRA adapter",
        ),
        (
            &["diffusion_model.blocks.0.self_attn.q.lora_A.weight"],
            "a LoRA adapter",
        ),
    ];
    for (i, (names, says)) in cases.into_iter().enumerate() {
        let specs: Vec<Spec> = names.iter().map(|n| Spec::new(n, "F16", &[4, 4])).collect();
        let path = write(&dir.path().join(format!("m{i}.safetensors")), &specs)?;
        let e = inspect_err(&path);
        assert!(matches!(e, ModelFormatError::NotTheDit { .. }), "{e}");
        assert_says(
            &e,
            &[
                &format!("this is {says}"),
                "not a Wan diffusion transformer (DiT)",
            ],
            &path,
        );
    }
    let path = write(
        &dir.path().join("x.safetensors"),
        &[Spec::new("foo.weight", "F16", &[4])],
    )?;
    let e = inspect_err(&path);
    assert!(matches!(e, ModelFormatError::UnknownModel { .. }));
    assert_says(&e, &["no `patch_embedding.weight`", "`foo.weight`"], &path);
    Ok(())
}

#[test]
fn i2v_and_t2v_swapped() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let t2v = WanConfig::tiny(2);
    let mut i2v = t2v.clone();
    (i2v.model_type, i2v.in_dim, i2v.clip_dim) = (ModelType::I2v, 36, 32);
    let i2v_path = write(&dir.path().join("i2v.safetensors"), &dit_specs(&i2v, "F16"))?;
    let t2v_path = write(&dir.path().join("t2v.safetensors"), &dit_specs(&t2v, "F16"))?;

    let e = err_of(load(&i2v_path, Some(&t2v), &Device::Cpu));
    assert!(matches!(e, ModelFormatError::WrongTask { .. }));
    assert_says(
        &e,
        &[
            "this is custom Wan2.1 I2V DiT",
            "but custom Wan2.1 T2V DiT (dim 64, 2 layers) was asked for",
            "image-to-video",
        ],
        &i2v_path,
    );
    let e = err_of(load(&t2v_path, Some(&i2v), &Device::Cpu));
    assert_says(
        &e,
        &["this is custom Wan2.1 T2V DiT", "text-to-video (T2V)"],
        &t2v_path,
    );

    let e = err_of(load(&t2v_path, Some(&WanConfig::tiny(3)), &Device::Cpu));
    assert!(matches!(e, ModelFormatError::WrongVariant { .. }));
    assert_says(
        &e,
        &["but custom Wan2.1 T2V DiT (dim 64, 3 layers) was asked for"],
        &t2v_path,
    );
    Ok(())
}

#[test]
fn missing_shards_and_bad_index() -> Result<()> {
    let specs = dit_specs(&WanConfig::tiny(2), "F16");
    for indexed in [true, false] {
        let dir = tempfile::tempdir()?;
        let shards = write_sharded(dir.path(), &specs, 3, indexed)?;
        std::fs::remove_file(&shards[1])?;
        let e = inspect_err(dir.path());
        assert!(matches!(e, ModelFormatError::MissingShard { .. }), "{e}");
        assert_says(
            &e,
            &["`diffusion_pytorch_model-00002-of-00003.safetensors` is missing"],
            dir.path(),
        );
    }
    let dir = tempfile::tempdir()?;
    let shards = write_sharded(dir.path(), &specs, 2, true)?;
    write(&shards[0], &specs[..3])?;
    let e = inspect_err(dir.path());
    assert!(matches!(e, ModelFormatError::BadIndex { .. }));
    let index = dir
        .path()
        .join("diffusion_pytorch_model.safetensors.index.json");
    assert_says(
        &e,
        &["shard index is damaged", "which does not hold it"],
        &index,
    );

    std::fs::write(
        &index,
        r#"{"weight_map": {"a": "../elsewhere.safetensors"}}"#,
    )?;
    assert_says(&inspect_err(dir.path()), &["not a plain file name"], &index);
    Ok(())
}

#[test]
fn folders_without_one_checkpoint() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let e = inspect_err(dir.path());
    assert!(matches!(e, ModelFormatError::NoWeights { .. }));
    std::fs::write(dir.path().join("Wan2.1_VAE.pth"), b"PK\x03\x04")?;
    assert_says(
        &inspect_err(dir.path()),
        &["no .safetensors weights (it has Wan2.1_VAE.pth)"],
        dir.path(),
    );

    let specs = dit_specs(&WanConfig::tiny(1), "F16");
    write(&dir.path().join("a.safetensors"), &specs)?;
    write(&dir.path().join("b.safetensors"), &specs)?;
    let e = inspect_err(dir.path());
    assert!(matches!(e, ModelFormatError::SeveralCheckpoints { .. }));
    assert_says(
        &e,
        &["several separate checkpoints (a.safetensors, b.safetensors)"],
        dir.path(),
    );

    let dir = tempfile::tempdir()?;
    std::fs::create_dir(dir.path().join("high_noise_model"))?;
    std::fs::create_dir(dir.path().join("low_noise_model"))?;
    let e = inspect_err(dir.path());
    assert!(matches!(e, ModelFormatError::TwoExperts { .. }));
    assert_says(&e, &["two experts", "pass one expert's folder"], dir.path());
    Ok(())
}

#[test]
fn incomplete_checkpoint() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut specs = dit_specs(&WanConfig::tiny(2), "F16");
    specs.retain(|s| s.name != "blocks.1.ffn.2.weight");
    let path = write(&dir.path().join("partial.safetensors"), &specs)?;
    let e = inspect_err(&path);
    assert!(matches!(e, ModelFormatError::Incomplete { .. }));
    assert_says(
        &e,
        &["incomplete or damaged", "`blocks.1.ffn.2.weight`"],
        &path,
    );
    Ok(())
}

#[test]
fn e5m2_weights_load_widened_to_f16_exactly() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let to_e5m2 = |specs: Vec<Spec>| -> Vec<Spec> {
        specs
            .into_iter()
            .map(|s| {
                if s.dtype == "F8_E4M3" {
                    Spec {
                        dtype: "F8_E5M2",
                        ..s
                    }
                } else {
                    s
                }
            })
            .collect()
    };
    let specs = to_e5m2(fp8(&dit_specs(&WanConfig::tiny(2), "F16"), Scales::None));
    let path = write(&dir.path().join("e5m2.safetensors"), &specs)?;
    let report = inspect(&path)?;
    assert!(report.notes.iter().any(|n| n.contains("float8_e5m2")));
    let loaded = load(&path, None, &Device::Cpu)?;
    let name = "blocks.0.ffn.0.weight";
    let got = loaded.tensors.get(name).expect("the e5m2 weight loads");
    assert_eq!(got.dtype(), candle_core::DType::F16);
    // Every stored byte b is the f16 with bits b << 8.
    let bytes = std::fs::read(&path)?;
    let header_len = u64::from_le_bytes(bytes[..8].try_into()?) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len])?;
    let offsets = &header[name]["data_offsets"];
    let (start, end) = (
        8 + header_len + offsets[0].as_u64().unwrap_or(0) as usize,
        8 + header_len + offsets[1].as_u64().unwrap_or(0) as usize,
    );
    let want: Vec<f32> = bytes[start..end]
        .iter()
        .map(|&b| half::f16::from_bits(u16::from(b) << 8).to_f32())
        .collect();
    assert!(!want.is_empty());
    let got: Vec<f32> = got
        .flatten_all()?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1()?;
    let same = |a: f32, b: f32| a == b || (a.is_nan() && b.is_nan());
    assert!(got.len() == want.len() && got.iter().zip(&want).all(|(a, b)| same(*a, *b)));

    // With scale tensors beside them, e5m2 weights would lose their scales: refused, saying why.
    let scaled = to_e5m2(fp8(
        &dit_specs(&WanConfig::tiny(2), "F16"),
        Scales::ComfyTensor,
    ));
    let path = write(&dir.path().join("e5m2-scaled.safetensors"), &scaled)?;
    let e = err_of(load(&path, None, &Device::Cpu));
    assert!(matches!(e, ModelFormatError::UnsupportedDtype { .. }));
    assert_says(
        &e,
        &["float8_e5m2 with scale tensors", "float8_e4m3fn"],
        &path,
    );
    Ok(())
}
