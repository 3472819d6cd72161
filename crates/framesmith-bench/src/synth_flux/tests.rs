//! `framesmith-bench synth-project --model flux-dev` on a tiny FLUX.1 [dev]: the random DiT is read back as a dev
//! DiT of those sizes in each layout (official bf16, plain FP8, ComfyUI scaled FP8), the caches have the FLUX.1
//! autoencoder's and text encoders' shapes, the run config validates with a CUDA device, and the project trains on
//! the CPU through the engine from the caches alone, with a bf16 and with an FP8 base.

use super::{flux_latent_shape, write_flux_project, FluxDitFormat, FluxSynthProject};
use crate::synth::testkit::train;
use candle_core::{DType, Device, Tensor};
use framesmith_config::run::{BaseDtype, BlocksToSwap, DeviceSpec};
use framesmith_config::{validate, HostInfo, RunConfig};
use framesmith_data::family::flux::cache::{read_flux_latent_cache, read_flux_text_cache};
use framesmith_models::flux::weights::{
    axes_for_head_dim, identify, open, FluxComponent, FluxKind, FluxVariant, Fp8Storage,
};
use framesmith_models::flux::FluxConfig;
use framesmith_nn::vb::TensorSource;

fn tiny_cfg() -> FluxConfig {
    FluxConfig {
        vec_in_dim: 24,
        context_in_dim: 40,
        hidden_size: 32,
        num_heads: 2,
        depth: 2,
        depth_single_blocks: 2,
        axes_dim: axes_for_head_dim(16),
        ..FluxConfig::dev()
    }
}

fn tiny(height: usize, width: usize, dit: FluxDitFormat) -> FluxSynthProject {
    FluxSynthProject {
        cfg: tiny_cfg(),
        height,
        width,
        dit,
        seed: 5,
        text_tokens: 7,
        steps: 2,
        rank: 4,
        kontext: false,
    }
}

