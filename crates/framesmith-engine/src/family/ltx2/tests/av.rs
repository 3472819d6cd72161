//! Sound and image-to-video in LTX-2's samples on the CPU: a joint audio-video run of the tiny audio-video
//! checkpoint (`testkit::tiny_checkpoint_av`) learns and its samples are MP4s with an audio stream; a text-to-video
//! run's are not; a `--i` sample keeps its first latent frame the image's; what sound or an image needs is refused
//! by name before anything loads.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::super::denoise::{denoise_clip, ClipLatents, ClipStart, Ltx2Context, Ltx2Prompt};
use super::super::pipeline::{Ltx2Settings, Schedule};
use super::super::setup::start_run_with;
use super::super::testkit::{
    dataset_for, text_case_dir, tiny_checkpoint, tiny_checkpoint_av, tiny_dit_with, tiny_gemma,
};
use super::super::train::dit_config;
use crate::family::testkit::run::{cached_run_config, error_of};
use framesmith_config::protocol::Event;
use framesmith_config::run::TimestepSampling;
use framesmith_config::validate::validate_for;
use framesmith_config::{HostInfo, ModelFamily, RunConfig};
use framesmith_data::media::MediaTools;
use framesmith_models::ltx2::weights::load_streamed_av;
use framesmith_models::ltx2::Ltx2Transformer;
use framesmith_nn::offload::OffloadOptions;

/// The audio channels of `mp4`'s first audio stream (`None`: no audio stream), or `None` with the reason printed
/// when ffmpeg / ffprobe is not on this machine.
fn audio_channels(mp4: &Path) -> anyhow::Result<Option<Option<usize>>> {
    match MediaTools::locate() {
        Ok(tools) => Ok(Some(tools.audio_channels(mp4)?)),
        Err(e) => {
            eprintln!(
                "skipped: ffmpeg / ffprobe not found ({e}), so the MP4s are not muxed and probed"
            );
            Ok(None)
        }
    }
}

/// A run of `dit` on its dataset for `steps` steps with the sample prompts `prompts`, Gemma 3 the text fixture's.
fn run_config(
    dir: &Path,
    (dit, audio): (&Path, bool),
    steps: usize,
    prompts: &str,
) -> anyhow::Result<RunConfig> {
    let cfg = dit_config(dit)?;
    let toml = dataset_for(dir, 1, (audio, &cfg))?;
    let mut config = cached_run_config(
        dir,
        (dit.to_path_buf(), toml),
        steps,
        TimestepSampling::ShiftedLogitNormal,
    )?;
    config.optimizer.learning_rate = 1e-2;
    // A narrow band of timesteps, so that the loss's fall shows through the per-step noise.
    config.training.min_timestep = 500.0;
    config.training.max_timestep = 510.0;
    let file = dir.join("prompts.txt");
    std::fs::write(&file, prompts)?;
    config.sampling.prompts = Some(file);
    config.sampling.sample_every_n_steps = Some(steps);
    config.model.text_encoder = text_case_dir().join("gemma_3_12B_it.safetensors");
    Ok(config)
}

/// The run `config` started once with the text fixture's Gemma (which fills the prompt cache, so the trainer's own
/// start loads no Gemma), then trained through the trainer for its steps and sampled: the losses and the samples'
/// MP4s.
fn train_and_sample(config: &RunConfig) -> anyhow::Result<(Vec<f64>, Vec<PathBuf>)> {
    let plan = validate_for(config, &HostInfo::cpu_only(), ModelFamily::Ltx2)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    drop(start_run_with(
        &plan,
        &config.model.dit,
        &tiny_gemma,
        &mut |_, _| {},
    )?);
    let mut run = crate::train::tests::try_start(config, None)?;
    let mut losses = Vec::new();
    while run.step() < config.training.max_train_steps {
        let report = run.train_step(&|| false)?;
        losses.push(report.loss.ok_or_else(|| anyhow::anyhow!("no loss"))?);
    }
    let files = run
        .sample(&|| false)?
        .into_iter()
        .filter_map(|e| match e {
            Event::SampleReady { file, .. } => Some(file),
            _ => None,
        })
        .collect();
    Ok((losses, files))
}

/// The mean of the first and of the last third of `losses`: the later is under 0.9 of the earlier.
fn assert_the_loss_falls(losses: &[f64]) {
    let third = losses.len() / 3;
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    let (first, last) = (
        mean(&losses[..third]),
        mean(&losses[losses.len() - third..]),
    );
    assert!(
        losses.iter().all(|l| l.is_finite()) && last < 0.9 * first,
        "the loss falls: {first} → {last} ({losses:?})"
    );
}

