//! The one generation call that `framesmith generate` and the app share: [`run`] hands the request to the family
//! whose DiT it names ([`crate::family::family_of_dit`]), which checks it, loads its models one after the other and
//! writes the clip or image; what they share lives here — the events and the cancel poll ([`Session`]), the time
//! each denoising step took ([`StepClock`]), the LoRAs loaded as one adapter ([`loras_as_one`], [`combine_loras`]) and
//! a clip written as an MP4 plus PNG frames ([`write_clip`]).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use framesmith_config::RunConfig;
use framesmith_data::video::encode::{write_mp4, RgbFrame};
use framesmith_nn::device::{VramHold, VramUse};
use framesmith_nn::lora_file::{LoadedLora, LoraFile};

use crate::generate::request::{
    Cancelled, GenerationEvent, GenerationOutput, GenerationRequest, LoraChoice,
};
use crate::train::samples::write_frames;

/// Generates what `request` asks for with the family of its DiT: `events` hears what happens (files loaded, the
/// seed, each denoising step starting, the timings), `cancelled` is polled before each denoising step and a true
/// answer ends the call with [`Cancelled`]. Returns the files written.
pub fn run(
    request: &GenerationRequest,
    events: &mut dyn FnMut(GenerationEvent),
    cancelled: &dyn Fn() -> bool,
) -> anyhow::Result<GenerationOutput> {
    let family = crate::family::family_of_dit(&request.dit);
    if request.sound == Some(true) && !family.makes_sound() {
        anyhow::bail!(
            "--sound: {} makes no sound (only an audio-video model does); drop --sound ({})",
            family.name(),
            request.dit_name()
        );
    }
    let mut session = Session { events, cancelled };
    family.generate(request, &mut session)
}

/// The generation request for the models of the run `config` ("try my LoRA" in the app): its family's files,
/// device and output extension ([`crate::family::Family::run_request`]); prompt and settings are the caller's.
pub fn request_for_run(config: &RunConfig, out_stem: &Path) -> GenerationRequest {
    crate::family::family_of(config).run_request(config, out_stem)
}

/// A path a config leaves empty when it is not given.
pub fn given(path: &Path) -> Option<PathBuf> {
    (!path.as_os_str().is_empty()).then(|| path.to_path_buf())
}

/// What a family's generation reports to and asks of its caller.
pub struct Session<'a> {
    events: &'a mut dyn FnMut(GenerationEvent),
    cancelled: &'a dyn Fn() -> bool,
}

impl<'a> Session<'a> {
    /// A session that reports to `events` and polls `cancelled`.
    pub fn new(
        events: &'a mut dyn FnMut(GenerationEvent),
        cancelled: &'a dyn Fn() -> bool,
    ) -> Self {
        Self { events, cancelled }
    }

    /// Reports a line for the log.
    pub fn log(&mut self, line: impl Into<String>) {
        (self.events)(GenerationEvent::Log(line.into()));
    }

    /// Whether the caller asked to stop.
    pub fn cancelled(&self) -> bool {
        (self.cancelled)()
    }
}

/// The time each denoising step takes, read at the poll before each step (after `devices` have finished the last
/// one), each poll reported as a step starting and answered with the cancel poll.
pub struct StepClock<'s, 'a> {
    session: RefCell<&'s mut Session<'a>>,
    devices: Vec<Device>,
    steps: usize,
    starts: RefCell<Vec<Instant>>,
    stopped: Cell<bool>,
}

impl<'s, 'a> StepClock<'s, 'a> {
    /// A clock for `steps` steps computed on `devices`.
    pub fn new(session: &'s mut Session<'a>, devices: Vec<Device>, steps: usize) -> Self {
        Self {
            session: RefCell::new(session),
            devices,
            steps,
            starts: RefCell::new(Vec::with_capacity(steps + 1)),
            stopped: Cell::new(false),
        }
    }

    /// The poll the denoising loop calls before each step: true stops it.
    pub fn poll(&self) -> bool {
        for device in &self.devices {
            let _ = device.synchronize();
        }
        let step = {
            let mut starts = self.starts.borrow_mut();
            starts.push(Instant::now());
            starts.len() - 1
        };
        let mut session = self.session.borrow_mut();
        (session.events)(GenerationEvent::StepStarted {
            step,
            steps: self.steps,
        });
        let stop = session.cancelled();
        self.stopped.set(stop);
        stop
    }

    /// The denoising loop's `result`, its error [`Cancelled`] when the loop ended because the poll said stop.
    pub fn checked<T>(&self, result: anyhow::Result<T>) -> anyhow::Result<T> {
        match result {
            Err(_) if self.stopped.get() => Err(Cancelled.into()),
            other => other,
        }
    }

    /// Waits for the devices to finish the last step; returns the step start instants and the end of the last.
    pub fn finish(self) -> anyhow::Result<Vec<Instant>> {
        for device in &self.devices {
            device.synchronize()?;
        }
        let mut starts = self.starts.into_inner();
        starts.push(Instant::now());
        Ok(starts)
    }
}

/// The peak device memory of `device`, the budget's hold left out.
pub fn vram_use(device: &Device, hold: Option<&VramHold>) -> Option<VramUse> {
    VramUse::measure(device, hold.map_or(0, |h| h.bytes))
}