#[test]
fn latents_follow_the_flux_autoencoder_and_bad_sizes_are_refused() {
    let real = FluxSynthProject {
        cfg: FluxConfig::dev(),
        ..tiny(1024, 1024, FluxDitFormat::Dense(DType::BF16))
    };
    assert_eq!(flux_latent_shape(&real).unwrap(), [16, 1, 128, 128]);
    let wide = tiny(512, 768, FluxDitFormat::Dense(DType::BF16));
    assert_eq!(flux_latent_shape(&wide).unwrap(), [16, 1, 64, 96]);
    for (h, w) in [(1000, 1024), (1024, 8), (0, 1024)] {
        let err = flux_latent_shape(&tiny(h, w, FluxDitFormat::Dense(DType::BF16)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("multiples of 16"), "{h}x{w}: {err}");
    }
    let fill = FluxSynthProject {
        cfg: FluxConfig {
            in_channels: 384,
            ..tiny_cfg()
        },
        ..tiny(64, 64, FluxDitFormat::Dense(DType::BF16))
    };
    assert!(flux_latent_shape(&fill).is_err());
    assert!(FluxDitFormat::parse("int4").is_err());
}

#[test]
fn the_project_is_a_dev_dit_with_flux_caches_and_trains_from_them() {
    let dir = tempfile::tempdir().unwrap();
    let spec = tiny(48, 64, FluxDitFormat::Dense(DType::BF16));
    let files = write_flux_project(dir.path(), &spec).unwrap();
    assert!(files.dit.ends_with("flux1-dev.safetensors"));

    let file = identify(&files.dit).unwrap();
    match &file.kind {
        FluxKind::Dit { variant, config } => {
            assert_eq!(*variant, FluxVariant::Dev);
            assert_eq!(config, &spec.cfg);
        }
        other => panic!("not a DiT: {other:?}"),
    }
    assert_eq!((file.prefix, file.fp8), (None, None));
    assert_eq!(file.dtypes.keys().collect::<Vec<_>>(), ["BF16"]);
    let opened = open(&files.dit, FluxComponent::Dit, Some(FluxVariant::Dev)).unwrap();
    let w = opened
        .tensors
        .read("single_blocks.1.linear2.weight")
        .unwrap()
        .expect("the tensor")
        .to_dtype(DType::F32)
        .unwrap();
    let rms = w
        .sqr()
        .unwrap()
        .mean_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
        .sqrt();
    let fan_in = spec.cfg.hidden_size + spec.cfg.mlp_hidden_dim();
    let expected = 1.0 / (fan_in as f32).sqrt();
    assert!(
        (rms / expected - 1.0).abs() < 0.15,
        "rms {rms}, expected {expected}"
    );

    let latents = read_flux_latent_cache(&files.latents, &Device::Cpu).unwrap();
    assert_eq!(latents.dims(), [16, 1, 6, 8]);
    let text = read_flux_text_cache(&files.text, &Device::Cpu).unwrap();
    assert_eq!(text.t5.dims(), [7, spec.cfg.context_in_dim]);
    assert_eq!(text.clip_l_pooler.dims(), [spec.cfg.vec_in_dim]);

    // The grey stand-in image and its caption make the dataset check clean, as a real image would.
    assert!(dir.path().join("images/synth_000.png").exists());
    let options = framesmith_data::ScanOptions::locate();
    let report = framesmith_data::check_path(&files.dataset, &options).unwrap();
    assert!(report.is_ok(), "{report}");

    let mut config = RunConfig::load(&files.run).unwrap();
    assert_eq!(config.training.device, DeviceSpec::Cuda(0));
    assert_eq!(config.memory.blocks_to_swap, BlocksToSwap::Count(0));
    assert_eq!((config.lora.rank, config.lora.alpha), (4, 4.0));
    assert_eq!(config.model.base_dtype, BaseDtype::Bf16);
    validate(&config, &HostInfo::new(1)).unwrap_or_else(|e| panic!("{e}"));
    config.training.device = DeviceSpec::Cpu;
    assert_eq!(train(config), (2, true));
}

/// The f32 view of the tensor `name` of a DiT file, FP8 codes times their `scale_weight` where there is one.
fn weight(path: &std::path::Path, name: &str) -> Tensor {
    let opened = open(path, FluxComponent::Dit, Some(FluxVariant::Dev)).unwrap();
    let t = opened.tensors.read(name).unwrap().expect("the tensor");
    let scale_name = format!("{}.scale_weight", name.trim_end_matches(".weight"));
    let t = t.to_dtype(DType::F32).unwrap();
    match opened.tensors.read(&scale_name).unwrap() {
        Some(scale) => {
            let s = scale
                .to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()[0];
            t.affine(s as f64, 0.0).unwrap()
        }
        None => t,
    }
}

fn rms(t: &Tensor) -> f32 {
    t.sqr()
        .unwrap()
        .mean_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
        .sqrt()
}

/// `--dtype fp8` and `fp8-scaled` write the layouts people have FP8 FLUX.1 files in: identify reads each, the
/// weights are the bf16 file's draws within FP8 rounding, and the FP8 project trains with an FP8 base.
#[test]
fn fp8_files_hold_the_same_weights_and_train_with_an_fp8_base() {
    let dense_dir = tempfile::tempdir().unwrap();
    let dense = write_flux_project(
        dense_dir.path(),
        &tiny(32, 32, FluxDitFormat::Dense(DType::BF16)),
    )
    .unwrap();
    for (format, storage, prefix, tol) in [
        (
            FluxDitFormat::ComfyScaledFp8,
            Fp8Storage::Scaled,
            Some("model.diffusion_model."),
            0.06,
        ),
        // Unscaled e4m3 holds weights of a tiny model's fan-in (std ~0.18) with 3 mantissa bits too.
        (FluxDitFormat::Fp8, Fp8Storage::Plain, None, 0.1),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let files = write_flux_project(dir.path(), &tiny(32, 32, format)).unwrap();
        assert!(files.dit.ends_with(format.file_name()));
        assert!(files.dit_bytes < dense.dit_bytes, "{format:?}");
        let file = identify(&files.dit).unwrap();
        assert_eq!(
            (file.fp8, file.prefix),
            (Some(storage), prefix),
            "{format:?}"
        );
        assert!(matches!(
            file.kind,
            FluxKind::Dit {
                variant: FluxVariant::Dev,
                ..
            }
        ));
        for name in [
            "double_blocks.0.img_mlp.0.weight",
            "single_blocks.1.linear1.weight",
        ] {
            let want = weight(&dense.dit, name);
            let got = weight(&files.dit, name);
            let err = rms(&(got - &want).unwrap());
            assert!(
                err < tol * rms(&want),
                "{format:?} {name}: rms error {err} of {}",
                rms(&want)
            );
        }
        // Outside the blocks' linears the weights stay bf16, the same values.
        let opened = open(&files.dit, FluxComponent::Dit, Some(FluxVariant::Dev)).unwrap();
        let img_in = opened
            .tensors
            .read("img_in.weight")
            .unwrap()
            .expect("img_in");
        assert_eq!(img_in.dtype(), DType::BF16);
        assert_eq!(
            rms(
                &(weight(&files.dit, "img_in.weight") - weight(&dense.dit, "img_in.weight"))
                    .unwrap()
            ),
            0.0
        );

        let mut config = RunConfig::load(&files.run).unwrap();
        assert_eq!(config.model.base_dtype, BaseDtype::Fp8);
        validate(&config, &HostInfo::new(1)).unwrap_or_else(|e| panic!("{e}"));
        config.training.device = DeviceSpec::Cpu;
        assert_eq!(train(config), (2, true), "{format:?}");
    }
}

/// `--controls 1` writes a FLUX.1 Kontext [dev] project: the DiT is named (and so read) as Kontext's, the image is
/// cached with one control image of its size, and the project trains an edit LoRA on the CPU.
#[test]
fn a_kontext_project_caches_a_control_image_and_trains() {
    let dir = tempfile::tempdir().unwrap();
    let spec = FluxSynthProject {
        kontext: true,
        ..tiny(48, 64, FluxDitFormat::Dense(DType::BF16))
    };
    let files = write_flux_project(dir.path(), &spec).unwrap();
    assert!(files.dit.ends_with("flux1-kontext-dev.safetensors"));
    match identify(&files.dit).unwrap().kind {
        FluxKind::Dit { variant, .. } => assert_eq!(variant, FluxVariant::Kontext),
        other => panic!("{other:?}"),
    }
    let (latents, controls) = framesmith_data::family::flux::cache::FLUX_CACHES
        .read_latent_cache_with_controls(&files.latents, &Device::Cpu)
        .unwrap();
    assert_eq!(controls.len(), 1);
    assert_eq!(controls[0].dims(), latents.dims());
    let mut config = RunConfig::load(&files.run).unwrap();
    config.training.device = DeviceSpec::Cpu;
    assert_eq!(train(config), (2, true));
}
