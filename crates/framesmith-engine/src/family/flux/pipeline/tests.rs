//! FLUX.1 images on the CPU with the official code's tiny fixtures (the dev DiT, the autoencoder with 2×
//! down-sampling): the loop is the official Euler loop on the shifted schedule, a seed gives one image of the asked
//! size, bad settings and a cancel are refused.

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{
    decode_image, denoise_image, generate_image, start_noise, Cancelled, FluxImageSettings,
    FluxPrompt,
};
use framesmith_models::flux::autoencoder::AutoEncoder;
use framesmith_models::flux::sampling::{pack, prepare, schedule, Shift};
use framesmith_models::flux::weights::{load_autoencoder, load_dit, FluxVariant};
use framesmith_models::flux::{Flux, FluxInputs};
use framesmith_nn::init::randn;

fn fixture(case: &str) -> std::path::PathBuf {
    framesmith_models::fixtures::case_dir("flux", case).join("weights.safetensors")
}

fn models() -> anyhow::Result<(Flux, AutoEncoder)> {
    let dev = &Device::Cpu;
    let dit = load_dit(
        &fixture("flux_dit"),
        Some(FluxVariant::Dev),
        DType::F32,
        dev,
        None,
    )?;
    let ae = load_autoencoder(&fixture("flux_ae"), DType::F32, dev)?;
    Ok((dit, ae))
}

fn prompt(seed: u64) -> anyhow::Result<FluxPrompt> {
    let rng = &mut StdRng::seed_from_u64(seed);
    Ok(FluxPrompt {
        txt: randn(rng, (1, 5, 32), 0.0, 1.0, &Device::Cpu)?,
        vec: randn(rng, (1, 32), 0.0, 1.0, &Device::Cpu)?,
        control: None,
    })
}