/// What the denoising steps took (from the instants each started and the end of the last), the decoding, and the
/// most device memory the command took (on each card, where it ran on several).
pub fn timing_line(starts: &[Instant], decode_secs: f64, vram: &[VramUse]) -> String {
    let steps: Vec<f64> = starts
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    let total: f64 = steps.iter().sum();
    let mean = total / steps.len().max(1) as f64;
    let each: Vec<String> = steps.iter().map(|s| format!("{s:.2}")).collect();
    let gib = |v: &VramUse| format!("{:.2}", v.peak as f64 / (1u64 << 30) as f64);
    let vram = match vram {
        [] => String::new(),
        [one] => format!("; peak VRAM {} GiB", gib(one)),
        several => format!(
            "; peak VRAM {} GiB (per GPU)",
            several.iter().map(gib).collect::<Vec<_>>().join(" + ")
        ),
    };
    format!(
        "denoised in {total:.1} s, {mean:.2} s per step (each: {}); decoded in {decode_secs:.1} s{vram}",
        each.join(" ")
    )
}

/// The LoRAs loaded on `device` as one, with the multiplier to apply it at: one file as it is, several combined
/// into one adapter per layer (their strengths inside it). `None` when there are none.
pub fn loras_as_one(
    loras: &[LoraChoice],
    device: &Device,
    session: &mut Session,
) -> anyhow::Result<Option<(LoraFile, f64)>> {
    if loras.is_empty() {
        return Ok(None);
    }
    let files = loras
        .iter()
        .map(|lora| {
            session.log(format!("LoRA: {} × {}", lora.path.display(), lora.strength));
            Ok((LoraFile::load(&lora.path, device)?, lora.strength))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Some(match files.as_slice() {
        [(one, m)] => (one.clone(), *m),
        _ => (combine_loras(&files)?, 1.0),
    }))
}

/// Writes `frames` as the MP4 `path` and PNG frames in `<path without extension>_frames/`; returns that folder.
pub fn write_clip(path: &Path, frames: &[RgbFrame], fps: f64) -> anyhow::Result<PathBuf> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    write_mp4(path, frames, fps).with_context(|| format!("cannot write {}", path.display()))?;
    let mut name = path.file_stem().unwrap_or_default().to_os_string();
    name.push("_frames");
    let frames_dir = path.with_file_name(name);
    write_frames(&frames_dir, frames, fps)?;
    Ok(frames_dir)
}

/// Several LoRA files with multipliers as one file whose adapters have the same effect: per module, the
/// factors are stacked along the rank (`down` = [down₁; down₂], `up` = [up₁·s₁, up₂·s₂] with sᵢ = αᵢ/rᵢ·mᵢ) and
/// alpha set to the total rank, so `up(down(x))` is exactly the sum of the adapters. Needed because a layer holds
/// one adapter. Factors are combined in f32.
pub fn combine_loras(files: &[(LoraFile, f64)]) -> anyhow::Result<LoraFile> {
    if let Some(m) = files.iter().find_map(|(f, _)| f.adapters.first()) {
        anyhow::bail!(
            "a {} LoRA (module {}) cannot be combined with other LoRAs: apply it alone",
            m.kind_name(),
            m.name
        );
    }
    let mut parts: BTreeMap<String, Vec<(&LoadedLora, f64)>> = BTreeMap::new();
    for (file, multiplier) in files {
        for module in &file.modules {
            parts
                .entry(module.name.clone())
                .or_default()
                .push((module, *multiplier));
        }
    }
    let mut modules = Vec::with_capacity(parts.len());
    for (name, list) in parts {
        let mut downs = Vec::with_capacity(list.len());
        let mut ups = Vec::with_capacity(list.len());
        for (m, multiplier) in &list {
            let rank = m.down.dim(0)?;
            let scale = m.alpha / rank.max(1) as f64 * multiplier;
            downs.push(m.down.to_dtype(DType::F32)?);
            ups.push((m.up.to_dtype(DType::F32)? * scale)?);
        }
        let down = Tensor::cat(&downs, 0)
            .with_context(|| format!("LoRA module {name}: in widths differ"))?;
        let up = Tensor::cat(&ups, 1)
            .with_context(|| format!("LoRA module {name}: out widths differ"))?;
        modules.push(LoadedLora {
            alpha: down.dim(0)? as f64,
            path: list.first().and_then(|(m, _)| m.path.clone()),
            name,
            down,
            up,
        });
    }
    Ok(LoraFile {
        modules,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timing_line_gives_each_step_and_the_mean() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + std::time::Duration::from_millis(ms);
        let line = timing_line(&[at(0), at(1000), at(3000)], 4.0, &[]);
        assert_eq!(
            line,
            "denoised in 3.0 s, 1.50 s per step (each: 1.00 2.00); decoded in 4.0 s"
        );
    }

    #[test]
    fn the_timing_line_gives_each_gpus_peak() {
        let t0 = Instant::now();
        let use_of = |gib: u64| VramUse {
            peak: gib << 30,
            outside_pool: 0,
            peak_used: 0,
            in_use: 0,
            reserved: 0,
            free: 0,
        };
        let line = timing_line(&[t0, t0], 0.0, &[use_of(30), use_of(29)]);
        assert!(
            line.ends_with("; peak VRAM 30.00 + 29.00 GiB (per GPU)"),
            "{line}"
        );
        let line = timing_line(&[t0, t0], 0.0, &[use_of(30)]);
        assert!(line.ends_with("; peak VRAM 30.00 GiB"), "{line}");
    }

    /// `--sound` for a model that makes no sound is refused by name before anything loads; `--no-sound` is not.
    #[test]
    fn sound_is_refused_where_the_model_makes_none() {
        let out = tempfile::tempdir()
            .map(|d| d.path().join("clip.mp4"))
            .unwrap_or_default();
        let mut request =
            GenerationRequest::new(crate::generate::request::DitSource::Demo, "a", out);
        request.sound = Some(true);
        let err = run(&request, &mut |_| {}, &|| false)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(
            err.contains("--sound") && err.contains("makes no sound"),
            "{err}"
        );
        assert!(!crate::family::family_of_dit(&request.dit).makes_sound());
    }
}
