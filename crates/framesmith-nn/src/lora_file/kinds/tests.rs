#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::adapter::AdapterKind;
use crate::init::randn;
use crate::linear::Linear;
use crate::lora::{attach_loras, LoraSet, LoraSpec};
use crate::lora_file::LoraFile;
use crate::testing::f32_bits;

const LOKR: AdapterKind = AdapterKind::Lokr {
    factor: -1,
    decompose_both: true,
    full_matrix: false,
};

fn tensor(rng: &mut StdRng, dims: &[usize], std: f32) -> Tensor {
    randn(rng, dims, 0.0, std, &Device::Cpu).unwrap()
}

/// Blocks 0 and 1 with `self_attn.q` [16, 16], `ffn.0` [64, 16] and `ffn.2` [16, 64], with biases.
fn toy_model(seed: u64) -> Vec<(String, Linear)> {
    let rng = &mut StdRng::seed_from_u64(seed);
    let mut layers = Vec::new();
    for i in 0..2 {
        for (name, out, inp) in [
            ("self_attn.q", 16, 16),
            ("ffn.0", 64, 16),
            ("ffn.2", 16, 64),
        ] {
            let w = tensor(rng, &[out, inp], 0.3);
            let b = tensor(rng, &[out], 0.1);
            layers.push((
                format!("blocks.{i}.{name}"),
                Linear::from_weights(w, Some(b)),
            ));
        }
    }
    layers
}

fn as_list(model: &mut [(String, Linear)]) -> Vec<(String, &mut Linear)> {
    model.iter_mut().map(|(p, l)| (p.clone(), l)).collect()
}

/// Adapters of `kind` (rank 2, alpha 3) on every layer, every factor random so nothing is zero.
fn trained(model: &mut [(String, Linear)], kind: AdapterKind, seed: u64) -> LoraSet {
    let spec = LoraSpec {
        rank: 2,
        alpha: 3.0,
        dtype: DType::F32,
        include_patterns: vec![],
        exclude_patterns: vec![],
        seed,
        kind,
    };
    let set = attach_loras(as_list(model), &spec).unwrap();
    let rng = &mut StdRng::seed_from_u64(seed);
    for v in set.vars() {
        let dims = v.dims().to_vec();
        v.set(&(v.as_tensor() + tensor(rng, &dims, 0.2)).unwrap())
            .unwrap();
    }
    set
}

fn outputs(model: &[(String, Linear)], x: &Tensor, y: &Tensor) -> Vec<Tensor> {
    model
        .iter()
        .map(|(_, l)| {
            let input = if l.in_dim() == 16 { x } else { y };
            l.forward_untracked(input).unwrap().0
        })
        .collect()
}

