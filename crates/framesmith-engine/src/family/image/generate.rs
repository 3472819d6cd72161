//! What an image family's part of the generation call shares: the checks before anything loads (the options only
//! other families take refused by flag, the VAE and text encoder given, `--out` a PNG or an MP4, one device), the VRAM budget held, and the end of the call
//! (the denoising timed step by step, the model dropped, the image decoded, written and reported).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use crate::generate::request::{create_out_folder, GenerationOutput, GenerationRequest, Placement};
use crate::generate::run::{loras_as_one, timing_line, vram_use, Session, StepClock};
use crate::generate::sampler::Solver;
use crate::prep::frames_to_video;
use framesmith_config::run::DeviceSpec;
use framesmith_data::bucket::round_down_to;
use framesmith_data::control::bucket_at_area;
use framesmith_data::probe::load_rgb;
use framesmith_data::resize::resize_to_bucket;
use framesmith_models::trainable::TrainableModel;
use framesmith_nn::device::{hold_vram_budget, VramHold};

/// The flags given that only other families take, in one order for every family: the clip and expert options
/// every image family refuses, and those of `refused_too` (`--text-encoder`, `--clip-l`, `--t5`, `--negative`,
/// `--blocks-to-swap`: the ones another image family takes); a solver other than Euler as `solver_note`.
pub(crate) fn foreign_options(
    request: &GenerationRequest,
    solver_note: &'static str,
    refused_too: &[&str],
) -> Vec<&'static str> {
    let f = &request.files;
    // (given, flag, refused by every image family)
    [
        (request.dit_low_noise.is_some(), "--dit-low-noise", true),
        (request.boundary.is_some(), "--boundary", true),
        (
            !request.loras_low_noise.is_empty(),
            "--lora-low-noise",
            true,
        ),
        (f.text_encoder.is_some(), "--text-encoder", false),
        (request.image.is_some(), "--image", true),
        (f.clip.is_some(), "--clip", true),
        (f.clip_l.is_some(), "--clip-l", false),
        (f.t5.is_some(), "--t5", false),
        (request.negative.is_some(), "--negative", false),
        (request.frames.is_some(), "--frames", true),
        (request.shift.is_some(), "--shift", true),
        (request.tiled, "--tiled", true),
        (request.blocks_to_swap > 0, "--blocks-to-swap", false),
        (
            request.solver.is_some_and(|s| s != Solver::Euler),
            solver_note,
            true,
        ),
    ]
    .into_iter()
    .filter(|&(given, name, all)| given && (all || refused_too.contains(&name)))
    .map(|(_, name, _)| name)
    .collect()
}

/// Refuses the `foreign` flags given (for `whose` models), saying what the DiT at `dit` makes from what (`takes`).
pub(crate) fn refuse_foreign(
    foreign: &[&str],
    (whose, takes): (&str, &str),
    dit: &Path,
) -> anyhow::Result<()> {
    if foreign.is_empty() {
        return Ok(());
    }
    let one = foreign.len() == 1;
    anyhow::bail!(
        "{} {} for {whose}; {takes}: drop {} ({})",
        foreign.join(", "),
        if one { "is" } else { "are" },
        if one { "it" } else { "them" },
        dit.display()
    )
}

/// What a family's generation writes to `--out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutKind {
    /// One image, as PNG.
    Png,
    /// A clip, as MP4.
    Mp4,
}

/// `--out` must name the `family`'s output (`kind`); its folder is made.
pub(crate) fn check_out(out: &Path, family: &str, kind: OutKind) -> anyhow::Result<()> {
    let (ext, what) = match kind {
        OutKind::Png => ("png", "an image, written as PNG"),
        OutKind::Mp4 => ("mp4", "a clip, written as MP4"),
    };
    if !out.extension().is_some_and(|e| e.eq_ignore_ascii_case(ext)) {
        anyhow::bail!(
            "--out: {family} makes {what}: give a path ending in .{ext} ({})",
            out.display()
        );
    }
    create_out_folder(out)
}

/// What a family whose DiT takes a VAE and one text encoder checks in a request before anything loads.
pub(crate) struct RequestChecks<'a> {
    /// The family, as messages name it.
    pub family: &'a str,
    /// The flags given that only other families take, and what refusing them says: for whom, and what the DiT
    /// makes from what ([`refuse_foreign`]).
    pub foreign: Vec<&'static str>,
    pub refusal: (&'a str, &'a str),
    /// The file names the errors that ask for the VAE and the text encoder give.
    pub vae: &'a str,
    pub text_encoder: &'a str,
    /// What `--out` must be.
    pub out: OutKind,
}

