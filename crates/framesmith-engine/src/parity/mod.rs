//! Parity checks against reference fixtures produced by the official Wan and FLUX.1 implementations (the format
//! of `shared/fixtures/{wan,flux}/README.md`): load a case directory, run the matching module, compare every expected tensor.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use anyhow::{bail, Context};
use candle_core::{DType, Device, Tensor, Var};
use framesmith_config::file_read::{read_string_bounded, ReadLimit};
use framesmith_nn::linear::Linear;
use framesmith_nn::lora::Lora;

pub mod flux_ae;
pub mod flux_dit;
pub mod flux_schedule;
pub mod flux_text;
pub mod hunyuan_video15;
pub mod hunyuan_video15_byt5;
pub mod hunyuan_video15_vae;
pub mod ltx2;
pub mod ltx2_audio;
pub mod ltx2_sampling;
pub mod ltx2_text;
pub mod ltx2_vae;
pub mod qwen25vl;
pub mod schedulers;
pub mod siglip;
pub mod umt5;
pub mod vae;
pub mod wan_dit;

/// A full-rank identity LoRA ([`Lora::identity`]: ∂L/∂up = ∂L/∂W) on every Linear of `linears` whose weight
/// gradient the fixture holds, so the base weight stays off candle's autograd path; returns each with its `up`.
fn attach_identity_loras<'a>(
    linears: impl IntoIterator<Item = (String, &'a mut Linear)>,
    fixture: &Fixture,
) -> anyhow::Result<Vec<(String, Var)>> {
    let mut out = Vec::new();
    for (path, linear) in linears {
        if !fixture
            .expected
            .contains_key(&format!("grad.{path}.weight"))
        {
            continue;
        }
        let lora = Lora::identity(
            [linear.in_dim(), linear.out_dim()],
            DType::F32,
            &Device::Cpu,
        )?;
        out.push((path, lora.up.clone()));
        linear.set_lora(Some(lora));
    }
    Ok(out)
}

/// Relative tolerance for outputs and intermediates (f32).
pub const OUTPUT_REL_TOL: f64 = 1e-4;
/// Relative tolerance for gradients (f32).
pub const GRAD_REL_TOL: f64 = 1e-3;

/// One compared tensor.
#[derive(Debug, Clone)]
pub struct ParityRow {
    pub name: String,
    pub shape: Vec<usize>,
    pub max_abs: f64,
    /// ‖got − expected‖ / ‖expected‖.
    pub rel: f64,
    pub tolerance: f64,
    pub passed: bool,
}

impl fmt::Display for ParityRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<4} {:<48} {:<18} max_abs {:>10.3e}  rel {:>10.3e}  (tol {:.0e})",
            if self.passed { "ok" } else { "FAIL" },
            self.name,
            format!("{:?}", self.shape),
            self.max_abs,
            self.rel,
            self.tolerance
        )
    }
}

/// Compares `got` with `expected` (any float dtype, same shape) with relative tolerance `tol`.
/// A shape mismatch or a non-finite value fails the row.
pub fn compare(name: &str, got: &Tensor, expected: &Tensor, tol: f64) -> anyhow::Result<ParityRow> {
    let shape = expected.dims().to_vec();
    if got.dims() != expected.dims() {
        return Ok(ParityRow {
            name: format!("{name} (shape {:?} != {:?})", got.dims(), expected.dims()),
            shape,
            max_abs: f64::INFINITY,
            rel: f64::INFINITY,
            tolerance: tol,
            passed: false,
        });
    }
    let g = got.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let e = expected
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    let mut max_abs = 0f64;
    let mut diff2 = 0f64;
    let mut ref2 = 0f64;
    let mut finite = true;
    for (a, b) in g.iter().zip(&e) {
        finite &= a.is_finite();
        let d = (a - b).abs();
        max_abs = max_abs.max(d);
        diff2 += d * d;
        ref2 += b * b;
    }
    let rel = if ref2 > 0.0 {
        (diff2 / ref2).sqrt()
    } else {
        diff2.sqrt()
    };
    let passed = finite && rel <= tol;
    Ok(ParityRow {
        name: name.to_string(),
        shape,
        max_abs: if finite { max_abs } else { f64::NAN },
        rel: if finite { rel } else { f64::NAN },
        tolerance: tol,
        passed,
    })
}

/// One row for each `(name, var)` whose expected gradient the fixture holds: the gradient `grads` has for `var`
/// (zeros where nothing reached it) against the fixture's, at [`GRAD_REL_TOL`]; names it does not hold are skipped.
pub(crate) fn grad_rows<'a>(
    fixture: &Fixture,
    grads: &candle_core::backprop::GradStore,
    vars: impl IntoIterator<Item = (String, &'a candle_core::Var)>,
) -> anyhow::Result<Vec<ParityRow>> {
    let mut rows = Vec::new();
    for (key, var) in vars {
        let Some(expected) = fixture.expected.get(&key) else {
            continue;
        };
        let got = grads
            .get(var.as_tensor())
            .cloned()
            .map_or_else(|| var.as_tensor().zeros_like(), Ok)?;
        rows.push(compare(&key, &got, expected, GRAD_REL_TOL)?);
    }
    Ok(rows)
}

