//! Layout detection and loading, on tiny checkpoints written into temporary folders, and on the official fixtures.

mod error;
mod fuzz;
mod reading;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};

use super::testkit::{
    dit_specs, fp8, prefixed, scratch_dir, value_at, write, write_sharded, Scales, Spec,
};
use super::*;
use crate::wan::{Generation, ModelType};

fn tiny_i2v() -> WanConfig {
    let mut cfg = WanConfig::tiny(2);
    cfg.model_type = ModelType::I2v;
    cfg.in_dim = 36;
    cfg.clip_dim = 32;
    cfg
}

#[test]
fn official_single_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = WanConfig::tiny(2);
    let path = write(
        &dir.path().join("diffusion_pytorch_model.safetensors"),
        &dit_specs(&cfg, "BF16"),
    )?;
    for given in [path.as_path(), dir.path()] {
        let report = inspect(given)?;
        assert_eq!(report.layout, Layout::SingleFile);
        assert_eq!(report.key_prefix, None);
        assert_eq!(
            report.variants,
            vec!["custom Wan2.1 T2V DiT (dim 64, 2 layers)".to_string()]
        );
        assert_eq!(report.config.num_heads, 2);
        assert_eq!(report.heads_source, HeadsSource::Rule);
        assert_eq!(report.parameter_count, cfg.parameter_count());
        assert_eq!(report.tensor_count, official_shapes(&cfg).len());
        assert_eq!(report.dtypes.get("BF16"), Some(&report.tensor_count));
        assert_eq!(report.fp8, None);
        assert_eq!(report.bytes_on_disk, std::fs::metadata(&path)?.len());
        let text = report.to_string();
        assert!(
            text.starts_with("custom Wan2.1 T2V DiT (dim 64, 2 layers)\n"),
            "{text}"
        );
        assert!(text.contains("single file, official key names"), "{text}");
        assert!(text.contains("dim 64, 2 layers, 2 heads of 32"), "{text}");
        assert!(text.ends_with(&given.display().to_string()), "{text}");
    }
    Ok(())
}

#[test]
fn official_shards_with_and_without_index() -> Result<()> {
    let cfg = WanConfig::tiny(2);
    let specs = dit_specs(&cfg, "F32");
    for indexed in [true, false] {
        let dir = tempfile::tempdir()?;
        let shards = write_sharded(dir.path(), &specs, 3, indexed)?;
        let report = inspect(dir.path())?;
        assert_eq!(report.layout, Layout::Sharded { shards: 3, indexed });
        assert_eq!(report.files, shards);
        assert_eq!(report.parameter_count, cfg.parameter_count());
        assert!(report.layout_label().contains("3 files"));
        // One shard given: the whole set is read.
        let from_shard = inspect(&shards[1])?;
        assert_eq!(from_shard.layout, Layout::Sharded { shards: 3, indexed });
        assert!(from_shard.notes.iter().any(|n| n.contains("single shard")));
    }
    Ok(())
}

#[test]
fn index_file_given_directly() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_sharded(dir.path(), &dit_specs(&WanConfig::tiny(2), "F16"), 2, true)?;
    let report = inspect(
        &dir.path()
            .join("diffusion_pytorch_model.safetensors.index.json"),
    )?;
    assert_eq!(
        report.layout,
        Layout::Sharded {
            shards: 2,
            indexed: true
        }
    );
    Ok(())
}

#[test]
fn loads_sharded_tensors_under_official_names() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = WanConfig::tiny(2);
    write_sharded(dir.path(), &dit_specs(&cfg, "F32"), 3, true)?;
    let loaded = load(dir.path(), Some(&cfg), &Device::Cpu)?;
    assert_eq!(loaded.config, cfg);
    assert_eq!(loaded.tensors.len(), official_shapes(&cfg).len());
    for (name, shape) in official_shapes(&cfg) {
        let t = loaded
            .tensors
            .get(&name)
            .with_context(|| format!("missing {name}"))?;
        assert_eq!(t.dims(), shape.as_slice(), "{name}");
    }
    let bias = loaded
        .tensors
        .get("blocks.1.ffn.0.bias")
        .context("bias")?
        .to_vec1::<f32>()?;
    let expected: Vec<f32> = (0..bias.len()).map(value_at).collect();
    assert_eq!(bias, expected);
    Ok(())
}

