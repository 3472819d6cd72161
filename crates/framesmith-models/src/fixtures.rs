//! Where the reference fixtures live, how a case is read ([`FixtureCase`]) and how a result is compared with them,
//! for tests in every crate: `shared/fixtures/<family>/<case>` beside the checkout (`../shared`), or beside a
//! folder above it (a worktree or a workspace crate a few levels deeper), or a family's fixtures in this crate.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Shape, Tensor, Var};
use framesmith_nn::vb::TensorSource;

/// The fixtures of one model family (`wan`, `flux`): the nearest `shared/fixtures/<family>` found walking up from
/// this crate's folder, or the one beside the checkout when none exists (so a missing fixture names a real path).
pub fn family_dir(family: &str) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .skip(1)
        .map(|dir| dir.join("shared/fixtures").join(family))
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| crate_dir.join("../shared/fixtures").join(family))
}

/// The folder of one fixture case of `family`.
pub fn case_dir(family: &str, case: &str) -> PathBuf {
    family_dir(family).join(case)
}

/// One fixture case folder as the reference scripts write it, read on the CPU: `config.json` (the constructor's
/// `init` and the call's arguments) and the tensors of `weights.safetensors`, `inputs.safetensors` and
/// `expected.safetensors` (a file a case does not have reads as no tensors).
pub struct FixtureCase {
    pub config: serde_json::Value,
    pub weights: HashMap<String, Tensor>,
    pub inputs: HashMap<String, Tensor>,
    pub expected: HashMap<String, Tensor>,
}

impl FixtureCase {
    /// Reads the case in `dir`.
    pub fn load_dir(dir: &Path) -> anyhow::Result<Self> {
        let read = |file: &str| -> anyhow::Result<HashMap<String, Tensor>> {
            let path = dir.join(file);
            if !path.exists() {
                return Ok(HashMap::new());
            }
            Ok(candle_core::safetensors::load(path, &Device::Cpu)?)
        };
        Ok(Self {
            config: serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?,
            weights: read("weights.safetensors")?,
            inputs: read("inputs.safetensors")?,
            expected: read("expected.safetensors")?,
        })
    }

    /// The input tensor `name`.
    pub fn input(&self, name: &str) -> anyhow::Result<&Tensor> {
        self.inputs
            .get(name)
            .ok_or_else(|| anyhow::anyhow!("no input `{name}`"))
    }

    /// The expected tensor `name`.
    pub fn expected(&self, name: &str) -> anyhow::Result<&Tensor> {
        self.expected
            .get(name)
            .ok_or_else(|| anyhow::anyhow!("no expected `{name}`"))
    }

    /// Checks the gradients of the probe loss `Σ out · probe` against the case's `grad.*` tensors: those of the
    /// `inputs` (`("grad.img", var)`, …) within `tol` (atol, rtol), and those of the identity LoRAs' factors that
    /// stand for the weights `weights` (`(path, var)`: `grad.{path}.weight`) within `weight_tol`, which must cover
    /// every weight gradient the case has (`name` in that message). Returns the largest absolute error.
    pub fn check_probe_gradients(
        &self,
        name: &str,
        out: &Tensor,
        inputs: &[(&str, &Var)],
        weights: &[(String, Var)],
        (tol, weight_tol): ((f64, f64), (f64, f64)),
    ) -> anyhow::Result<f64> {
        let loss = (out * self.input("probe")?)?.sum_all()?;
        let grads = loss.backward()?;
        let grad = |var: &Var| -> anyhow::Result<Tensor> {
            grads
                .get(var.as_tensor())
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("no gradient"))
        };
        let mut worst = 0f64;
        for (key, var) in inputs {
            let err = assert_close(key, &grad(var)?, self.expected(key)?, tol.0, tol.1)?;
            worst = worst.max(err);
        }
        for (path, up) in weights {
            let key = format!("grad.{path}.weight");
            let (atol, rtol) = weight_tol;
            worst = worst.max(assert_close(
                &key,
                &grad(up)?,
                self.expected(&key)?,
                atol,
                rtol,
            )?);
        }
        let expected_weight_grads = self
            .expected
            .keys()
            .filter(|k| k.starts_with("grad.") && k.ends_with(".weight"))
            .count();
        anyhow::ensure!(
            expected_weight_grads == weights.len(),
            "{name}: {expected_weight_grads} weight gradients expected, {} checked",
            weights.len()
        );
        Ok(worst)
    }
}

/// The tensors of a state dict's shapes (name → shape) as broadcast bf16 zeros: every shape is right and nothing is
/// allocated, so a test can build a model of the released size (and its LoRA) without its weights.
pub struct ZeroTensors(pub HashMap<String, Vec<usize>>);

