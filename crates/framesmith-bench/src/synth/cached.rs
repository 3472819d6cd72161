//! What the synthetic projects of the families trained from caches share: the project folder's DiT, caches,
//! dataset config and run config written in one order ([`write_cached_project`]) and what was written
//! ([`CachedProjectFiles`]); for the video families, a clip's latent shape through the VAE's compression
//! ([`ClipVae`]), its cache folder and its dataset config.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::{base_run_config, run_config_toml, DATASET_FILE, RUN_FILE};
use framesmith_config::RunConfig;

/// What a synthetic project trained from caches wrote.
#[derive(Debug, Clone)]
pub struct CachedProjectFiles {
    /// The project folder, absolute.
    pub dir: PathBuf,
    pub dit: PathBuf,
    pub dataset: PathBuf,
    pub run: PathBuf,
    /// The latent and text caches of the item.
    pub latents: PathBuf,
    pub text: PathBuf,
    /// Size of the DiT file.
    pub dit_bytes: u64,
}

impl CachedProjectFiles {
    /// What `synth-project` says it wrote: each file, with the DiT's size.
    pub fn wrote_line(&self) -> String {
        format!(
            "wrote {} ({:.2} GiB), {}, {}, {}, {}",
            self.dit.display(),
            self.dit_bytes as f64 / (1u64 << 30) as f64,
            self.latents.display(),
            self.text.display(),
            self.dataset.display(),
            self.run.display()
        )
    }
}

/// What a family's project says beyond the files it writes itself.
pub(crate) struct CachedProject<'a> {
    /// The DiT's file name.
    pub dit_file: &'a str,
    /// The dataset config.
    pub dataset_toml: String,
    /// Optimizer steps and seed of the run config.
    pub steps_seed: (usize, u64),
    /// LoRA rank (and alpha) of the run config.
    pub rank: usize,
}

/// Writes a project into `dir` (created when missing): the DiT (`write_dit` at its path, returning the file's
/// size), the item's caches (`write_caches` into the absolute project folder, returning the latent and text
/// caches), [`DATASET_FILE`] and [`RUN_FILE`] (the shared run config, then `tune`).
pub(crate) fn write_cached_project(
    dir: &Path,
    project: CachedProject<'_>,
    write_dit: impl FnOnce(&Path) -> anyhow::Result<u64>,
    write_caches: impl FnOnce(&Path) -> anyhow::Result<(PathBuf, PathBuf)>,
    tune: impl FnOnce(&mut RunConfig),
) -> anyhow::Result<CachedProjectFiles> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = std::path::absolute(dir)
        .with_context(|| format!("cannot resolve the folder {}", dir.display()))?;
    let dit = dir.join(project.dit_file);
    let dit_bytes = write_dit(&dit)?;
    let (latents, text) = write_caches(&dir)?;
    let dataset = dir.join(DATASET_FILE);
    fs::write(&dataset, project.dataset_toml)
        .with_context(|| format!("cannot write {}", dataset.display()))?;
    let run = dir.join(RUN_FILE);
    let mut config = base_run_config(&dir, &dit, project.steps_seed, project.rank);
    tune(&mut config);
    fs::write(&run, run_config_toml(&config)?)
        .with_context(|| format!("cannot write {}", run.display()))?;
    Ok(CachedProjectFiles {
        dir,
        dit,
        dataset,
        run,
        latents,
        text,
        dit_bytes,
    })
}

/// A video VAE's compression, as a synthetic project checks its clip against it.
pub(crate) struct ClipVae {
    /// The family's name in messages.
    pub family: &'static str,
    /// Pixels per latent a side.
    pub spatial: usize,
    /// Frames per latent frame after the first.
    pub temporal: usize,
}

impl ClipVae {
    /// The latents `[channels, (F − 1)/t + 1, H/s, W/s]` the VAE makes of a `width` × `height` clip of `frames`
    /// frames, or why the size does not fit.
    pub(crate) fn latent_shape(
        &self,
        channels: usize,
        (width, height, frames): (usize, usize, usize),
    ) -> anyhow::Result<[usize; 4]> {
        let (s, t, family) = (self.spatial, self.temporal, self.family);
        let (h, w, f) = (height, width, frames);
        if h == 0 || w == 0 || h % s != 0 || w % s != 0 {
            bail!("{w}x{h} (width x height): {family} needs both sides to be positive multiples of {s}");
        }
        if f == 0 || (f - 1) % t != 0 {
            bail!(
                "{f} frames: {family} takes {t}k + 1 frames (1, {}, …, 121)",
                t + 1
            );
        }
        Ok([channels, (f - 1) / t + 1, h / s, w / s])
    }
}

/// The project's `cache/` folder, created with the empty `videos/` beside it (training reads the caches alone).
pub(crate) fn clip_cache_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let cache = dir.join("cache");
    for sub in [&cache, &dir.join("videos")] {
        fs::create_dir_all(sub).with_context(|| format!("cannot create {}", sub.display()))?;
    }
    Ok(cache)
}

/// A musubi-tuner video dataset config: one dataset of the empty `videos/` cached into `cache/`, clips of `width`
/// x `height` and `frames` frames from the head of each video, batch 1, no buckets, under the `# ` comment lines
/// of `header`.
pub(crate) fn clip_dataset_toml(
    header: &str,
    (width, height, frames): (usize, usize, usize),
) -> String {
    let comment: String = header.lines().map(|l| format!("# {l}\n")).collect();
    format!(
        "{comment}[general]\nresolution = [{width}, {height}]\ncaption_extension = \".txt\"\nbatch_size = 1\n\
         enable_bucket = false\n\n[[datasets]]\nvideo_directory = \"videos\"\ncache_directory = \"cache\"\n\
         target_frames = [{frames}]\nframe_extraction = \"head\"\n"
    )
}