#[test]
fn comfyui_prefixed_file_with_bundled_vae() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = WanConfig::tiny(2);
    let mut specs = prefixed(&dit_specs(&cfg, "F16"), "model.diffusion_model.");
    specs.push(Spec::new(
        "first_stage_model.decoder.conv1.weight",
        "F16",
        &[4, 4],
    ));
    let path = write(&dir.path().join("wan_tiny_comfy.safetensors"), &specs)?;
    let report = inspect(&path)?;
    assert_eq!(report.key_prefix.as_deref(), Some("model.diffusion_model."));
    assert!(report.layout_label().starts_with("ComfyUI single file"));
    assert!(
        report.notes.iter().any(|n| n.contains("1 tensors outside")),
        "{:?}",
        report.notes
    );
    let loaded = load(&path, None, &Device::Cpu)?;
    assert!(loaded.tensors.contains_key("head.modulation"));
    assert!(!loaded
        .tensors
        .keys()
        .any(|k| k.starts_with("model.") || k.starts_with("first_stage")));
    // Without the `model.` part too.
    let path = write(
        &dir.path().join("b.safetensors"),
        &prefixed(&dit_specs(&cfg, "F16"), "diffusion_model."),
    )?;
    assert_eq!(
        inspect(&path)?.key_prefix.as_deref(),
        Some("diffusion_model.")
    );
    Ok(())
}

#[test]
fn comfyui_scaled_fp8_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = WanConfig::tiny(2);
    let specs = prefixed(
        &fp8(&dit_specs(&cfg, "BF16"), Scales::ComfyTensor),
        "model.diffusion_model.",
    );
    let path = write(&dir.path().join("tiny_fp8_scaled.safetensors"), &specs)?;
    let report = inspect(&path)?;
    let info = report.fp8.clone().context("fp8 info")?;
    assert_eq!(info.naming, ScaleNaming::ComfyScaledFp8);
    assert_eq!(info.format, "float8_e4m3fn");
    let fp8_weights = 2 * (8 + 2);
    assert_eq!(info.weights, fp8_weights);
    assert_eq!(info.scaling.get(&Fp8Scaling::Tensor), Some(&fp8_weights));
    assert_eq!(report.parameter_count, cfg.parameter_count());
    assert_eq!(
        report.layout_label(),
        "ComfyUI scaled_fp8 single file (keys prefixed `model.diffusion_model.`)"
    );
    assert!(
        report
            .to_string()
            .contains("float8_e4m3fn: per-tensor scales on 20 weights"),
        "{report}"
    );
    let loaded = load(&path, Some(&cfg), &Device::Cpu)?;
    let q = loaded
        .tensors
        .get("blocks.0.self_attn.q.weight")
        .context("q")?;
    assert_eq!(q.dtype(), DType::F8E4M3);
    let scale = loaded
        .tensors
        .get("blocks.0.self_attn.q.scale_weight")
        .context("scale")?;
    assert_eq!(scale.dims(), &[] as &[usize]);
    assert!(!loaded.tensors.contains_key("scaled_fp8"));
    Ok(())
}

#[test]
fn fp8_channel_and_block_scales() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = WanConfig::tiny(2);
    let path = write(
        &dir.path().join("c.safetensors"),
        &fp8(&dit_specs(&cfg, "BF16"), Scales::ChannelWeightScale),
    )?;
    let info = inspect(&path)?.fp8.context("fp8")?;
    assert_eq!(info.naming, ScaleNaming::WeightScale);
    assert_eq!(
        info.scaling.keys().copied().collect::<Vec<_>>(),
        vec![Fp8Scaling::Channel]
    );
    let loaded = load(&path, None, &Device::Cpu)?;
    assert_eq!(
        loaded
            .tensors
            .get("blocks.1.ffn.2.scale_weight")
            .context("scale")?
            .dims(),
        &[64, 1]
    );
    assert!(!loaded.tensors.keys().any(|k| k.ends_with(".weight_scale")));

    let path = write(
        &dir.path().join("b.safetensors"),
        &fp8(&dit_specs(&cfg, "BF16"), Scales::Block(32)),
    )?;
    let report = inspect(&path)?;
    let info = report.fp8.clone().context("fp8")?;
    assert_eq!(info.naming, ScaleNaming::ScaleWeight);
    assert_eq!(
        info.scaling.keys().copied().collect::<Vec<_>>(),
        vec![Fp8Scaling::Block { size: 32 }]
    );
    assert!(report.to_string().contains("blocks of 32 inputs"));

    let path = write(
        &dir.path().join("u.safetensors"),
        &fp8(&dit_specs(&cfg, "BF16"), Scales::None),
    )?;
    let info = inspect(&path)?.fp8.context("fp8")?;
    assert_eq!(
        (info.naming, info.scaling.keys().next().copied()),
        (ScaleNaming::None, Some(Fp8Scaling::Unscaled))
    );
    Ok(())
}

