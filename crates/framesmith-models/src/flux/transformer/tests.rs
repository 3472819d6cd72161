//! Parity of the FLUX.1 DiT with the official code (`shared/fixtures/flux/flux_dit*`): RoPE table, conditioning
//! vector, first double- and single-stream block outputs, the output, and the gradients of the inputs and of
//! every Linear weight of the first block of each kind.

use candle_core::{DType, Device, Tensor, Var};

use crate::flux::testkit::{assert_close, Case};
use crate::flux::{Flux, FluxConfig, FluxInputs};
use framesmith_nn::lora::Lora;
use framesmith_nn::vb::Vb;

const ATOL: f64 = 1e-4;
const RTOL: f64 = 1e-4;

/// A full-rank LoRA whose `down` is the identity (scale 1, `up` = 0) on every Linear the fixture has a weight
/// gradient for: ∂L/∂up = ∂L/∂W, while the frozen base stays off candle's autograd path.
fn identity_loras(model: &mut Flux, case: &Case) -> anyhow::Result<Vec<(String, Var)>> {
    let mut out = Vec::new();
    for (path, linear) in model.linears_mut() {
        if !case.expected.contains_key(&format!("grad.{path}.weight")) {
            continue;
        }
        let lora = Lora::identity(
            [linear.in_dim(), linear.out_dim()],
            DType::F32,
            &Device::Cpu,
        )?;
        let up = lora.up.clone();
        linear.set_lora(Some(lora));
        out.push((path, up));
    }
    Ok(out)
}

fn check_case(name: &str) -> anyhow::Result<()> {
    let case = Case::load(name)?;
    let cfg = FluxConfig::from_json(&case.config["init"].to_string())?;
    let vb = Vb::from_tensors(case.weights.clone(), DType::F32, &Device::Cpu);
    let mut model = Flux::new(&cfg, &vb)?;
    let weight_grads = identity_loras(&mut model, &case)?;
    anyhow::ensure!(
        !weight_grads.is_empty(),
        "{name}: no weight gradients matched"
    );

    let img = Var::from_tensor(case.input("img")?)?;
    let txt = Var::from_tensor(case.input("txt")?)?;
    let inputs = FluxInputs {
        img: img.as_tensor().clone(),
        img_ids: case.input("img_ids")?.clone(),
        txt: txt.as_tensor().clone(),
        txt_ids: case.input("txt_ids")?.clone(),
        timesteps: case.input("timesteps")?.clone(),
        y: case.input("y")?.clone(),
        guidance: case.inputs.get("guidance").cloned(),
    };
    let out = check_forward(&model, &cfg, &inputs, &case)?;
    check_gradients(name, &case, &out, (&img, &txt), &weight_grads)
}

/// Checks the RoPE table, the conditioning vector, the first double- and single-stream blocks' outputs and the
/// output against the fixture's; returns the output.
fn check_forward(
    model: &Flux,
    cfg: &FluxConfig,
    inputs: &FluxInputs,
    case: &Case,
) -> anyhow::Result<Tensor> {
    let prepared = model.prepare(inputs)?;
    let official_pe = prepared.blocks.rope.official_layout()?;
    assert_close("pe", &official_pe, case.expected("pe")?, 1e-6, 1e-6)?;
    assert_close(
        "vec",
        &prepared.blocks.vec,
        case.expected("vec")?,
        ATOL,
        RTOL,
    )?;

    let t = prepared.blocks.txt_len;
    let mut xs = prepared.xs.clone();
    for (i, block) in model.blocks.iter().enumerate() {
        xs = block.forward(&xs, &prepared.blocks)?;
        if i == 0 {
            let img_rows = xs.narrow(1, t, xs.dim(1)? - t)?;
            assert_close(
                "double_block0_img",
                &img_rows,
                case.expected("double_block0_img")?,
                ATOL,
                RTOL,
            )?;
            let txt_rows = xs.narrow(1, 0, t)?;
            assert_close(
                "double_block0_txt",
                &txt_rows,
                case.expected("double_block0_txt")?,
                ATOL,
                RTOL,
            )?;
        }
        if i == cfg.depth {
            assert_close(
                "single_block0_out",
                &xs,
                case.expected("single_block0_out")?,
                ATOL,
                RTOL,
            )?;
        }
    }
    let out = model.finish(&xs, &prepared)?;
    assert_close("out", &out, case.expected("out")?, ATOL, RTOL)?;
    let direct = model.forward(inputs)?;
    assert_close("forward", &direct, &out, 0.0, 0.0)?;
    Ok(out)
}

/// Checks the gradients of a probe loss on `out` against the fixture's: those of the `img` and `txt` inputs and of
/// every weight in `weight_grads`, which must cover every weight gradient the fixture has.
fn check_gradients(
    name: &str,
    case: &Case,
    out: &Tensor,
    (img, txt): (&Var, &Var),
    weight_grads: &[(String, Var)],
) -> anyhow::Result<()> {
    let inputs = [("grad.img", img), ("grad.txt", txt)];
    let tols = ((ATOL, RTOL), (1e-3, 1e-3));
    case.check_probe_gradients(name, out, &inputs, weight_grads, tols)?;
    Ok(())
}

#[test]
fn dev_matches_the_official_flux() -> anyhow::Result<()> {
    check_case("flux_dit")
}

#[test]
fn schnell_matches_the_official_flux() -> anyhow::Result<()> {
    check_case("flux_dit_schnell")
}

#[test]
fn kontext_matches_the_official_flux() -> anyhow::Result<()> {
    check_case("flux_dit_kontext")
}

#[test]
fn dev_without_guidance_is_an_error() -> anyhow::Result<()> {
    let case = Case::load("flux_dit")?;
    let cfg = FluxConfig::from_json(&case.config["init"].to_string())?;
    let model = Flux::new(
        &cfg,
        &Vb::from_tensors(case.weights.clone(), DType::F32, &Device::Cpu),
    )?;
    let inputs = FluxInputs {
        img: case.input("img")?.clone(),
        img_ids: case.input("img_ids")?.clone(),
        txt: case.input("txt")?.clone(),
        txt_ids: case.input("txt_ids")?.clone(),
        timesteps: case.input("timesteps")?.clone(),
        y: case.input("y")?.clone(),
        guidance: None,
    };
    let err = model
        .forward(&inputs)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("guidance"), "{err}");
    Ok(())
}