/// Compares integer tensors exactly (scheduler timesteps).
pub fn compare_exact(name: &str, got: &[i64], expected: &Tensor) -> anyhow::Result<ParityRow> {
    let e = expected
        .to_dtype(DType::I64)?
        .flatten_all()?
        .to_vec1::<i64>()?;
    let mismatches =
        got.iter().zip(&e).filter(|(a, b)| a != b).count() + got.len().abs_diff(e.len());
    let max_abs = got
        .iter()
        .zip(&e)
        .map(|(a, b)| a.abs_diff(*b) as f64)
        .fold(0.0, f64::max);
    Ok(ParityRow {
        name: name.to_string(),
        shape: expected.dims().to_vec(),
        max_abs,
        rel: mismatches as f64,
        tolerance: 0.0,
        passed: mismatches == 0,
    })
}

/// A fixture case directory: its `config.json` and the three safetensors files (weights absent for schedulers).
pub struct Fixture {
    pub config: serde_json::Value,
    pub weights: HashMap<String, Tensor>,
    pub inputs: HashMap<String, Tensor>,
    pub expected: HashMap<String, Tensor>,
}

impl Fixture {
    /// Reads a case directory.
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let config_path = dir.join("config.json");
        let text = read_string_bounded(&config_path, ReadLimit::JSON)
            .with_context(|| format!("cannot read the fixture config {}", config_path.display()))?;
        let config: serde_json::Value = serde_json::from_str(&text).with_context(|| {
            format!(
                "the fixture config is not valid JSON: {}",
                config_path.display()
            )
        })?;
        let read = |name: &str, required: bool| -> anyhow::Result<HashMap<String, Tensor>> {
            let path = dir.join(name);
            if !path.exists() && !required {
                return Ok(HashMap::new());
            }
            candle_core::safetensors::load(&path, &Device::Cpu)
                .with_context(|| format!("cannot read the fixture tensors {}", path.display()))
        };
        Ok(Self {
            weights: read("weights.safetensors", false)?,
            inputs: read("inputs.safetensors", true)?,
            expected: read("expected.safetensors", true)?,
            config,
        })
    }

    /// The fixture's `kind`: one of the names in [`KINDS`] (what [`check_fixture`] runs).
    pub fn kind(&self) -> &str {
        self.config
            .get("kind")
            .and_then(|v| v.as_str())
            .unwrap_or("")
    }

    /// An input tensor by name.
    pub fn input(&self, name: &str) -> anyhow::Result<&Tensor> {
        self.inputs
            .get(name)
            .with_context(|| format!("the fixture has no input `{name}`"))
    }

    /// An expected tensor by name.
    pub fn expected(&self, name: &str) -> anyhow::Result<&Tensor> {
        self.expected
            .get(name)
            .with_context(|| format!("the fixture has no expected tensor `{name}`"))
    }
}

/// How one kind of fixture is checked: the fixture and its directory (for tokenizers beside it) in, its rows out.
type Checker = fn(&Fixture, &Path) -> anyhow::Result<Vec<ParityRow>>;

/// Every fixture kind `check-parity` handles, with its check.
const KINDS: &[(&str, Checker)] = &[
    ("wan_dit", |f, _| wan_dit::check(f)),
    ("wan_vae", |f, _| vae::check(f)),
    ("umt5", |f, _| umt5::check(f)),
    ("flow_unipc", |f, _| schedulers::check(f)),
    ("flow_dpmpp", |f, _| schedulers::check(f)),
    ("flux_dit", |f, _| flux_dit::check(f)),
    ("flux_ae", |f, _| flux_ae::check(f)),
    ("clip_text", |f, _| flux_text::check_clip(f)),
    ("t5_encoder", |f, _| flux_text::check_t5(f)),
    ("flux_schedule", |f, _| flux_schedule::check(f)),
    ("qwen25vl_text_encoder", qwen25vl::check),
    ("hunyuan_video15_transformer", |f, _| {
        hunyuan_video15::check(f)
    }),
    ("hunyuan_video15_vae", |f, _| hunyuan_video15_vae::check(f)),
    ("hunyuan_video15_byt5", hunyuan_video15_byt5::check),
    ("siglip_vision", siglip::check),
    ("ltx2_transformer", |f, _| ltx2::check(f)),
    ("ltx2_vae", |f, _| ltx2_vae::check(f)),
    ("ltx2_audio", |f, _| ltx2_audio::check(f)),
    ("ltx2_text", ltx2_text::check),
    ("ltx2_sampling", |f, _| ltx2_sampling::check(f)),
];

/// Runs the module a fixture directory describes and compares every expected tensor.
pub fn check_fixture(dir: &Path) -> anyhow::Result<Vec<ParityRow>> {
    let fixture = Fixture::load(dir)?;
    let kind = fixture.kind();
    match KINDS.iter().find(|(name, _)| *name == kind) {
        Some((_, check)) => check(&fixture, dir),
        None => bail!(
            "fixture kind `{kind}` is not handled yet (supported: {}) in {}",
            KINDS
                .iter()
                .map(|(name, _)| *name)
                .collect::<Vec<_>>()
                .join(", "),
            dir.display()
        ),
    }
}

#[cfg(test)]
mod tests;