#[test]
fn detects_task_from_shapes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let i2v = tiny_i2v();
    let path = write(&dir.path().join("i2v.safetensors"), &dit_specs(&i2v, "F16"))?;
    let report = inspect(&path)?;
    assert_eq!(
        (report.config.model_type, report.config.generation),
        (ModelType::I2v, Generation::Wan21)
    );
    assert_eq!((report.config.in_dim, report.config.clip_dim), (36, 32));

    let mut expert = WanConfig::tiny(2);
    (expert.model_type, expert.generation, expert.in_dim) = (ModelType::I2v, Generation::Wan22, 36);
    let path = write(
        &dir.path().join("expert.safetensors"),
        &dit_specs(&expert, "F16"),
    )?;
    let c = inspect(&path)?.config;
    assert_eq!(
        (c.model_type, c.generation, c.has_clip()),
        (ModelType::I2v, Generation::Wan22, false)
    );

    let mut ti2v = WanConfig::tiny(2);
    (ti2v.model_type, ti2v.generation, ti2v.in_dim, ti2v.out_dim) =
        (ModelType::Ti2v, Generation::Wan22, 48, 48);
    let path = write(
        &dir.path().join("ti2v.safetensors"),
        &dit_specs(&ti2v, "F16"),
    )?;
    let c = inspect(&path)?.config;
    assert_eq!(
        (c.model_type, c.generation, c.out_dim),
        (ModelType::Ti2v, Generation::Wan22, 48)
    );
    Ok(())
}

#[test]
fn names_and_config_json_decide_what_shapes_cannot() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let specs = dit_specs(&WanConfig::tiny(2), "F16");
    let path = write(
        &dir.path().join("wan2.2_t2v_low_noise_tiny.safetensors"),
        &specs,
    )?;
    let report = inspect(&path)?;
    assert_eq!(report.config.generation, Generation::Wan22);
    assert_eq!(report.expert, Some(Expert::LowNoise));

    let sub = dir.path().join("with_config");
    std::fs::create_dir(&sub)?;
    write(&sub.join("diffusion_pytorch_model.safetensors"), &specs)?;
    let json = r#"{"_class_name":"WanModel","dim":64,"eps":1e-05,"ffn_dim":128,"freq_dim":32,"in_dim":16,
        "model_type":"t2v","num_heads":4,"num_layers":2,"out_dim":16,"text_dim":32,"text_len":16}"#;
    std::fs::write(sub.join("config.json"), json)?;
    let report = inspect(&sub)?;
    assert_eq!(report.heads_source, HeadsSource::ConfigJson);
    assert_eq!(
        (
            report.config.num_heads,
            report.config.text_len,
            report.config.eps
        ),
        (4, 16, 1e-5)
    );
    assert!(report
        .to_string()
        .contains("4 heads of 16 (from config.json)"));

    std::fs::write(
        sub.join("config.json"),
        json.replace("\"dim\":64", "\"dim\":128"),
    )?;
    let report = inspect(&sub)?;
    assert_eq!(report.heads_source, HeadsSource::Rule);
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("describes another model")),
        "{:?}",
        report.notes
    );
    Ok(())
}

