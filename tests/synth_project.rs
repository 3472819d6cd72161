//! `framesmith-bench synth-project` on a tiny model: the random DiT is read back as that model, the caches have the
//! Wan VAE's and umT5's shapes, the run config passes validation with a CUDA device, and the project trains on
//! the CPU through the engine from the caches alone.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::time::Duration;

use candle_core::{DType, Device};
use framesmith_bench::synth::{latent_shape, write_project, DitFormat, SynthProject};
use framesmith_config::protocol::{Command, Event, RunState, StartRun};
use framesmith_config::run::{BlocksToSwap, DeviceSpec};
use framesmith_config::{validate, HostInfo, RunConfig};
use framesmith_data::cache::{read_wan_latent_cache, read_wan_text_cache, text_cache_name};
use framesmith_models::wan::WanConfig;

/// Generous: only reached when the engine is stuck.
const EVENT_TIMEOUT: Duration = Duration::from_secs(120);

fn tiny(frames: usize, height: usize, width: usize) -> SynthProject {
    SynthProject {
        cfg: framesmith_engine::family::wan::demo_setup::demo_model_config(),
        frames,
        height,
        width,
        dit: DitFormat::Dense(DType::BF16),
        seed: 7,
        text_tokens: 8,
        steps: 2,
        encoders: None,
    }
}

#[test]
fn latent_shapes_follow_the_wan_vae_and_bad_sizes_are_refused() {
    let real = SynthProject {
        cfg: WanConfig::wan21_t2v_1_3b(),
        ..tiny(81, 480, 832)
    };
    assert_eq!(latent_shape(&real).unwrap(), [16, 21, 60, 104]);
    for (f, h, w) in [(80, 480, 832), (81, 484, 832), (81, 480, 0)] {
        assert!(latent_shape(&tiny(f, h, w)).is_err(), "{f}x{h}x{w}");
    }
    // TI2V-5B's Wan2.2 VAE: 16× in space, so sides are multiples of 32 with the 2×2 patches.
    let ti2v = |f, h, w| SynthProject {
        cfg: WanConfig::wan22_ti2v_5b(),
        ..tiny(f, h, w)
    };
    assert_eq!(
        latent_shape(&ti2v(121, 704, 1280)).unwrap(),
        [48, 31, 44, 80]
    );
    assert!(latent_shape(&ti2v(81, 480, 848)).is_err());
}

/// Without `--encoders` an image-to-video model gets a cache of random image conditioning laid out as the official
/// code makes it (mask ones on the first latent frame, image latents there and zeros after, CLIP features for
/// Wan2.1), and trains from it on the CPU.
#[test]
fn an_image_to_video_project_caches_random_conditioning_and_trains() {
    let base = WanConfig::tiny(2);
    let cfg = WanConfig {
        model_type: framesmith_models::wan::ModelType::I2v,
        in_dim: 2 * base.out_dim + 4,
        clip_dim: 24,
        clip_tokens: 5,
        ..base
    };
    let spec = SynthProject {
        cfg: cfg.clone(),
        ..tiny(9, 32, 48)
    };
    let dir = tempfile::tempdir().unwrap();
    let files = write_project(dir.path(), &spec).unwrap();
    let report = framesmith_models::wan::weights::inspect(&files.dit).unwrap();
    assert!(report.config.has_clip(), "{:?}", report.config);
    let (cache, _) = read_wan_latent_cache(&files.latents, &Device::Cpu).unwrap();
    let c = cfg.out_dim;
    assert_eq!(cache.latents.dims(), [c, 3, 4, 6]);
    let y = cache.latents_image.expect("image conditioning");
    assert_eq!(y.dims(), [4 + c, 3, 4, 6]);
    let y = y.to_dtype(DType::F32).unwrap();
    let sum = |t: candle_core::Tensor| {
        t.abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    };
    // The mask: ones on the first latent frame, zeros after; the image latents only on the first frame.
    assert_eq!(
        sum(y.narrow(0, 0, 4).unwrap().narrow(1, 0, 1).unwrap()),
        4.0 * 24.0
    );
    assert_eq!(sum(y.narrow(1, 1, 2).unwrap()), 0.0);
    assert!(sum(y.narrow(0, 4, c).unwrap().narrow(1, 0, 1).unwrap()) > 0.0);
    let clip = cache.clip.expect("CLIP features");
    assert_eq!((clip.dims(), clip.dtype()), (&[5, 24][..], DType::F16));

    let mut config = RunConfig::load(&files.run).unwrap();
    config.training.device = DeviceSpec::Cpu;
    assert_eq!(train(config).0, 2);
}