/// Each kind is written with the tensor names ComfyUI reads (`lokr_w1_a` …, `hada_w1_a` …, `lora_down.weight` with
/// `dora_scale`, and `alpha`), read back bit for bit into a fresh run's adapters, and attached to another model
/// it gives the trained model's outputs exactly.
#[test]
fn every_kind_is_written_as_comfyui_reads_it_and_read_back_bit_exactly() {
    let cases: [(AdapterKind, &[&str]); 3] = [
        (
            LOKR,
            &["alpha", "lokr_w1_a", "lokr_w1_b", "lokr_w2_a", "lokr_w2_b"],
        ),
        (
            AdapterKind::Loha,
            &["alpha", "hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"],
        ),
        (
            AdapterKind::Dora,
            &["alpha", "dora_scale", "lora_down.weight", "lora_up.weight"],
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let rng = &mut StdRng::seed_from_u64(9);
    let (x, y) = (tensor(rng, &[3, 16], 1.0), tensor(rng, &[3, 64], 1.0));
    for (kind, suffixes) in cases {
        let mut model = toy_model(1);
        let set = trained(&mut model, kind, 5);
        let path = dir.path().join(format!("{}.safetensors", kind.name()));
        let metadata =
            HashMap::from([("ss_network_module".to_string(), "lycoris.kohya".to_string())]);
        set.save(&path, DType::F32, &metadata).unwrap();

        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
        names.sort();
        let module = "lora_unet_blocks_0_ffn_0";
        let ours: Vec<&str> = names
            .iter()
            .filter_map(|n| n.strip_prefix(&format!("{module}.")))
            .collect();
        assert_eq!(ours, suffixes, "{kind:?}");
        let expected: usize = set.iter().map(|(_, a)| a.named_vars().len() + 1).sum();
        assert_eq!(names.len(), expected, "{kind:?}");
        if kind == AdapterKind::Dora {
            assert_eq!(
                st.tensor(&format!("{module}.dora_scale")).unwrap().shape(),
                [64, 1]
            );
        }

        let file = LoraFile::load(&path, &Device::Cpu).unwrap();
        assert!(
            file.modules.is_empty() && file.adapters.len() == 6,
            "{kind:?}"
        );
        assert_eq!(file.metadata, metadata);
        let mut fresh_model = toy_model(1);
        let fresh = trained(&mut fresh_model, kind, 77);
        fresh.load_weights(&file).unwrap();
        for (a, b) in set.vars().iter().zip(fresh.vars()) {
            assert_eq!(
                f32_bits(a.as_tensor()).unwrap(),
                f32_bits(b.as_tensor()).unwrap(),
                "{kind:?}"
            );
        }

        let mut other = toy_model(1);
        assert_eq!(file.apply(as_list(&mut other), 1.0, DType::F32).unwrap(), 6);
        for (a, b) in outputs(&model, &x, &y).iter().zip(outputs(&other, &x, &y)) {
            assert_eq!(f32_bits(a).unwrap(), f32_bits(&b).unwrap(), "{kind:?}");
        }
    }
}

/// Resuming into a run of another kind, or with another LoKr split, names the module and what differs.
#[test]
fn a_file_of_another_kind_is_refused_with_the_module_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loha.safetensors");
    let mut model = toy_model(1);
    trained(&mut model, AdapterKind::Loha, 5)
        .save(&path, DType::F32, &HashMap::new())
        .unwrap();
    let file = LoraFile::load(&path, &Device::Cpu).unwrap();
    for kind in [AdapterKind::Lora, LOKR, AdapterKind::Dora] {
        let mut fresh_model = toy_model(1);
        let e = trained(&mut fresh_model, kind, 5)
            .load_weights(&file)
            .unwrap_err()
            .to_string();
        // The first module in natural order.
        assert!(e.contains("lora_unet_blocks_0_ffn_0"), "{e}");
    }
}

/// The weight update of a LyCORIS-convention module, computed here from the formulas: LoKr `kron(w1, w2) · alpha /
/// rank` (rank: `w2_b`'s rows), LoHa `(w1_a w1_b) ⊙ (w2_a w2_b) · alpha / rank` — by loops over the entries.
fn lycoris_delta(
    kind: &str,
    t: &HashMap<&str, Vec<Vec<f32>>>,
    alpha: f32,
    [out, inp]: [usize; 2],
) -> Vec<Vec<f32>> {
    let mm = |a: &Vec<Vec<f32>>, b: &Vec<Vec<f32>>| -> Vec<Vec<f32>> {
        (0..a.len())
            .map(|i| {
                (0..b[0].len())
                    .map(|j| (0..b.len()).map(|k| a[i][k] * b[k][j]).sum())
                    .collect()
            })
            .collect()
    };
    let mut d = vec![vec![0f32; inp]; out];
    if kind == "lokr" {
        let (w1, w2) = (&t["lokr_w1"], mm(&t["lokr_w2_a"], &t["lokr_w2_b"]));
        let scale = alpha / t["lokr_w2_b"].len() as f32;
        let (c, dd) = (w2.len(), w2[0].len());
        for (r, row) in d.iter_mut().enumerate() {
            for (col, v) in row.iter_mut().enumerate() {
                *v = w1[r / c][col / dd] * w2[r % c][col % dd] * scale;
            }
        }
    } else {
        let (p1, p2) = (
            mm(&t["hada_w1_a"], &t["hada_w1_b"]),
            mm(&t["hada_w2_a"], &t["hada_w2_b"]),
        );
        let scale = alpha / t["hada_w1_b"].len() as f32;
        for (r, row) in d.iter_mut().enumerate() {
            for (col, v) in row.iter_mut().enumerate() {
                *v = p1[r][col] * p2[r][col] * scale;
            }
        }
    }
    d
}

/// LoKr and LoHa modules as LyCORIS writes them (full `lokr_w1`, low-rank `lokr_w2`; `hada_*`; ComfyUI's dotted
/// `diffusion_model.` names too) load into our model and change its weight by what the formulas say.
#[test]
fn lycoris_convention_files_load_and_apply_their_formulas() {
    let rng = &mut StdRng::seed_from_u64(11);
    let dir = tempfile::tempdir().unwrap();
    let rows = |t: &Tensor| t.to_vec2::<f32>().unwrap();
    for (kind, module) in [
        ("lokr", "lora_unet_blocks_1_ffn_0"),
        ("loha", "diffusion_model.blocks.1.ffn.0"),
    ] {
        let shapes: Vec<(&str, [usize; 2])> = if kind == "lokr" {
            // ffn.0 is [64, 16]: LyCORIS splits 64 = 8 × 8 and 16 = 4 × 4.
            vec![
                ("lokr_w1", [8, 4]),
                ("lokr_w2_a", [8, 2]),
                ("lokr_w2_b", [2, 4]),
            ]
        } else {
            vec![
                ("hada_w1_a", [64, 2]),
                ("hada_w1_b", [2, 16]),
                ("hada_w2_a", [64, 2]),
                ("hada_w2_b", [2, 16]),
            ]
        };
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        let mut values = HashMap::new();
        for (name, dims) in &shapes {
            let t = tensor(rng, dims, 0.5);
            values.insert(*name, rows(&t));
            tensors.insert(format!("{module}.{name}"), t);
        }
        tensors.insert(
            format!("{module}.alpha"),
            Tensor::new(1.5f32, &Device::Cpu).unwrap(),
        );
        let path = dir.path().join(format!("{kind}.safetensors"));
        candle_core::safetensors::save(&tensors, &path).unwrap();

        let file = LoraFile::load(&path, &Device::Cpu).unwrap();
        let mut model = toy_model(3);
        let before = rows(&model[4].1.base().dense(DType::F32).unwrap());
        file.apply(as_list(&mut model), 1.0, DType::F32).unwrap();
        let delta = lycoris_delta(kind, &values, 1.5, [64, 16]);
        // The adapted layer's weight, read through its forward on the identity (bias removed).
        let layer = &model[4].1;
        let eye = Tensor::eye(16, DType::F32, &Device::Cpu).unwrap();
        let bias = layer.bias().unwrap().unsqueeze(0).unwrap();
        let (y, _) = layer.forward_untracked(&eye).unwrap();
        let w = rows(&y.broadcast_sub(&bias).unwrap().t().unwrap());
        for r in 0..64 {
            for c in 0..16 {
                let want = before[r][c] + delta[r][c];
                assert!(
                    (w[r][c] - want).abs() < 1e-5,
                    "{kind} [{r}, {c}]: {} vs {want}",
                    w[r][c]
                );
            }
        }
    }
}

/// A DoRA module (`lora_down` / `lora_up` with `dora_scale` [out]) scales each row of `W + ΔW` to its magnitude.
#[test]
fn a_dora_file_rescales_each_output_row_to_its_magnitude() {
    let rng = &mut StdRng::seed_from_u64(12);
    let dir = tempfile::tempdir().unwrap();
    let module = "lora_unet_blocks_0_self_attn_q";
    let (down, up) = (tensor(rng, &[2, 16], 0.5), tensor(rng, &[16, 2], 0.5));
    let magnitude = (tensor(rng, &[16], 0.1) + 1.0).unwrap();
    let tensors = HashMap::from([
        (format!("{module}.lora_down.weight"), down.clone()),
        (format!("{module}.lora_up.weight"), up.clone()),
        (format!("{module}.dora_scale"), magnitude.clone()),
        (
            format!("{module}.alpha"),
            Tensor::new(4f32, &Device::Cpu).unwrap(),
        ),
    ]);
    let path = dir.path().join("dora.safetensors");
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let file = LoraFile::load(&path, &Device::Cpu).unwrap();
    let mut model = toy_model(4);
    let w = model[0].1.base().dense(DType::F32).unwrap();
    file.apply(as_list(&mut model), 1.0, DType::F32).unwrap();
    let direction = (w + (up.matmul(&down).unwrap() * 2.0).unwrap()).unwrap();
    let norms = direction
        .sqr()
        .unwrap()
        .sum_keepdim(1)
        .unwrap()
        .sqrt()
        .unwrap();
    let want = direction
        .broadcast_mul(&magnitude.unsqueeze(1).unwrap())
        .unwrap()
        .broadcast_div(&norms)
        .unwrap();
    let layer = &model[0].1;
    let eye = Tensor::eye(16, DType::F32, &Device::Cpu).unwrap();
    let bias = layer.bias().unwrap().unsqueeze(0).unwrap();
    let (y, _) = layer.forward_untracked(&eye).unwrap();
    let got = y.broadcast_sub(&bias).unwrap().t().unwrap();
    assert!(crate::testing::rel(&got, &want).unwrap() < 1e-6);
}
