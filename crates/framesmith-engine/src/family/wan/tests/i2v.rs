//! Image-to-video training from musubi-tuner's caches: a step on the official tiny Wan2.1 I2V DiT feeds each
//! item's `latents_image` as `y` and the batch's stacked `clip` features exactly as a direct forward does; the
//! streamed step computes what the resident one does with that conditioning; and a cache without the image parts
//! an I2V model needs is refused with the file and the command that makes them.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, IndexOp, Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::family::wan::cached::{load_cached_items, CacheModels};
use crate::family::wan::run::WanRun;
use crate::train::step::{checkpointed_step, flow_loss, LossTarget, StepOptions};
use crate::train::timesteps::{loss_weight, sample_timesteps};
use crate::train::trainer::{mix, Trainer};
use framesmith_config::protocol::StartRun;
use framesmith_config::run::Checkpointing;
use framesmith_config::{presets, RunConfig};
use framesmith_models::wan::random::{random_inputs, random_weights};
use framesmith_models::wan::{
    Generation, ModelOptions, ModelType, Timesteps, WanConfig, WanInputs, WanModel,
};
use framesmith_nn::init::randn;
use framesmith_nn::offload::{OffloadOptions, StreamMode};
use framesmith_nn::vb::Vb;

fn fixture_dit() -> PathBuf {
    framesmith_models::fixtures::wan_case("wan21_i2v_tiny").join("weights.safetensors")
}

/// Latent frames, height and width of the cached clips (9 frames of 32×32 through the Wan2.1 VAE).
const LATENT: [usize; 3] = [3, 4, 4];

/// What one cache file holds, written under musubi-tuner's key names.
pub(crate) struct MusubiItem<'a> {
    pub(crate) stem: &'a str,
    pub(crate) seed: u64,
    /// Write `latents_image_…`.
    pub(crate) image: bool,
    /// Write `clip_…` of this width.
    pub(crate) clip_dim: Option<usize>,
}