/// The checks before anything loads: the DiT readable (`dit_read`, the family's reading of its config, whose
/// `model.dit` error is said as `--dit`'s), the foreign flags refused, the VAE and the text encoder given and
/// `--out` of the right kind; returns the VAE and the text encoder's weights.
pub(crate) fn check_request<'a, T>(
    (dit, dit_read): (&Path, anyhow::Result<T>),
    request: &'a GenerationRequest,
    checks: &RequestChecks<'_>,
) -> anyhow::Result<[&'a Path; 2]> {
    dit_read.map_err(|e| {
        anyhow::anyhow!("--dit{}", format!("{e:#}").trim_start_matches("model.dit"))
    })?;
    refuse_foreign(&checks.foreign, checks.refusal, dit)?;
    let family = checks.family;
    let f = &request.files;
    let Some(vae) = f.vae.as_deref() else {
        anyhow::bail!(
            "a {family} DiT needs its VAE: --vae {} ({})",
            checks.vae,
            dit.display()
        );
    };
    let Some(text_encoder) = f.text_encoder.as_deref() else {
        anyhow::bail!(
            "a {family} DiT needs its text encoder: --text-encoder {} ({})",
            checks.text_encoder,
            dit.display()
        );
    };
    check_out(&request.out, family, checks.out)?;
    Ok([vae, text_encoder])
}

/// The one device a `family` DiT runs on: `--gpus N`, else `--device`; several GPUs are refused.
pub(crate) fn one_device(placement: &Placement, family: &str) -> anyhow::Result<DeviceSpec> {
    match *placement.gpus.as_slice() {
        [] => Ok(placement.device),
        [one] => Ok(DeviceSpec::Cuda(one)),
        [first, ..] => {
            let list: Vec<String> = placement.gpus.iter().map(usize::to_string).collect();
            anyhow::bail!(
                "--gpus {}: a {family} DiT runs on one GPU: give --gpus {first}",
                list.join(",")
            )
        }
    }
}

/// The request's VRAM budget held on `device` (`None` without a budget, or where nothing can be held); taken
/// before anything takes device memory, so that what the encoders, the autoencoder and the DiT take counts.
pub(crate) fn hold_budget(
    request: &GenerationRequest,
    device: &Device,
) -> anyhow::Result<Option<VramHold>> {
    Ok(request
        .vram_budget_bytes
        .map(|b| hold_vram_budget(device, b))
        .transpose()?
        .flatten())
}

/// Applies the request's LoRAs, as one ([`loras_as_one`]), to the LoRA linears of `model`, a DiT of the model
/// `name` names in the error when they do not fit.
pub(crate) fn apply_loras<M: TrainableModel>(
    model: &mut M,
    request: &GenerationRequest,
    (dtype, device): (DType, &Device),
    session: &mut Session,
    name: &str,
) -> anyhow::Result<()> {
    if let Some((lora, multiplier)) = loras_as_one(&request.loras, device, session)? {
        lora.apply(model.lora_linears(), multiplier, dtype)
            .with_context(|| {
                format!("the LoRA does not fit this {name} DiT (a LoRA made for another model?)")
            })?;
    }
    Ok(())
}

/// How one image is denoised and decoded.
pub(crate) struct ImageSteps<D, E> {
    /// The denoising steps.
    pub steps: usize,
    /// Denoises (the model it owns dropped when it returns), polling the given cancel between steps.
    pub denoise: D,
    /// Decodes the latents into the image.
    pub decode: E,
}