/// Runs `config` through the engine to the end; the number of steps it reported, and the last LoRA it saved.
fn train(config: RunConfig) -> (usize, Option<std::path::PathBuf>) {
    let engine = framesmith_engine::train::engine::spawn().unwrap();
    engine
        .commands
        .send(Command::StartRun(Box::new(StartRun {
            config,
            resume_from: None,
        })))
        .unwrap();
    let (mut steps, mut lora) = (0, None);
    loop {
        match engine
            .events
            .recv_timeout(EVENT_TIMEOUT)
            .expect("an engine event")
        {
            Event::Progress(p) => {
                assert!(p.loss.is_finite(), "loss {}", p.loss);
                steps = p.step;
            }
            Event::CheckpointSaved { lora: path, .. } => lora = Some(path),
            Event::Failed { message } => panic!("the run failed: {message}"),
            Event::StateChanged(RunState::Finished) => return (steps, lora),
            _ => {}
        }
    }
}

/// The DiT reads back as `spec`'s model, in bf16, with weights of the initialisation's spread.
fn assert_dit_reads_back(dit: &std::path::Path, spec: &SynthProject) {
    let report = framesmith_models::wan::weights::inspect(dit).unwrap();
    assert_eq!(report.config.num_layers, spec.cfg.num_layers);
    assert_eq!(report.config.dim, spec.cfg.dim);
    assert_eq!(report.config.text_dim, spec.cfg.text_dim);
    assert_eq!(report.dtypes.keys().collect::<Vec<_>>(), ["BF16"]);
    let loaded = framesmith_models::wan::weights::load(dit, None, &Device::Cpu).unwrap();
    let q = loaded.tensors["blocks.0.self_attn.q.weight"]
        .to_dtype(DType::F32)
        .unwrap();
    let std = q
        .sqr()
        .unwrap()
        .mean_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
        .sqrt();
    let expected = 1.0 / (spec.cfg.dim as f32).sqrt();
    assert!(
        (std / expected - 1.0).abs() < 0.1,
        "q std {std}, expected {expected}"
    );
}

/// The run config names every memory setting, asks for CUDA and validates, as do the edits a user makes to it
/// (an explicit budget, `auto` streaming); returns it as written.
fn assert_run_config_validates(run: &std::path::Path) -> RunConfig {
    let text = std::fs::read_to_string(run).unwrap();
    for key in [
        "streaming",
        "blocks_to_swap",
        "activations",
        "checkpointing",
        "vram_budget_gb",
    ] {
        assert!(
            text.contains(&format!("\n{key} = ")) || text.contains(&format!("# {key} = ")),
            "{key} in\n{text}"
        );
    }
    let config = RunConfig::load(run).unwrap();
    assert_eq!(config.training.device, DeviceSpec::Cuda(0));
    assert_eq!(config.memory.blocks_to_swap, BlocksToSwap::Count(0));
    validate(&config, &HostInfo::new(1)).unwrap_or_else(|e| panic!("{e}"));

    let edited = text
        .replace("# vram_budget_gb = 24.0", "vram_budget_gb = 7")
        .replace("blocks_to_swap = 0", "blocks_to_swap = \"auto\"")
        .replace("streaming = \"off\"", "streaming = \"pinned\"");
    let fits = RunConfig::from_toml_str(&edited, run).unwrap();
    assert_eq!(fits.memory.vram_budget_gb, Some(7.0));
    assert!(matches!(fits.memory.blocks_to_swap, BlocksToSwap::Auto(_)));
    validate(&fits, &HostInfo::new(1)).unwrap_or_else(|e| panic!("{e}"));
    config
}

#[test]
fn the_project_loads_validates_and_trains_from_its_caches() {
    let dir = tempfile::tempdir().unwrap();
    let spec = tiny(5, 32, 48);
    let files = write_project(dir.path(), &spec).unwrap();
    assert_dit_reads_back(&files.dit, &spec);

    let (latents, _) = read_wan_latent_cache(&files.latents, &Device::Cpu).unwrap();
    assert_eq!(latents.latents.dims(), [spec.cfg.in_dim, 2, 4, 6]);
    let text = read_wan_text_cache(
        &dir.path().join("cache").join(text_cache_name("synth_000")),
        &Device::Cpu,
    )
    .unwrap();
    assert_eq!(text.t5.dims(), [8, spec.cfg.text_dim]);

    // The grey stand-in clip and its caption make the dataset check clean, as real media would.
    assert!(dir.path().join("videos/synth_000.mp4").exists());
    let options = framesmith_data::ScanOptions::locate();
    let report = framesmith_data::check_path(&files.dataset, &options).unwrap();
    assert!(report.is_ok(), "{report}");

    let mut config = assert_run_config_validates(&files.run);
    config.training.device = DeviceSpec::Cpu;
    let (steps, lora) = train(config);
    assert_eq!(steps, 2);
    let lora = lora.expect("the LoRA was saved at the end");
    assert!(
        lora.starts_with(dir.path().join("output")) && lora.exists(),
        "{}",
        lora.display()
    );
}