/// A tensor as the `safetensors` crate serialises it.
struct Raw {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl Raw {
    fn new(t: &Tensor) -> anyhow::Result<Self> {
        let flat = t.flatten_all()?;
        let (dtype, data) = match t.dtype() {
            DType::BF16 => (
                safetensors::Dtype::BF16,
                flat.to_vec1::<half::bf16>()?
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            DType::F16 => (
                safetensors::Dtype::F16,
                flat.to_vec1::<half::f16>()?
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            other => anyhow::bail!("no {other:?} in these caches"),
        };
        Ok(Self {
            dtype,
            shape: t.dims().to_vec(),
            data,
        })
    }
}

impl safetensors::View for &Raw {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn save(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &[(&str, &str)],
) -> anyhow::Result<()> {
    let raw = tensors
        .iter()
        .map(|(k, t)| Ok((k.clone(), Raw::new(t)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let metadata = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    safetensors::serialize_to_file(
        raw.iter().map(|(k, r)| (k.as_str(), r)),
        Some(metadata),
        path,
    )?;
    Ok(())
}

/// Writes one clip's caches as musubi-tuner's `save_latent_cache_wan` / `save_text_encoder_output_cache_wan` do
/// (its Python `safetensors.save_file` is this same crate): bf16 latents `latents_{F}x{H}x{W}_bfloat16`, image
/// latents `latents_image_{F}x{H}x{W}_bfloat16` (mask then latents), CLIP features in float16 under
/// `clip_bfloat16`, text `varlen_t5_bfloat16`, and its metadata.
pub(crate) fn write_musubi_caches(
    dir: &Path,
    item: &MusubiItem,
    text_dim: usize,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let rng = &mut StdRng::seed_from_u64(item.seed);
    let dev = &Device::Cpu;
    let [f, h, w] = LATENT;
    let bf16 = |t: Tensor| t.to_dtype(DType::BF16);
    let mut tensors: Vec<(String, Tensor)> = vec![(
        format!("latents_{f}x{h}x{w}_bfloat16"),
        bf16(randn(rng, (16, f, h, w), 0.0, 1.0, dev)?)?,
    )];
    if item.image {
        let mask = Tensor::cat(
            &[
                Tensor::ones((4, 1, h, w), DType::F32, dev)?,
                Tensor::zeros((4, f - 1, h, w), DType::F32, dev)?,
            ],
            1,
        )?;
        let image = randn(rng, (16, f, h, w), 0.0, 1.0, dev)?;
        tensors.push((
            format!("latents_image_{f}x{h}x{w}_bfloat16"),
            bf16(Tensor::cat(&[mask, image], 0)?)?,
        ));
    }
    if let Some(d) = item.clip_dim {
        let clip = randn(rng, (257, d), 0.0, 1.0, dev)?.to_dtype(DType::F16)?;
        tensors.push(("clip_bfloat16".into(), clip));
    }
    let name = format!("{}_00000-009_0032x0032_wan.safetensors", item.stem);
    let meta = [
        ("architecture", "wan"),
        ("width", "32"),
        ("height", "32"),
        ("format_version", "1.0.1"),
        ("frame_count", "9"),
    ];
    save(&dir.join(name), &tensors, &meta)?;
    let t5 = bf16(randn(
        rng,
        (5 + item.seed as usize % 3, text_dim),
        0.0,
        1.0,
        dev,
    )?)?;
    let caption = format!("clip {}", item.stem);
    let meta = [
        ("architecture", "wan"),
        ("caption1", caption.as_str()),
        ("format_version", "1.0.1"),
    ];
    save(
        &dir.join(format!("{}_wan_te.safetensors", item.stem)),
        &[("varlen_t5_bfloat16".to_string(), t5)],
        &meta,
    )?;
    Ok(())
}

/// A video dataset of batch size 2 whose caches are in `cache/`; returns the TOML.
pub(crate) fn dataset(root: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(root.join("videos"))?;
    let toml = root.join("data.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\nbatch_size = 2\nenable_bucket = false\n\n\
         [[datasets]]\nvideo_directory = \"videos\"\ncache_directory = \"cache\"\ntarget_frames = [9]\n",
    )?;
    Ok(toml)
}

pub(crate) fn run_config(
    dir: &Path,
    toml: &Path,
    checkpointing: Checkpointing,
) -> anyhow::Result<RunConfig> {
    let mut config = presets::builtin("demo-cpu")?
        .apply(&RunConfig::default())?
        .config;
    config.model.demo = false;
    config.model.dit = fixture_dit();
    config.dataset.synthetic = false;
    config.dataset.config = toml.to_path_buf();
    config.training.max_train_steps = 2;
    config.optimizer.lr_warmup_steps = 0;
    config.memory.checkpointing = checkpointing;
    config.output.output_dir = dir.join("run");
    config.output.save_every_n_steps = Some(0);
    Ok(config)
}

/// The tensor under `key` of the safetensors file at `path`, read with candle alone (no cache reader).
fn tensor(path: &Path, key: &str) -> anyhow::Result<Tensor> {
    let mut map = candle_core::safetensors::load(path, &Device::Cpu)?;
    map.remove(key)
        .ok_or_else(|| anyhow::anyhow!("{} has no {key}", path.display()))
}

/// The first step's loss of a run on musubi-tuner I2V caches equals the loss of the model called directly with
/// the same noise and timesteps and the caches' `latents_image` as `y` and their `clip` stacked as `clip_fea`
/// (musubi-tuner's `call_dit`), for a batch of two clips, with and without per-block checkpointing.
#[test]
#[allow(clippy::too_many_lines)] // one end-to-end scenario: caches written, loaded, stepped, each checked in order
fn an_i2v_step_feeds_the_cached_image_latents_and_clip_features() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = dataset(dir.path())?;
    let cache = dir.path().join("cache");
    for (stem, seed) in [("a", 1), ("b", 2)] {
        let item = MusubiItem {
            stem,
            seed,
            image: true,
            clip_dim: Some(1280),
        };
        write_musubi_caches(&cache, &item, 32)?;
    }
    for checkpointing in [Checkpointing::Off, Checkpointing::Blocks] {
        let config = run_config(dir.path(), &toml, checkpointing)?;
        let seed = config.training.seed;
        let request = StartRun {
            config,
            resume_from: None,
        };
        let mut trainer = Trainer::start(&request, &mut |_, _| {})?;
        let (_, batch) = trainer.train_set().batch_at(0);
        assert_eq!(batch.len(), 2, "both clips in one batch");
        let files: Vec<PathBuf> = batch.iter().map(|i| cache.join(&i.key)).collect();

        let rng = &mut StdRng::seed_from_u64(mix(seed, 0));
        let [_, h, w] = LATENT;
        let draws = sample_timesteps(trainer.timestep_config(), 2, (h, w), rng);
        let (mut noisy, mut targets, mut y, mut clip, mut context) =
            (vec![], vec![], vec![], vec![], vec![]);
        for (file, draw) in files.iter().zip(&draws) {
            let x = tensor(file, "latents_3x4x4_bfloat16")?.to_dtype(DType::F32)?;
            let noise = randn(rng, x.shape(), 0.0, 1.0, &Device::Cpu)?;
            noisy.push(((&x * (1.0 - draw.t))? + (&noise * draw.t)?)?);
            targets.push((noise - x)?);
            y.push(tensor(file, "latents_image_3x4x4_bfloat16")?.to_dtype(DType::F32)?);
            clip.push(tensor(file, "clip_bfloat16")?.to_dtype(DType::F32)?);
            let stem = &file.file_name().unwrap_or_default().to_string_lossy()[..1];
            context.push(tensor(
                &cache.join(format!("{stem}_wan_te.safetensors")),
                "varlen_t5_bfloat16",
            )?);
        }
        let weights: Vec<f64> = draws
            .iter()
            .map(|d| loss_weight(trainer.timestep_config().weighting, d.model_timestep))
            .collect();
        let target = LossTarget {
            targets: &targets,
            weights: Some(&weights),
            skip_frames: 0,
        };
        let inputs = WanInputs {
            latents: noisy,
            timesteps: Timesteps::PerSample(draws.iter().map(|d| d.model_timestep).collect()),
            context,
            seq_len: None,
            clip: Some(Tensor::stack(&clip, 0)?),
            y: Some(y.clone()),
        };
        let direct = flow_loss(
            &trainer
                .family_run::<WanRun>()
                .experts
                .model
                .forward(&inputs)?,
            &target,
        )?
        .to_scalar::<f32>()? as f64;
        // The conditioning matters: without the image latents the loss is another.
        let blank = WanInputs {
            y: Some(y.iter().map(Tensor::zeros_like).collect::<Result<_>>()?),
            ..inputs
        };
        let unconditioned = flow_loss(
            &trainer
                .family_run::<WanRun>()
                .experts
                .model
                .forward(&blank)?,
            &target,
        )?
        .to_scalar::<f32>()? as f64;
        assert!(
            (unconditioned - direct).abs() > 1e-3 * direct,
            "{unconditioned} vs {direct}"
        );

        let report = trainer.train_step(&|| false)?;
        let loss = report
            .loss
            .ok_or_else(|| anyhow::anyhow!("a finite loss"))?;
        assert!(
            (loss - direct).abs() <= 1e-5 * direct,
            "{checkpointing:?}: step loss {loss} vs direct forward {direct}"
        );
        let second = trainer.train_step(&|| false)?;
        assert!(
            second.loss.is_some_and(f64::is_finite) && second.grad_norm.is_some_and(|g| g > 0.0)
        );
    }
    Ok(())
}

/// A tiny Wan2.1 I2V model (the tiny CLIP's 32-wide features) with random LoRAs, its blocks in `streamed`
/// kept in host RAM and streamed.
pub(crate) fn tiny_i2v(streamed: &[usize]) -> Result<(WanModel, Vec<candle_core::Var>)> {
    let cfg = WanConfig {
        model_type: ModelType::I2v,
        in_dim: 36,
        clip_dim: 32,
        clip_tokens: 17,
        ..WanConfig::tiny(3)
    };
    let dev = Device::Cpu;
    let vb = Vb::from_tensors(random_weights(&cfg, 3, DType::F32, &dev)?, DType::F32, &dev);
    let mut model = if streamed.is_empty() {
        WanModel::new(&cfg, vb, &ModelOptions::default())?
    } else {
        let offload = OffloadOptions {
            mode: StreamMode::Pinned,
            slots: 2,
            ..OffloadOptions::default()
        };
        WanModel::new_streamed(&cfg, vb, &ModelOptions::default(), streamed, &offload)?
    };
    let vars = crate::family::wan::step_testkit::attach_random_loras(&mut model, 4)?;
    Ok((model, vars))
}

/// `y` and the CLIP features enter only in `prepare`, before the blocks: a step whose blocks (with `k_img` /
/// `v_img`) stream from host RAM gives the resident step's loss and LoRA gradients, and the image-branch LoRAs
/// are trained.
#[test]
fn a_streamed_i2v_step_equals_the_resident_one() -> Result<()> {
    let (resident, vars) = tiny_i2v(&[])?;
    let inputs = random_inputs(resident.config(), &[[2, 4, 4], [2, 4, 4]], 6, &Device::Cpu)?;
    assert!(inputs.y.is_some() && inputs.clip.is_some());
    let targets: Vec<Tensor> = inputs
        .latents
        .iter()
        .map(|l| l.ones_like())
        .collect::<Result<_>>()?;
    let target = LossTarget {
        targets: &targets,
        weights: None,
        skip_frames: 0,
    };
    let a = checkpointed_step(&resident, &inputs, &target, &vars, &StepOptions::default())?;
    let (streamed, streamed_vars) = tiny_i2v(&[0, 2])?;
    assert_eq!(streamed.streamer().map(|s| s.count()), Some(2));
    let b = checkpointed_step(
        &streamed,
        &inputs,
        &target,
        &streamed_vars,
        &StepOptions::default(),
    )?;
    assert_eq!(a.loss, b.loss);
    for (ga, gb) in a.grads.iter().zip(&b.grads) {
        assert_eq!((ga - gb)?.abs()?.max_all()?.to_scalar::<f32>()?, 0.0);
    }
    // The image branch's LoRAs (k_img, v_img of every block) get gradients from the CLIP tokens.
    let names: Vec<String> = tiny_i2v(&[])?
        .0
        .linears_mut()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let img_grads: Vec<&Tensor> = names
        .iter()
        .zip(a.grads.chunks(2))
        .filter(|(n, _)| n.contains("_img"))
        .flat_map(|(_, g)| g.iter())
        .collect();
    assert_eq!(img_grads.len(), 2 * 2 * 3);
    for g in img_grads {
        assert!(g.abs()?.sum_all()?.to_scalar::<f32>()? > 0.0);
    }
    // A batch's CLIP features are per sample: swapping them changes the loss.
    let clip = inputs.clip.clone().expect("clip");
    let swapped = WanInputs {
        clip: Some(Tensor::cat(&[clip.i(1..2)?, clip.i(0..1)?], 0)?),
        ..inputs
    };
    let c = checkpointed_step(&resident, &swapped, &target, &vars, &StepOptions::default())?;
    assert_ne!(a.loss, c.loss);
    Ok(())
}

fn load_error(toml: &Path, cfg: &WanConfig, models: CacheModels) -> String {
    load_cached_items(toml, cfg, models, false, &Device::Cpu)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default()
}

/// A text-to-video cache given to an I2V model fails before any step, naming the cache file and the command
/// that adds the image latents (and, for Wan2.1 I2V, the CLIP features); Wan2.2 I2V needs no CLIP features and
/// a T2V model ignores the image parts.
#[test]
fn a_text_to_video_cache_for_an_i2v_model_names_the_file_and_the_command() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = dataset(dir.path())?;
    let cache = dir.path().join("cache");
    let item = |image, clip_dim| MusubiItem {
        stem: "a",
        seed: 1,
        image,
        clip_dim,
    };
    write_musubi_caches(&cache, &item(false, None), 32)?;
    let file = cache.join("a_00000-009_0032x0032_wan.safetensors");
    let wan21 = WanConfig {
        model_type: ModelType::I2v,
        in_dim: 36,
        ..WanConfig::tiny(2)
    };
    let dit = Path::new("/models/wan2.1_i2v_480p_14B_bf16.safetensors");
    let vae = Path::new("/models/Wan2.1_VAE.pth");
    let models = CacheModels {
        vae: Some(vae),
        dit: Some(dit),
        ..CacheModels::default()
    };
    let err = load_error(&toml, &wan21, models);
    assert!(
        err.starts_with("a_00000-009_0032x0032_wan.safetensors has no image latents"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "`framesmith cache latents --dataset {} --vae {} --dit {} --clip <models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth>`",
            toml.display(),
            vae.display(),
            dit.display()
        )),
        "{err}"
    );
    assert!(err.ends_with(&file.display().to_string()), "{err}");

    // Image latents but no CLIP features: Wan2.1 I2V says so; Wan2.2 I2V trains on them.
    write_musubi_caches(&cache, &item(true, None), 32)?;
    let err = load_error(&toml, &wan21, models);
    assert!(
        err.contains("has no CLIP image features")
            && err.contains("--clip")
            && err.ends_with(&file.display().to_string()),
        "{err}"
    );
    let wan22 = WanConfig {
        generation: Generation::Wan22,
        ..wan21.clone()
    };
    let cached = load_cached_items(&toml, &wan22, CacheModels::default(), false, &Device::Cpu)?;
    let (loaded, _) = &cached.items[0];
    assert_eq!(
        loaded.image.as_ref().map(|t| t.dims().to_vec()),
        Some(vec![20, 3, 4, 4])
    );
    assert!(loaded.clip.is_none());
    // Without the DiT's path the command asks for --i2v.
    write_musubi_caches(&cache, &item(false, None), 32)?;
    let err = load_error(&toml, &wan22, CacheModels::default());
    assert!(
        err.contains("--vae <Wan2.1_VAE.pth> --i2v`") && !err.contains("--clip"),
        "{err}"
    );

    // CLIP features of another encoder's width.
    write_musubi_caches(&cache, &item(true, Some(64)), 32)?;
    let err = load_error(&toml, &wan21, models);
    assert!(err.contains("CLIP features of shape [257, 64]"), "{err}");
    // A text-to-video model ignores the image parts.
    let t2v = load_cached_items(&toml, &WanConfig::tiny(2), models, false, &Device::Cpu)?;
    assert!(t2v.items[0].0.image.is_none() && t2v.items[0].0.clip.is_none());
    Ok(())
}

/// The checkpointed I2V step on the official Wan2.1 I2V fixture (`x`, `y`, `clip_fea`, two samples of different
/// sizes): with targets `out − probe · n / 2` the loss's gradient at the output is `probe`, so the step's input
/// gradients must be the official `grad.x_i` (of Σ out · probe), resident and with a block streamed.
#[test]
#[allow(clippy::too_many_lines)] // one fixture comparison: inputs, step, then every expected gradient in turn
fn the_i2v_step_reproduces_the_official_input_gradients() -> anyhow::Result<()> {
    use crate::parity::{compare, Fixture, GRAD_REL_TOL};
    let fixture = Fixture::load(&framesmith_models::fixtures::wan_case("wan21_i2v_tiny"))?;
    let cfg = WanConfig::from_json(&fixture.config.to_string(), Generation::Wan21)?;
    assert!(cfg.has_clip());
    let expected = |name: String| fixture.expected(&name).cloned();
    let outs = (0..2)
        .map(|i| expected(format!("out_{i}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let n: usize = outs.iter().map(Tensor::elem_count).sum();
    let targets = (0..2)
        .map(|i| Ok((&outs[i] - (fixture.input(&format!("probe_{i}"))? * (n as f64 / 2.0))?)?))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let target = LossTarget {
        targets: &targets,
        weights: None,
        skip_frames: 0,
    };
    let latents = (0..2)
        .map(|i| {
            Ok(
                candle_core::Var::from_tensor(fixture.input(&format!("x_{i}"))?)?
                    .as_tensor()
                    .clone(),
            )
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let inputs = WanInputs {
        latents,
        timesteps: Timesteps::PerSample(
            fixture
                .input("t")?
                .to_vec1::<f32>()?
                .iter()
                .map(|&t| f64::from(t))
                .collect(),
        ),
        context: (0..2)
            .map(|i| fixture.input(&format!("context_{i}")).cloned())
            .collect::<anyhow::Result<_>>()?,
        seq_len: Some(120),
        clip: Some(fixture.input("clip_fea")?.clone()),
        y: Some(
            (0..2)
                .map(|i| fixture.input(&format!("y_{i}")).cloned())
                .collect::<anyhow::Result<_>>()?,
        ),
    };
    for streamed in [&[][..], &[1]] {
        let vb = Vb::from_tensors(fixture.weights.clone(), DType::F32, &Device::Cpu);
        let offload = OffloadOptions {
            mode: StreamMode::Pinned,
            slots: 1,
            ..OffloadOptions::default()
        };
        let model = WanModel::new_streamed(&cfg, vb, &ModelOptions::default(), streamed, &offload)?;
        let options = StepOptions {
            return_input_grads: true,
            ..StepOptions::default()
        };
        let out = checkpointed_step(&model, &inputs, &target, &[], &options)?;
        let grads = out.input_grads.unwrap_or_default();
        assert_eq!(grads.len(), 2);
        for (i, g) in grads.iter().enumerate() {
            let row = compare(
                &format!("grad.x_{i}"),
                g,
                fixture.expected(&format!("grad.x_{i}"))?,
                GRAD_REL_TOL,
            )?;
            assert!(row.passed, "streamed {streamed:?}: {row:?}");
        }
        // The loss is Σ (probe · n / 2)² / n, up to the forward's float error.
        let want = targets
            .iter()
            .zip(&outs)
            .map(|(t, o)| Ok((o - t)?.sqr()?.sum_all()?.to_scalar::<f32>()? as f64))
            .sum::<anyhow::Result<f64>>()?
            / n as f64;
        assert!(
            (out.loss as f64 - want).abs() <= 1e-4 * want,
            "{} vs {want}",
            out.loss
        );
    }
    Ok(())
}