fn settings(seed: u64) -> FluxImageSettings {
    FluxImageSettings {
        width: 24,
        height: 16,
        steps: 3,
        guidance: 3.5,
        seed,
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> anyhow::Result<f32> {
    Ok((a - b)?.abs()?.max_all()?.to_scalar::<f32>()?)
}

#[test]
fn the_loop_is_euler_on_the_shifted_schedule_with_the_guidance_input() -> anyhow::Result<()> {
    let (dit, _) = models()?;
    let p = prompt(1)?;
    let s = settings(7);
    let latent = [8, 12];
    let got = denoise_image(&dit, &p, &s, latent, DType::F32, &|| false)?;
    assert_eq!(got.dims(), [1, 16, 8, 12]);

    // By hand: the seed's noise, packed; x ← x + (t_next − t)·v(x, t, guidance) on dev's shifted schedule.
    let noise = start_noise(7, latent, &Device::Cpu)?;
    let [mut x, img_ids, txt_ids] = prepare(&noise, 5)?;
    let ts = schedule(3, 24, Some(Shift::default()));
    assert!(
        ts[1] > 2.0 / 3.0,
        "dev's schedule is shifted towards 1: {ts:?}"
    );
    for pair in ts.windows(2) {
        let inputs = FluxInputs {
            img: x.clone(),
            img_ids: img_ids.clone(),
            txt: p.txt.clone(),
            txt_ids: txt_ids.clone(),
            timesteps: Tensor::new(&[pair[0]], &Device::Cpu)?,
            y: p.vec.clone(),
            guidance: Some(Tensor::new(&[3.5f32], &Device::Cpu)?),
        };
        let v = dit.forward(&inputs)?;
        x = (x + (v * f64::from(pair[1] - pair[0]))?)?;
    }
    // Unpacked: token (i, j)'s channels c·4 + 2a + b are latent pixel (c, 2i + a, 2j + b).
    let want = x
        .reshape((1, 4, 6, 16, 2, 2))?
        .permute((0, 3, 1, 4, 2, 5))?
        .reshape((1, 16, 8, 12))?;
    assert!(max_abs_diff(&got, &want)? < 1e-5);
    assert_eq!(pack(&got)?.dims(), [1, 24, 64]);

    // Another guidance strength is another image: the DiT reads it.
    let other = FluxImageSettings {
        guidance: 1.0,
        ..s.clone()
    };
    let moved = denoise_image(&dit, &p, &other, latent, DType::F32, &|| false)?;
    assert!(max_abs_diff(&got, &moved)? > 1e-4);
    Ok(())
}

#[test]
fn a_seed_gives_one_image_of_the_asked_size() -> anyhow::Result<()> {
    let (dit, ae) = models()?;
    let p = prompt(2)?;
    let a = generate_image(&dit, &ae, &p, &settings(11), DType::F32, &|| false)?;
    assert_eq!(a.dimensions(), (24, 16));
    let again = generate_image(&dit, &ae, &p, &settings(11), DType::F32, &|| false)?;
    assert_eq!(a, again);
    let b = generate_image(&dit, &ae, &p, &settings(12), DType::F32, &|| false)?;
    assert_ne!(a, b);

    // The decoder's output in [−1, 1] maps to 0..=255 as the official cli saves it.
    let z = Tensor::zeros((1, 16, 8, 12), DType::F32, &Device::Cpu)?;
    let x = ae.decode(&z)?.clamp(-1f32, 1f32)?;
    let img = decode_image(&ae, &z, DType::F32)?;
    let v = x.get(0)?.get(1)?.get(3)?.get(5)?.to_scalar::<f32>()?;
    assert_eq!(img.get_pixel(5, 3)[1], (127.5 * (v + 1.0)).floor() as u8);
    Ok(())
}

#[test]
fn bad_settings_and_a_cancel_are_refused() -> anyhow::Result<()> {
    let (dit, ae) = models()?;
    let p = prompt(3)?;
    for (s, needle) in [
        (
            FluxImageSettings {
                width: 26,
                ..settings(1)
            },
            "--width 26",
        ),
        (
            FluxImageSettings {
                height: 0,
                ..settings(1)
            },
            "--height 0",
        ),
        (
            FluxImageSettings {
                steps: 0,
                ..settings(1)
            },
            "--steps 0",
        ),
        (
            FluxImageSettings {
                guidance: f64::NAN,
                ..settings(1)
            },
            "--guidance NaN",
        ),
    ] {
        let err = generate_image(&dit, &ae, &p, &s, DType::F32, &|| false)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(err.contains(needle), "{needle}: {err}");
    }
    // The real autoencoder's 8× down-sampling: sides in multiples of 16.
    let err = FluxImageSettings {
        width: 1000,
        ..settings(1)
    }
    .latent_size(8)
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.contains("multiples of 16 pixels (e.g. 992)"), "{err}");
    assert_eq!(
        FluxImageSettings {
            width: 1024,
            height: 768,
            ..settings(1)
        }
        .latent_size(8)?,
        [96, 128]
    );

    let Err(err) = generate_image(&dit, &ae, &p, &settings(1), DType::F32, &|| true) else {
        panic!("a cancelled run fails");
    };
    assert!(err.downcast_ref::<Cancelled>().is_some(), "{err:#}");
    Ok(())
}

#[test]
fn a_kontext_sample_follows_its_control_image() -> anyhow::Result<()> {
    let (dit, _) = models()?;
    let s = settings(7);
    let latent = [8, 12];
    let rng = &mut StdRng::seed_from_u64(3);
    let with = |control: Option<Tensor>| -> anyhow::Result<Tensor> {
        let p = FluxPrompt {
            control,
            ..prompt(1)?
        };
        denoise_image(&dit, &p, &s, latent, DType::F32, &|| false)
    };
    // A control of another size than the image is fine: its tokens have their own ids.
    let a = with(Some(randn(rng, (1, 16, 8, 8), 0.0, 1.0, &Device::Cpu)?))?;
    let b = with(Some(randn(rng, (1, 16, 8, 8), 0.0, 1.0, &Device::Cpu)?))?;
    let none = with(None)?;
    assert_eq!(a.dims(), [1, 16, 8, 12]);
    assert!(max_abs_diff(&a, &b)? > 1e-4, "two controls, two images");
    assert!(max_abs_diff(&a, &none)? > 1e-4, "the control is read");
    Ok(())
}
