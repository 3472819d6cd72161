//! Generation with the built-in demo model (demo only): the demo base DiT with the request's LoRAs, the prompt
//! through the demo text embedding and the start image through the demo codec, sampled and decoded exactly as the
//! demo run's own samples are ([`super::demo_setup::demo_sample_prompts`], [`super::samples`]), so "try my
//! LoRA" in the app shows what the run's last sample showed for the same prompt and seed. Written as a clip (MP4
//! plus PNG frames) like any other.

use std::time::Instant;

use candle_core::DType;
use framesmith_models::wan::ModelOptions;
use framesmith_nn::vb::Vb;

use super::demo_setup::{demo_model_config, demo_sample_prompts};
use crate::demo;
use crate::demo::project::{DEMO_FRAMES, DEMO_SIZE};
use crate::dit::build_dit;
use crate::family::wan::denoise::{generate_from, Experts, GenerateRequest};
use crate::family::wan::pipeline::CLIP_FPS;
use crate::family::wan::setup::DEMO_BASE_SEED;
use crate::generate::prompts::PromptSpec;
use crate::generate::request::{
    create_out_folder, open_device, pick_dtype, GenerationOutput, GenerationRequest,
};
use crate::generate::run::{loras_as_one, timing_line, write_clip, Session, StepClock};
use crate::generate::sampler::Solver;

/// The demo's sampling settings where a request leaves them out: its sample prompts' (`--s 20 --l 1.0 --fs 1.0`).
pub const DEMO_STEPS: usize = 20;
const DEMO_GUIDANCE: f64 = 1.0;
const DEMO_SHIFT: f64 = 1.0;

/// The options the demo model does not take, by flag.
fn foreign_options(request: &GenerationRequest) -> Vec<&'static str> {
    let f = &request.files;
    [
        (request.dit_low_noise.is_some(), "--dit-low-noise"),
        (!request.loras_low_noise.is_empty(), "--lora-low-noise"),
        (request.boundary.is_some(), "--boundary"),
        (f.vae.is_some(), "--vae"),
        (f.text_encoder.is_some(), "--text-encoder"),
        (f.tokenizer.is_some(), "--tokenizer"),
        (f.t5.is_some(), "--t5"),
        (f.clip_l.is_some(), "--clip-l"),
        (f.clip_l_tokenizer.is_some(), "--clip-l-tokenizer"),
        (f.clip.is_some(), "--clip"),
        (!request.placement.gpus.is_empty(), "--gpus"),
        (request.fp8.is_some(), "--fp8"),
        (request.tiled, "--tiled"),
        (request.blocks_to_swap > 0, "--blocks-to-swap"),
        (!request.controls.is_empty(), "--control"),
    ]
    .into_iter()
    .filter_map(|(given, name)| given.then_some(name))
    .collect()
}

/// The request as one of the demo's sample prompts.
fn prompt_spec(request: &GenerationRequest, seed: u64) -> PromptSpec {
    PromptSpec {
        prompt: request.prompt.clone(),
        negative: request.negative.clone(),
        width: request.width.unwrap_or(DEMO_SIZE),
        height: request.height.unwrap_or(DEMO_SIZE),
        frames: Some(request.frames.unwrap_or(DEMO_FRAMES)),
        seed,
        steps: request.steps.unwrap_or(DEMO_STEPS),
        guidance: Some(request.guidance.unwrap_or(DEMO_GUIDANCE)),
        flow_shift: Some(request.shift.unwrap_or(DEMO_SHIFT)),
        image: request.image.clone(),
        controls: Vec::new(),
    }
}