#[test]
fn expected_variant_supplies_what_weights_cannot_record() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = WanConfig::tiny(2);
    let path = write(&dir.path().join("t.safetensors"), &dit_specs(&cfg, "F16"))?;
    let mut expected = cfg.clone();
    expected.generation = Generation::Wan22;
    expected.text_len = 7;
    let loaded = load(&path, Some(&expected), &Device::Cpu)?;
    assert_eq!(loaded.config, expected);
    assert_eq!(loaded.report.config.text_len, 512);
    Ok(())
}

#[test]
fn unused_extra_tensors_are_noted() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut specs = dit_specs(&WanConfig::tiny(2), "F16");
    specs.push(Spec::new(
        "vace_blocks.0.before_proj.weight",
        "F16",
        &[64, 64],
    ));
    let report = inspect(&write(&dir.path().join("v.safetensors"), &specs)?)?;
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("vace_blocks.0.before_proj.weight")),
        "{:?}",
        report.notes
    );
    Ok(())
}

fn fixture_dir() -> std::path::PathBuf {
    crate::fixtures::family_dir("wan")
}

#[test]
fn detects_the_official_fixtures() -> Result<()> {
    let root = fixture_dir();
    if !root.is_dir() {
        println!("skipped: no fixtures at {}", root.display());
        return Ok(());
    }
    let mut checked = 0;
    for entry in std::fs::read_dir(root)? {
        let case = entry?.path();
        let config: serde_json::Value = match std::fs::read_to_string(case.join("config.json")) {
            Ok(text) => serde_json::from_str(&text)?,
            Err(_) => continue,
        };
        if config["kind"] != "wan_dit" {
            continue;
        }
        let init = &config["init"];
        let weights = case.join("weights.safetensors");
        let loaded = load(&weights, None, &Device::Cpu)?;
        let c = &loaded.config;
        assert_eq!(
            Some(c.dim as u64),
            init["dim"].as_u64(),
            "{}",
            case.display()
        );
        assert_eq!(Some(c.num_layers as u64), init["num_layers"].as_u64());
        assert_eq!(Some(c.num_heads as u64), init["num_heads"].as_u64());
        assert_eq!(Some(c.in_dim as u64), init["in_dim"].as_u64());
        assert_eq!(Some(c.out_dim as u64), init["out_dim"].as_u64());
        assert_eq!(Some(c.text_len as u64), init["text_len"].as_u64());
        let model_type = serde_json::to_value(c.model_type)?;
        assert_eq!(model_type, init["model_type"], "{}", case.display());
        let wan22 = config["source"]
            .as_str()
            .unwrap_or_default()
            .contains("Wan2.2");
        assert_eq!(c.generation == Generation::Wan22, wan22);
        assert_eq!(loaded.tensors.len(), official_shapes(c).len());
        checked += 1;
    }
    if checked < 3 {
        bail!("expected 3 wan_dit fixtures, found {checked}");
    }
    Ok(())
}

/// Header inspection and load speed on a 1.3B-wide, 4-block bf16 file (about 390 MB). Prints, asserts nothing
/// about time. Run: `cargo test --lib models::wan::weights::tests::load_throughput -- --ignored --nocapture`
#[test]
#[ignore]
fn load_throughput() -> Result<()> {
    let mut cfg = WanConfig::wan21_t2v_1_3b();
    cfg.num_layers = 4;
    let dir = scratch_dir()?;
    let path = write(
        &dir.path().join("wide.safetensors"),
        &dit_specs(&cfg, "BF16"),
    )?;
    let bytes = std::fs::metadata(&path)?.len() as f64;
    let start = std::time::Instant::now();
    let report = inspect(&path)?;
    let inspect_secs = start.elapsed().as_secs_f64();
    let start = std::time::Instant::now();
    let loaded = load(&path, None, &Device::Cpu)?;
    let load_secs = start.elapsed().as_secs_f64();
    assert_eq!(loaded.tensors.len(), report.tensor_count);
    println!(
        "{:.0} MB, {} tensors: inspect {:.2} ms, load {:.3} s ({:.2} GB/s)",
        bytes / 1e6,
        report.tensor_count,
        inspect_secs * 1e3,
        load_secs,
        bytes / load_secs / 1e9
    );
    Ok(())
}