/// `--dtype fp8-scaled` writes what ComfyUI's `*_fp8_scaled.safetensors` DiT files are: `inspect` reads the layout,
/// and the weights are the bf16 file's draws within FP8 rounding.
#[test]
fn the_scaled_fp8_file_is_a_comfyui_layout_of_the_same_weights() {
    use framesmith_models::wan::weights::{self, ScaleNaming};
    let dense_dir = tempfile::tempdir().unwrap();
    let fp8_dir = tempfile::tempdir().unwrap();
    let spec = tiny(5, 32, 48);
    let dense = write_project(dense_dir.path(), &spec).unwrap();
    let scaled = SynthProject {
        dit: DitFormat::ComfyScaledFp8,
        ..spec.clone()
    };
    let fp8 = write_project(fp8_dir.path(), &scaled).unwrap();
    assert!(fp8.dit_bytes < dense.dit_bytes);

    let report = weights::inspect(&fp8.dit).unwrap();
    let info = report.fp8.as_ref().expect("an FP8 file");
    assert_eq!(info.naming, ScaleNaming::ComfyScaledFp8);
    assert_eq!(info.format, "float8_e4m3fn");
    assert!(info.weights > 0);
    assert_eq!(report.config.num_layers, spec.cfg.num_layers);

    let a = weights::load(&dense.dit, None, &Device::Cpu).unwrap();
    let b = weights::load(&fp8.dit, None, &Device::Cpu).unwrap();
    let name = "blocks.0.ffn.0.weight";
    let codes = &b.tensors[name];
    assert_eq!(codes.dtype(), DType::F8E4M3);
    let scale = b.tensors["blocks.0.ffn.0.scale_weight"]
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()[0];
    let back = codes
        .to_dtype(DType::F32)
        .unwrap()
        .affine(scale as f64, 0.0)
        .unwrap();
    let want = a.tensors[name].to_dtype(DType::F32).unwrap();
    let err = (back - &want)
        .unwrap()
        .sqr()
        .unwrap()
        .mean_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
        .sqrt();
    let rms = want
        .sqr()
        .unwrap()
        .mean_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
        .sqrt();
    // e4m3 keeps 3 mantissa bits: a few percent of the weights' RMS, far from a wrong value or scale.
    assert!(err < 0.06 * rms, "rms error {err} of {rms}");
    // Everything outside the blocks' linears stays bf16.
    assert_eq!(b.tensors["head.head.weight"].dtype(), DType::BF16);
}

/// `--encoders` writes umT5 and VAE files as ComfyUI ships them: the text encoder loads with the tokenizer embedded
/// in it and encodes a prompt to finite values of its width; the VAE is read back as its config and encodes a clip
/// to finite latents of the expected shape. Tiny sizes here; the bench writes the real ones.
#[test]
fn random_encoders_load_as_comfyui_files_and_encode() {
    use candle_core::Tensor;
    use framesmith_bench::synth::write_random_encoders;
    use framesmith_models::t5::T5Config;
    use framesmith_models::wan::text_encoder::TextEncoder;
    use framesmith_models::wan::vae::{load_vae_auto, LatentStats, VaeConfig, VaeVariant};

    let dir = tempfile::tempdir().unwrap();
    let spiece = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crates/framesmith-models/testdata/spiece_tiny/tiny_unigram.model"),
    )
    .unwrap();
    // The tiny SentencePiece model's ids go up to 319.
    let t5 = T5Config {
        vocab: 320,
        ..T5Config::tiny()
    };
    let vae_cfg = VaeConfig {
        dim: 8,
        dec_dim: 8,
        dim_mult: vec![1, 2, 2, 2],
        num_res_blocks: 1,
        ..VaeConfig::wan21()
    };
    let (umt5, vae) = write_random_encoders(dir.path(), &t5, &vae_cfg, &spiece, 3).unwrap();

    let report = framesmith_models::wan::weights::inspect(&umt5);
    assert!(report.is_err(), "a text encoder is not a DiT");
    let encoder = TextEncoder::load(&umt5, None, DType::F32, &Device::Cpu).unwrap();
    let out = encoder.encode_prompts(&["a red ball rolls"]).unwrap();
    assert_eq!(out[0].dims()[1], t5.dim);
    let values = out[0].flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert!(values.iter().all(|v| v.is_finite()) && values.iter().any(|v| *v != 0.0));

    let model = load_vae_auto(&vae, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(model.config(), &vae_cfg);
    let video = Tensor::rand(-1f32, 1.0, (1, 3, 5, 16, 16), &Device::Cpu).unwrap();
    let stats = LatentStats::official(VaeVariant::Wan21, &Device::Cpu).unwrap();
    let z = model.encode(&video, &stats).unwrap();
    assert_eq!(z.dims(), [1, 16, 2, 2, 2]);
    let z = z.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert!(z.iter().all(|v| v.is_finite()));
}