impl TensorSource for ZeroTensors {
    fn contains(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    fn read(&self, key: &str) -> candle_core::Result<Option<Tensor>> {
        let Some(shape) = self.0.get(key) else {
            return Ok(None);
        };
        let zero = Tensor::zeros((), DType::BF16, &Device::Cpu)?;
        zero.broadcast_as(Shape::from(shape.clone())).map(Some)
    }
}

/// Checks |got − want| ≤ atol + rtol·|want| element-wise; returns the largest absolute error.
pub fn assert_close(
    name: &str,
    got: &Tensor,
    want: &Tensor,
    atol: f64,
    rtol: f64,
) -> anyhow::Result<f64> {
    anyhow::ensure!(
        got.dims() == want.dims(),
        "{name}: shape {:?}, expected {:?}",
        got.dims(),
        want.dims()
    );
    let g = got.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let w = want.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let (mut max_abs, mut diff2, mut ref2) = (0f64, 0f64, 0f64);
    let mut worst: Option<String> = None;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let d = (a - b).abs();
        let within = d <= atol + rtol * b.abs();
        if !within && worst.is_none() {
            worst = Some(format!("element {i} is {a}, expected {b} (error {d:e})"));
        }
        max_abs = max_abs.max(d);
        diff2 += d * d;
        ref2 += b * b;
    }
    let rel = (diff2 / ref2.max(f64::MIN_POSITIVE)).sqrt();
    if let Some(worst) = worst {
        anyhow::bail!("{name}: {worst} (max abs error {max_abs:.3e}, relative {rel:.3e})");
    }
    Ok(max_abs)
}

/// The folder of one Wan fixture case.
pub fn wan_case(case: &str) -> PathBuf {
    case_dir("wan", case)
}

/// A word-level `tokenizer.json`: `specials` first (ids 0, 1, …), then `words`; `single` is the template of one
/// sequence (JSON), whose special tokens are all of `specials`. Unknown words read as the first of `words`.
fn word_level_tokenizer(specials: &[&str], words: &[&str], single: &str) -> String {
    let vocab: Vec<String> = specials
        .iter()
        .chain(words)
        .enumerate()
        .map(|(i, w)| format!("\"{w}\":{i}"))
        .collect();
    let added: Vec<String> = specials
        .iter()
        .enumerate()
        .map(|(i, w)| {
            format!(
                "{{\"id\":{i},\"content\":\"{w}\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\
                 \"normalized\":false,\"special\":true}}"
            )
        })
        .collect();
    let special: Vec<String> = specials
        .iter()
        .enumerate()
        .map(|(id, t)| format!("\"{t}\":{{\"id\":\"{t}\",\"ids\":[{id}],\"tokens\":[\"{t}\"]}}"))
        .collect();
    format!(
        "{{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[{}],\"normalizer\":null,\
         \"pre_tokenizer\":{{\"type\":\"Whitespace\"}},\"post_processor\":{{\"type\":\"TemplateProcessing\",\
         \"single\":{single},\"pair\":[{{\"Sequence\":{{\"id\":\"A\",\"type_id\":0}}}}],\"special_tokens\":{{{}}}}},\
         \"decoder\":null,\"model\":{{\"type\":\"WordLevel\",\"vocab\":{{{}}},\"unk_token\":\"{}\"}}}}",
        added.join(","),
        special.join(","),
        vocab.join(","),
        words.first().copied().unwrap_or("<unk>")
    )
}

/// A word-level CLIP `tokenizer.json` of `words`: `<|startoftext|> … <|endoftext|>` around each sequence.
pub fn clip_tokenizer_json(words: &[&str]) -> String {
    word_level_tokenizer(
        &["<|startoftext|>", "<|endoftext|>"],
        words,
        "[{\"SpecialToken\":{\"id\":\"<|startoftext|>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\
         \"type_id\":0}},{\"SpecialToken\":{\"id\":\"<|endoftext|>\",\"type_id\":0}}]",
    )
}

/// A word-level T5 `tokenizer.json` of `words`: `<pad>` 0, `</s>` 1 after each sequence.
pub fn t5_tokenizer_json(words: &[&str]) -> String {
    word_level_tokenizer(
        &["<pad>", "</s>"],
        words,
        "[{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}]",
    )
}

/// The tiny FLUX.1 text encoders laid out in `dir` as people have them: `clip/clip_l.safetensors` beside its
/// `config.json` (the tiny CLIP's heads are not one per 64 channels) and `t5/t5xxl_fp16.safetensors`, each beside a
/// word-level `tokenizer.json` of `words`. Returns the CLIP-L and T5 paths.
pub fn flux_text_encoders(dir: &Path, words: &[&str]) -> anyhow::Result<(PathBuf, PathBuf)> {
    let (clip_dir, t5_dir) = (dir.join("clip"), dir.join("t5"));
    std::fs::create_dir_all(&clip_dir)?;
    std::fs::create_dir_all(&t5_dir)?;
    let clip_l = clip_dir.join("clip_l.safetensors");
    std::fs::copy(
        case_dir("flux", "clip_l").join("weights.safetensors"),
        &clip_l,
    )?;
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        case_dir("flux", "clip_l").join("config.json"),
    )?)?;
    std::fs::write(clip_dir.join("config.json"), config["init"].to_string())?;
    std::fs::write(clip_dir.join("tokenizer.json"), clip_tokenizer_json(words))?;
    let t5 = t5_dir.join("t5xxl_fp16.safetensors");
    std::fs::copy(
        case_dir("flux", "t5_encoder").join("weights.safetensors"),
        &t5,
    )?;
    std::fs::write(t5_dir.join("tokenizer.json"), t5_tokenizer_json(words))?;
    Ok((clip_l, t5))
}