#[test]
fn a_joint_run_learns_and_its_samples_are_muxed_with_sound() -> anyhow::Result<()> {
    if let Err(e) = crate::family::ltx2::sound::muxer() {
        eprintln!("skipped: a joint run's samples need ffmpeg to mux their sound ({e:#})");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let dit = tiny_checkpoint_av(&dir.path().join("ckpt"))?;
    let config = run_config(
        dir.path(),
        (&dit, true),
        30,
        "a fox barks at the moon --w 24 --h 16 --f 9 --s 2 --d 5\n",
    )?;
    let (losses, files) = train_and_sample(&config)?;
    assert_the_loss_falls(&losses);
    assert_eq!(files.len(), 1);
    assert!(files[0].is_file(), "{}", files[0].display());
    if let Some(channels) = audio_channels(&files[0])? {
        assert_eq!(channels, Some(2), "a stereo sound track");
    }
    Ok(())
}

#[test]
fn a_text_to_video_run_learns_and_its_samples_have_no_sound() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let dit = tiny_checkpoint(&dir.path().join("ckpt"))?;
    let config = run_config(
        dir.path(),
        (&dit, false),
        30,
        "a fox runs --w 24 --h 16 --f 9 --s 2 --d 5\n",
    )?;
    let (losses, files) = train_and_sample(&config)?;
    assert_the_loss_falls(&losses);
    if let Some(channels) = audio_channels(&files[0])? {
        assert_eq!(channels, None, "no audio stream");
    }
    Ok(())
}

/// The settings of a small clip.
fn settings(sound: bool) -> Ltx2Settings {
    Ltx2Settings {
        width: 96,
        height: 64,
        frames: 9,
        steps: 2,
        guidance: 3.0,
        seed: 4,
        schedule: Schedule::Scheduler,
        sound,
    }
}

/// The tiny transformer with its audio stream, a prompt of both streams and a negative one, and a first frame's
/// latents for a clip of latent [2, 2, 3].
struct Joint {
    model: Ltx2Transformer,
    prompt: Ltx2Prompt,
    image: Tensor,
}

impl Joint {
    fn new(dir: &Path) -> anyhow::Result<Self> {
        let dit = tiny_dit_with(dir, true)?;
        let (_, model) = load_streamed_av(
            &dit,
            (DType::F32, &Device::Cpu),
            (None, false),
            (&[], &OffloadOptions::default()),
            true,
        )?;
        let cfg = &model.cfg;
        let dev = Device::Cpu;
        let context = |v: f64| -> anyhow::Result<Ltx2Context> {
            let ones = |width: usize| Tensor::ones((5, width), DType::F32, &dev);
            Ok(Ltx2Context {
                video: (ones(cfg.cross_attention_dim)? * v)?,
                audio: Some((ones(cfg.audio_cross_attention_dim)? * v)?),
            })
        };
        let prompt = Ltx2Prompt {
            text: context(0.5)?,
            negative: Some(context(-0.5)?),
        };
        let image = Tensor::randn(0f32, 1.0, (cfg.in_channels, 1, 2, 3), &dev)?;
        Ok(Self {
            model,
            prompt,
            image,
        })
    }

    /// The clip from `start` (with `sound`) under `prompt`.
    fn run(
        &self,
        prompt: &Ltx2Prompt,
        start: &ClipStart,
        sound: bool,
    ) -> anyhow::Result<ClipLatents> {
        denoise_clip(
            &self.model,
            prompt,
            &settings(sound),
            (start, DType::F32, &Device::Cpu),
            &|| false,
        )
    }

    fn i2v(&self, audio_frames: Option<usize>) -> ClipStart {
        ClipStart {
            latent: [2, 2, 3],
            first_frame: Some(self.image.clone()),
            audio_frames,
        }
    }
}

/// The second latent frame of video latents [C, F, H, W].
fn later(t: &Tensor) -> anyhow::Result<Vec<f32>> {
    Ok(t.narrow(1, 1, 1)?.flatten_all()?.to_vec1::<f32>()?)
}

#[test]
fn an_image_start_stays_the_first_latent_frame_and_sound_is_sampled_jointly() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let j = Joint::new(dir.path())?;
    let clip = j.run(&j.prompt, &j.i2v(Some(5)), true)?;
    let first = clip
        .video
        .narrow(1, 0, 1)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    assert_eq!(
        first,
        j.image.flatten_all()?.to_vec1::<f32>()?,
        "the image's latents, untouched"
    );
    let audio = clip.audio.ok_or_else(|| anyhow::anyhow!("no audio"))?;
    assert_eq!(audio.dims(), [1, 5, j.model.cfg.audio_in_channels]);
    // The later frames move with the image; text-to-video has no audio and other frames.
    let t2v_start = ClipStart {
        latent: [2, 2, 3],
        ..ClipStart::default()
    };
    let t2v = j.run(&j.prompt, &t2v_start, false)?;
    assert!(t2v.audio.is_none());
    assert_ne!(later(&clip.video)?, later(&t2v.video)?);
    Ok(())
}