/// The end of an image generation: `steps.denoise` timed step by step on `device`, the image decoded and the
/// timing (and the VRAM used, `held` counted) logged, the PNG written to the request's `--out` with `seed`.
pub(crate) fn finish_image<D, E>(
    request: &GenerationRequest,
    session: &mut Session,
    (device, held): (&Device, Option<&VramHold>),
    steps: ImageSteps<D, E>,
    seed: u64,
) -> anyhow::Result<GenerationOutput>
where
    D: FnOnce(&dyn Fn() -> bool) -> anyhow::Result<Tensor>,
    E: FnOnce(&Tensor) -> anyhow::Result<RgbImage>,
{
    let clock = StepClock::new(session, vec![device.clone()], steps.steps);
    let z = clock.checked((steps.denoise)(&|| clock.poll()))?;
    let starts = clock.finish()?;
    let denoised = starts.last().copied().unwrap_or_else(Instant::now);
    let image = (steps.decode)(&z)?;
    let decode_secs = denoised.elapsed().as_secs_f64();
    let vram: Vec<_> = vram_use(device, held).into_iter().collect();
    session.log(timing_line(&starts, decode_secs, &vram));
    image
        .save(&request.out)
        .with_context(|| format!("cannot write {}", request.out.display()))?;
    Ok(GenerationOutput {
        file: request.out.clone(),
        frames_dir: None,
        frames: 1,
        width: image.width() as usize,
        height: image.height() as usize,
        seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::request::DitSource;

    #[test]
    fn foreign_flags_come_in_one_order_with_the_familys_own_left_out() {
        let mut request = GenerationRequest::new(DitSource::Demo, "", "out.png");
        request.frames = Some(81);
        request.negative = Some("blurry".into());
        request.files.t5 = Some("t5xxl.safetensors".into());
        request.files.clip = Some("clip.safetensors".into());
        let flux = foreign_options(&request, "--solver", &["--negative"]);
        assert_eq!(flux, ["--clip", "--negative", "--frames"]);
        let qwen = foreign_options(&request, "--solver", &["--t5"]);
        assert_eq!(qwen, ["--clip", "--t5", "--frames"]);
    }

    #[test]
    fn an_image_family_runs_on_one_device() -> anyhow::Result<()> {
        let on = |gpus: &[usize]| {
            one_device(
                &Placement {
                    device: DeviceSpec::Cpu,
                    gpus: gpus.to_vec(),
                },
                "FLUX.1",
            )
        };
        assert_eq!(on(&[])?, DeviceSpec::Cpu);
        assert_eq!(on(&[1])?, DeviceSpec::Cuda(1));
        let err = on(&[1, 0]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("one GPU") && err.contains("--gpus 1"), "{err}");
        Ok(())
    }
}

/// How an edit model's pipeline sizes a control image.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ControlSizing {
    /// Its own size rounded down to `step` pixels (musubi-tuner's FLUX.1 Kontext sampling).
    Own { step: u32 },
    /// About `area` pixels at its own aspect ratio, sides in `step`s (the Qwen-Image-Edit pipelines' 1024²).
    Area { area: (u32, u32), step: u32 },
}

/// An edit model's control images (`--control`) for its autoencoder: each decoded and resized as `sizing` says,
/// `[1, 3, H, W]` in [−1, 1] on `device`.
pub(crate) fn control_images(
    paths: &[PathBuf],
    sizing: ControlSizing,
    device: &Device,
) -> anyhow::Result<Vec<Tensor>> {
    paths
        .iter()
        .map(|path| {
            let image = load_rgb(path).map_err(|e| {
                anyhow::anyhow!("--control: {}: {}", e.reason(), path.display())
            })?;
            let (w, h) = image.dimensions();
            let size = match sizing {
                ControlSizing::Own { step } => (round_down_to(w, step), round_down_to(h, step)),
                ControlSizing::Area { area, step } => bucket_at_area((w, h), area, step),
            };
            if size.0 == 0 || size.1 == 0 {
                anyhow::bail!(
                    "--control: the image is {w}x{h}, smaller than the model's smallest side; give a larger one: {}",
                    path.display()
                );
            }
            let resized = resize_to_bucket(&image, size);
            Ok(frames_to_video(&[resized], device)?.squeeze(2)?)
        })
        .collect()
}

/// The output's size: `--width` / `--height` when given, else the first control image's (`[1, 3, H, W]`), else
/// `default` on both sides.
pub(crate) fn edit_size(
    request: &GenerationRequest,
    controls: &[Tensor],
    default: usize,
) -> anyhow::Result<(usize, usize)> {
    let (h, w) = match controls.first() {
        Some(c) => {
            let (_, _, h, w) = c.dims4()?;
            (h, w)
        }
        None => (default, default),
    };
    Ok((request.width.unwrap_or(w), request.height.unwrap_or(h)))
}