/// Generates the clip `request` asks for with the demo model and its LoRAs.
pub fn generate(
    request: &GenerationRequest,
    session: &mut Session,
) -> anyhow::Result<GenerationOutput> {
    let foreign = foreign_options(request);
    if !foreign.is_empty() {
        anyhow::bail!(
            "{} {} not taken by the built-in demo model, which needs no model files and runs on one device: drop {}",
            foreign.join(", "),
            if foreign.len() == 1 { "is" } else { "are" },
            if foreign.len() == 1 { "it" } else { "them" },
        );
    }
    create_out_folder(&request.out)?;
    let device = open_device(request.placement.device)?;
    let dtype = pick_dtype(request.dtype, &device)?;
    let cfg = demo_model_config();
    let seed = request.seed.unwrap_or_else(rand::random);
    let spec = prompt_spec(request, seed);
    let (width, height, steps) = (spec.width, spec.height, spec.steps);
    let prompt = demo_sample_prompts(vec![spec], &cfg, &device)?
        .pop()
        .ok_or_else(|| anyhow::anyhow!("the demo model made no prompt"))?;
    let tensors = demo::base::demo_base_weights(&cfg, DEMO_BASE_SEED, &device)?;
    let options = ModelOptions {
        residual_dtype: DType::F32,
        blocks_fp8: None,
        fp8_products: false,
    };
    let mut model = build_dit(
        &cfg,
        Vb::from_tensors(tensors, dtype, &device),
        &options,
        None,
    )?;
    session.log("DiT: the built-in demo model");
    if let Some((lora, multiplier)) = loras_as_one(&request.loras, &device, session)? {
        lora.apply(model.linears_mut(), multiplier, dtype)
            .map_err(|e| {
                anyhow::anyhow!(
                    "the LoRA does not fit the demo model (a LoRA made for another model?): {e}"
                )
            })?;
    }
    session.log(format!(
        "seed {seed}, {width}x{height}, {} frames, {steps} steps{}",
        request.frames.unwrap_or(DEMO_FRAMES),
        if prompt.image.is_some() {
            ", from the start image"
        } else {
            ""
        }
    ));
    let denoise = GenerateRequest {
        context: &prompt.context,
        negative: prompt.negative.as_ref(),
        latent_shape: prompt.latent_shape,
        steps: prompt.steps,
        shift: prompt.shift,
        guidance: prompt.guidance,
        seed: prompt.seed,
        solver: request.solver.unwrap_or(Solver::Unipc),
    };
    let clock = StepClock::new(session, vec![device.clone()], steps);
    let mut experts = Experts::single(&mut model);
    let result = generate_from(&mut experts, &denoise, prompt.image.as_ref(), &|| {
        clock.poll()
    });
    let latents = clock.checked(result.map_err(anyhow::Error::from))?;
    let starts = clock.finish()?;
    let denoised = starts.last().copied().unwrap_or_else(Instant::now);
    let frames = demo::codec::decode(&latents)?;
    let decode_secs = denoised.elapsed().as_secs_f64();
    session.log(timing_line(&starts, decode_secs, &[]));
    let frames_dir = write_clip(&request.out, &frames, CLIP_FPS)?;
    Ok(GenerationOutput {
        file: request.out.clone(),
        frames_dir: Some(frames_dir),
        frames: frames.len(),
        width,
        height,
        seed,
    })
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::HashMap;
    use std::path::Path;

    use candle_core::{Device, Tensor};
    use framesmith_config::run::DeviceSpec;

    use super::*;
    use crate::generate::request::{Cancelled, DitSource, GenerationEvent, LoraChoice};

    /// A demo request for `out`: 3 steps on the CPU, seed 7.
    fn request(out: &Path) -> GenerationRequest {
        let mut request = GenerationRequest::new(
            DitSource::Demo,
            "a red circle moving right on a yellow background",
            out,
        );
        request.steps = Some(3);
        request.seed = Some(7);
        request.placement.device = DeviceSpec::Cpu;
        request
    }

    fn generate(
        request: &GenerationRequest,
    ) -> anyhow::Result<(GenerationOutput, Vec<GenerationEvent>)> {
        let mut events = Vec::new();
        let output = crate::generate::run(request, &mut |e| events.push(e), &|| false)?;
        Ok((output, events))
    }

    fn frame(output: &GenerationOutput, i: usize) -> Vec<u8> {
        let dir = output.frames_dir.clone().unwrap_or_default();
        std::fs::read(dir.join(format!("frame_{i:04}.png"))).unwrap_or_default()
    }

    /// A rank-2 LoRA on the first block's query projection of the demo model (256 wide).
    fn write_lora(path: &Path) -> anyhow::Result<()> {
        let dev = Device::Cpu;
        let name = "lora_unet_blocks_0_self_attn_q";
        let tensors: HashMap<String, Tensor> = HashMap::from([
            (
                format!("{name}.lora_down.weight"),
                Tensor::ones((2, 256), DType::F32, &dev)?,
            ),
            (
                format!("{name}.lora_up.weight"),
                (Tensor::ones((256, 2), DType::F32, &dev)? * 0.05)?,
            ),
            (format!("{name}.alpha"), Tensor::new(2f32, &dev)?),
        ]);
        candle_core::safetensors::save(&tensors, path)?;
        Ok(())
    }

    #[test]
    fn the_demo_model_makes_one_clip_per_seed_and_its_lora_changes_it() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let (a, events) = generate(&request(&dir.path().join("a.mp4")))?;
        let (b, _) = generate(&request(&dir.path().join("b.mp4")))?;
        assert_eq!(
            (a.frames, a.width, a.height, a.seed),
            (DEMO_FRAMES, DEMO_SIZE, DEMO_SIZE, 7)
        );
        assert!(a.file.is_file());
        let steps: Vec<usize> = events
            .iter()
            .filter_map(|e| match e {
                GenerationEvent::StepStarted { step, steps: 3 } => Some(*step),
                _ => None,
            })
            .collect();
        assert_eq!(steps, vec![0, 1, 2]);
        for i in 0..a.frames {
            assert!(
                !frame(&a, i).is_empty() && frame(&a, i) == frame(&b, i),
                "frame {i}"
            );
        }
        let lora = dir.path().join("lora.safetensors");
        write_lora(&lora)?;
        let mut with_lora = request(&dir.path().join("c.mp4"));
        with_lora.loras.push(LoraChoice {
            path: lora,
            strength: 1.0,
        });
        let (c, events) = generate(&with_lora)?;
        assert!(
            (0..a.frames).any(|i| frame(&a, i) != frame(&c, i)),
            "the LoRA changes nothing"
        );
        assert!(events
            .iter()
            .any(|e| matches!(e, GenerationEvent::Log(l) if l.starts_with("LoRA: "))));
        Ok(())
    }

    #[test]
    fn the_start_image_is_the_clips_first_frame() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let image = dir.path().join("start.png");
        let size = DEMO_SIZE as u32;
        image::RgbImage::from_fn(size, size, |x, y| {
            image::Rgb([(x * 4) as u8, (y * 4) as u8, 90])
        })
        .save(&image)?;
        let mut asked = request(&dir.path().join("i.mp4"));
        asked.image = Some(image.clone());
        let (out, _) = generate(&asked)?;
        let first = image::load_from_memory(&frame(&out, 0))?.to_rgb8();
        assert_eq!(first, image::open(&image)?.to_rgb8());
        Ok(())
    }

    #[test]
    fn cancelling_stops_between_steps_and_writes_nothing() {
        let dir = tempfile::tempdir().map_err(anyhow::Error::from);
        let Ok(dir) = dir else { panic!("tempdir") };
        let out = dir.path().join("x.mp4");
        let started = Cell::new(0usize);
        let result = crate::generate::run(
            &request(&out),
            &mut |e| {
                if matches!(e, GenerationEvent::StepStarted { .. }) {
                    started.set(started.get() + 1);
                }
            },
            &|| started.get() >= 2,
        );
        let err = result
            .err()
            .unwrap_or_else(|| panic!("generation was not cancelled"));
        assert!(err.downcast_ref::<Cancelled>().is_some(), "{err:#}");
        assert_eq!(
            started.get(),
            2,
            "polled once before each step, stopped at the second"
        );
        assert!(!out.exists());
    }

    #[test]
    fn model_files_are_refused_for_the_demo_model() {
        let mut asked = request(Path::new("x.mp4"));
        asked.files.vae = Some("vae.pth".into());
        asked.blocks_to_swap = 1;
        let err = generate(&asked)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("--vae, --blocks-to-swap are not taken"),
            "{err}"
        );
    }
}