#[test]
fn sound_moves_the_video_and_needs_the_audio_text() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let j = Joint::new(dir.path())?;
    let loud = j.run(&j.prompt, &j.i2v(Some(5)), true)?;
    // The streams attend to each other: the same clip without sound has other later frames.
    let silent = j.run(&j.prompt, &j.i2v(None), false)?;
    assert!(silent.audio.is_none());
    assert_ne!(later(&loud.video)?, later(&silent.video)?);
    let mute = Ltx2Prompt {
        text: Ltx2Context {
            audio: None,
            ..j.prompt.text.clone()
        },
        negative: None,
    };
    let err = j
        .run(&mute, &j.i2v(Some(5)), true)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(err.contains("no audio text context"), "{err}");
    Ok(())
}

#[test]
fn missing_images_and_sound_files_are_refused_by_name() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // A sample's `--i` that is not there: refused naming the prompt and the file, before Gemma loads.
    let dit = tiny_checkpoint(&dir.path().join("ckpt"))?;
    let config = run_config(
        dir.path(),
        (&dit, false),
        2,
        "a fox --w 24 --h 16 --f 9 --s 2 --i nowhere.png\n",
    )?;
    let plan = validate_for(&config, &HostInfo::cpu_only(), ModelFamily::Ltx2)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let refuse = |_: &Path, _: DType, _: &Device, _: u64| -> anyhow::Result<_> {
        anyhow::bail!("Gemma was loaded")
    };
    let err = error_of(start_run_with(&plan, &dit, &refuse, &mut |_, _| {}).map(|_| ()));
    assert!(
        err.contains("nowhere.png") && err.contains("--i") && !err.contains("Gemma was loaded"),
        "{err}"
    );
    // A joint run whose checkpoint holds no audio VAE: its samples are refused, naming the file and what to pass.
    let joint = dir.path().join("joint");
    std::fs::create_dir_all(&joint)?;
    let dit = tiny_dit_with(&joint.join("dit"), true)?;
    let config = run_config(&joint, (&dit, true), 2, "a fox --w 24 --h 16 --f 9 --s 2\n")?;
    let plan = validate_for(&config, &HostInfo::cpu_only(), ModelFamily::Ltx2)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let err = error_of(start_run_with(&plan, &dit, &refuse, &mut |_, _| {}).map(|_| ()));
    assert!(
        err.contains("audio VAE")
            && err.contains(&dit.display().to_string())
            && err.contains("model.dit"),
        "{err}"
    );
    Ok(())
}

#[test]
fn an_i2v_sample_starts_from_its_image() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let dit = tiny_checkpoint(&dir.path().join("ckpt"))?;
    image::RgbImage::from_fn(40, 30, |x, y| {
        image::Rgb([(x * 6) as u8, (y * 8) as u8, 200])
    })
    .save(dir.path().join("start.png"))?;
    // The same prompt and seed, the second from the image beside the prompt file.
    let line = "a fox runs --w 24 --h 16 --f 9 --s 2 --d 5";
    let config = run_config(
        dir.path(),
        (&dit, false),
        2,
        &format!("{line}\n{line} --i start.png\n"),
    )?;
    let plan = validate_for(&config, &HostInfo::cpu_only(), ModelFamily::Ltx2)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut parts = start_run_with(&plan, &dit, &tiny_gemma, &mut |_, _| {})?;
    let out = dir.path().join("samples");
    std::fs::create_dir_all(&out)?;
    let mut first_frame = |i: usize| -> anyhow::Result<Vec<u8>> {
        let files = parts_sample(&mut parts, i, &out)?;
        Ok(std::fs::read(files.join("frame_0000.png"))?)
    };
    let (t2v, i2v) = (first_frame(0)?, first_frame(1)?);
    assert_ne!(t2v, i2v, "the image starts the clip");
    Ok(())
}

/// Sample `i` of the run `parts` written into `out`; returns its frames' folder.
fn parts_sample(
    parts: &mut crate::train::setup::RunParts,
    i: usize,
    out: &Path,
) -> anyhow::Result<PathBuf> {
    let files = parts
        .family
        .sample(i, out, &format!("000001-{i:02}"), &|| false)?;
    assert!(files.file.is_file());
    Ok(files.frames)
}
