//! `convert` round trips for every family and layout, `resize` (the same rank copies, a lower one keeps what it
//! reports and misses by exactly the dropped singular values) and the per-block norms.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod merge;

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use framesmith_nn::lora::LoraFamily;
use framesmith_nn::lora_file::RawTensors;
use rand::SeedableRng;

use super::{block_norms, convert, resize, Layout};

/// A tensor to write by hand: name, safetensors dtype, shape, bytes.
pub(super) type RawEntry = (String, &'static str, Vec<usize>, Vec<u8>);

pub(super) fn randn(seed: u64, dims: &[usize], std: f32) -> Tensor {
    let rng = &mut rand::rngs::StdRng::seed_from_u64(seed);
    framesmith_nn::init::randn(rng, dims, 0.0, std, &Device::Cpu).unwrap()
}

/// Writes a safetensors file of `entries` in the given order with `metadata`.
pub(super) fn write_safetensors(path: &Path, entries: &[RawEntry], metadata: &[(&str, &str)]) {
    let mut header = serde_json::Map::new();
    let meta: serde_json::Map<String, serde_json::Value> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    header.insert("__metadata__".into(), meta.into());
    let mut offset = 0;
    for (name, dtype, shape, bytes) in entries {
        let end = offset + bytes.len();
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut json = serde_json::to_vec(&header).unwrap();
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json);
    for (_, _, _, bytes) in entries {
        out.extend(bytes);
    }
    std::fs::write(path, out).unwrap();
}

/// A plain LoRA module `name` of rank 4 (in `in_dim`, out `out_dim`), bf16 factors and an f32 alpha.
fn lora(name: &str, in_dim: usize, out_dim: usize, seed: u64) -> Vec<(String, Tensor)> {
    vec![
        (
            format!("{name}.lora_down.weight"),
            randn(seed, &[4, in_dim], 0.5)
                .to_dtype(DType::BF16)
                .unwrap(),
        ),
        (
            format!("{name}.lora_up.weight"),
            randn(seed + 1, &[out_dim, 4], 0.5)
                .to_dtype(DType::BF16)
                .unwrap(),
        ),
        (
            format!("{name}.alpha"),
            Tensor::new(3f32, &Device::Cpu).unwrap(),
        ),
    ]
}

fn write_file(path: &Path, tensors: Vec<(String, Tensor)>) {
    let metadata = [("ss_network_dim".to_string(), "4".to_string())].into();
    RawTensors { tensors, metadata }.write(path).unwrap();
}

fn keys(path: &Path) -> Vec<String> {
    RawTensors::read(path)
        .unwrap()
        .tensors
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

/// Converts `musubi` to each other layout and back; each way back gives the same file, byte for byte. Returns the
/// keys each layout used.
fn round_trips(dir: &Path, musubi: &Path, layouts: &[Layout]) -> Vec<Vec<String>> {
    let original = std::fs::read(musubi).unwrap();
    let mut seen = Vec::new();
    for layout in layouts {
        let there = dir.join(format!("{layout}.safetensors"));
        let back = dir.join(format!("{layout}-back.safetensors"));
        let report = convert(musubi, &there, *layout, None).unwrap();
        assert_eq!(report.from, Layout::Musubi);
        let report = convert(&there, &back, Layout::Musubi, None).unwrap();
        assert_eq!(report.from, *layout, "{}", musubi.display());
        assert!(
            std::fs::read(&back).unwrap() == original,
            "{layout}: the round trip changed the file"
        );
        seen.push(keys(&there));
    }
    seen
}

#[test]
fn wan_and_qwen_image_round_trip_through_comfyui_and_diffusers() {
    let dir = tempfile::tempdir().unwrap();
    let wan = dir.path().join("wan.safetensors");
    let mut tensors = lora("lora_unet_blocks_0_self_attn_q", 64, 64, 1);
    tensors.extend(lora("lora_unet_blocks_1_cross_attn_k_img", 64, 64, 3));
    tensors.extend(lora("lora_unet_blocks_1_ffn_0", 64, 128, 5));
    write_file(&wan, tensors);
    let seen = round_trips(dir.path(), &wan, &[Layout::Comfyui, Layout::Diffusers]);
    assert!(
        seen[0].contains(&"diffusion_model.blocks.1.cross_attn.k_img.lora_down.weight".to_string())
    );
    assert!(seen[1].contains(&"transformer.blocks.1.attn2.add_k_proj.lora_A.weight".to_string()));
    assert!(seen[1].contains(&"transformer.blocks.1.ffn.net.0.proj.lora_B.weight".to_string()));
    let peft = RawTensors::read(&dir.path().join("diffusers.safetensors")).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&peft.metadata["lora_adapter_metadata"]).unwrap();
    assert_eq!(config["transformer.lora_alpha"], 3.0);
    assert_eq!(config["transformer.r"], 4);

    let qwen_dir = dir.path().join("qwen");
    std::fs::create_dir(&qwen_dir).unwrap();
    let qwen = qwen_dir.join("qwen.safetensors");
    let mut tensors = lora("lora_unet_transformer_blocks_0_attn_to_q", 64, 64, 7);
    tensors.extend(lora(
        "lora_unet_transformer_blocks_2_img_mlp_net_0_proj",
        64,
        256,
        9,
    ));
    write_file(&qwen, tensors);
    let seen = round_trips(&qwen_dir, &qwen, &[Layout::Comfyui, Layout::Diffusers]);
    // Read for generation or a merge, the diffusers file scales by the alphas its metadata holds.
    let read = framesmith_nn::lora_file::LoraFile::load(
        &qwen_dir.join("diffusers.safetensors"),
        &Device::Cpu,
    );
    let module = read
        .unwrap()
        .get("lora_unet_transformer_blocks_0_attn_to_q")
        .cloned();
    assert_eq!(module.map(|m| m.alpha), Some(3.0));
    assert!(seen[1].contains(
        &"transformer.transformer_blocks.2.img_mlp.net.0.proj.lora_A.weight".to_string()
    ));
}

/// FLUX.1's fused q, k, v (and a single block's `linear1`) split into diffusers' modules and fuse back exactly.
#[test]
fn flux_round_trips_with_its_fused_modules_split_for_diffusers() {
    let dir = tempfile::tempdir().unwrap();
    let flux = dir.path().join("flux.safetensors");
    let mut tensors = lora("lora_unet_double_blocks_0_img_attn_qkv", 64, 192, 1);
    tensors.extend(lora("lora_unet_double_blocks_0_txt_mlp_0", 64, 256, 3));
    tensors.extend(lora("lora_unet_single_blocks_1_linear1", 64, 448, 5));
    write_file(&flux, tensors);
    let seen = round_trips(dir.path(), &flux, &[Layout::Comfyui, Layout::Diffusers]);
    assert!(seen[0]
        .contains(&"diffusion_model.double_blocks.0.img_attn.qkv.lora_up.weight".to_string()));
    let diffusers = RawTensors::read(&dir.path().join("diffusers.safetensors")).unwrap();
    let mlp = diffusers
        .get("transformer.single_transformer_blocks.1.proj_mlp.lora_B.weight")
        .unwrap();
    assert_eq!(mlp.dims(), [256, 4]);
    assert!(diffusers
        .get("transformer.transformer_blocks.0.attn.to_v.lora_A.weight")
        .is_some());
    assert!(diffusers
        .get("transformer.transformer_blocks.0.ff_context.net.0.proj.lora_A.weight")
        .is_some());
}

/// HunyuanVideo 1.5 goes to ComfyUI's stacked q, k, v and back exactly; diffusers' layout is refused by name.
#[test]
fn hunyuan_video_round_trips_through_comfyui_and_refuses_diffusers() {
    let dir = tempfile::tempdir().unwrap();
    let hv = dir.path().join("hv.safetensors");
    let mut tensors = Vec::new();
    for (i, x) in ["q", "k", "v"].iter().enumerate() {
        tensors.extend(lora(
            &format!("lora_unet_double_blocks_20_img_attn_{x}"),
            64,
            64,
            2 * i as u64,
        ));
    }
    // Block 20: past FLUX.1's 19 double blocks, so ComfyUI's names (FLUX.1's too) still tell the family.
    tensors.extend(lora("lora_unet_double_blocks_20_img_mlp_fc1", 64, 256, 9));
    write_file(&hv, tensors);
    let seen = round_trips(dir.path(), &hv, &[Layout::Comfyui]);
    assert!(seen[0].contains(&"lora_unet_double_blocks_20_img_attn_qkv.lora_up.weight".to_string()));
    let err = convert(
        &hv,
        &dir.path().join("d.safetensors"),
        Layout::Diffusers,
        None,
    )
    .err()
    .unwrap();
    assert!(format!("{err:#}").contains("HunyuanVideo 1.5"), "{err:#}");
}

/// LyCORIS kinds keep their tensors between musubi-tuner's and ComfyUI's names; diffusers' layout (plain LoRA
/// only) refuses them by module and kind; the output is never the input.
#[test]
fn lycoris_kinds_convert_where_a_layout_has_them_and_are_refused_by_name_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let lokr = dir.path().join("lokr.safetensors");
    let m = "lora_unet_blocks_0_self_attn_q";
    write_file(
        &lokr,
        vec![
            (format!("{m}.lokr_w1"), randn(1, &[8, 8], 0.5)),
            (format!("{m}.lokr_w2"), randn(2, &[8, 8], 0.5)),
            (
                format!("{m}.alpha"),
                Tensor::new(1f32, &Device::Cpu).unwrap(),
            ),
        ],
    );
    let seen = round_trips(dir.path(), &lokr, &[Layout::Comfyui]);
    assert!(seen[0].contains(&"diffusion_model.blocks.0.self_attn.q.lokr_w1".to_string()));
    let err = convert(
        &lokr,
        &dir.path().join("d.safetensors"),
        Layout::Diffusers,
        None,
    )
    .err()
    .unwrap();
    let err = format!("{err:#}");
    assert!(
        err.contains(m) && err.contains("LoKr") && err.contains("plain LoRA"),
        "{err}"
    );
    let flux = Some(LoraFamily::Flux);
    let wrong = convert(
        &lokr,
        &dir.path().join("f.safetensors"),
        Layout::Comfyui,
        flux,
    );
    let wrong = format!("{:#}", wrong.err().unwrap());
    assert!(
        wrong.contains("not a block linear of a flux model") && wrong.contains("--family"),
        "{wrong}"
    );
    assert!(wrong.contains("lokr.safetensors"), "{wrong}");
    let same = format!(
        "{:#}",
        convert(&lokr, &lokr, Layout::Comfyui, None).err().unwrap()
    );
    assert!(
        same.contains("never overwrites") && same.ends_with("lokr.safetensors"),
        "{same}"
    );
}

/// `up = P Σ R`, `down = Rᵀ Q` with orthonormal P, Q, R: a product whose singular values are `sigma`.
fn known_svd(out: usize, inp: usize, sigma: &[f64]) -> (Tensor, Tensor) {
    let r = sigma.len();
    let ortho = |n: usize, seed: u64| {
        // Q of a random square matrix by Gram–Schmidt.
        let a = randn(seed, &[n, n], 1.0)
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        let mut q: Vec<Vec<f64>> = Vec::new();
        for col in a {
            let mut v = col;
            for u in &q {
                let d: f64 = v.iter().zip(u).map(|(x, y)| x * y).sum();
                v.iter_mut().zip(u).for_each(|(x, y)| *x -= d * y);
            }
            let n2 = v.iter().map(|x| x * x).sum::<f64>().sqrt();
            q.push(v.into_iter().map(|x| x / n2).collect());
        }
        let flat: Vec<f64> = q.into_iter().flatten().collect();
        Tensor::from_vec(flat, (n, n), &Device::Cpu).unwrap()
    };
    let (p, q, mix) = (ortho(out, 1), ortho(inp, 2), ortho(r, 3));
    let s = Tensor::from_vec(sigma.to_vec(), (1, r), &Device::Cpu).unwrap();
    let up = p
        .narrow(1, 0, r)
        .unwrap()
        .broadcast_mul(&s)
        .unwrap()
        .matmul(&mix)
        .unwrap();
    let down = mix
        .t()
        .unwrap()
        .matmul(&q.narrow(0, 0, r).unwrap())
        .unwrap();
    (
        up.to_dtype(DType::F32).unwrap(),
        down.to_dtype(DType::F32).unwrap(),
    )
}

#[test]
fn resize_to_the_same_rank_copies_and_to_a_lower_one_drops_exactly_the_smallest_singular_values() {
    let dir = tempfile::tempdir().unwrap();
    let sigma = [4.0, 2.0, 1.0, 0.5, 0.25, 0.125];
    let (up, down) = known_svd(48, 40, &sigma);
    let m = "lora_unet_blocks_0_ffn_2";
    let input = dir.path().join("r6.safetensors");
    write_file(
        &input,
        vec![
            (format!("{m}.lora_down.weight"), down.clone()),
            (format!("{m}.lora_up.weight"), up.clone()),
            (
                format!("{m}.alpha"),
                Tensor::new(3f32, &Device::Cpu).unwrap(),
            ),
        ],
    );
    let same = dir.path().join("same.safetensors");
    let report = resize(&input, &same, 6).unwrap();
    assert_eq!(
        std::fs::read(&same).unwrap(),
        std::fs::read(&input).unwrap()
    );
    assert_eq!(report.overall_energy, 1.0);
    let lower = dir.path().join("r2.safetensors");
    let report = resize(&input, &lower, 2).unwrap();
    let total: f64 = sigma.iter().map(|s| s * s).sum();
    let kept = (16.0 + 4.0) / total;
    assert!(
        (report.modules[0].energy - kept).abs() < 1e-6,
        "{:?}",
        report.modules
    );
    assert!((report.overall_energy - kept).abs() < 1e-6);
    let out = RawTensors::read(&lower).unwrap();
    let (d2, u2) = (
        out.get(&format!("{m}.lora_down.weight")).unwrap(),
        out.get(&format!("{m}.lora_up.weight")).unwrap(),
    );
    assert_eq!(
        (d2.dims(), u2.dims()),
        ([2, 40].as_slice(), [48, 2].as_slice())
    );
    let alpha = out
        .get(&format!("{m}.alpha"))
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert_eq!(
        alpha, 1.0,
        "alpha 3 at rank 6 is alpha 1 at rank 2: the same scale"
    );
    let residual = (up.matmul(&down).unwrap() - u2.matmul(d2).unwrap()).unwrap();
    let err2 = residual
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap() as f64;
    let dropped: f64 = sigma[2..].iter().map(|s| s * s).sum();
    assert!(
        (err2 - dropped).abs() < 1e-4 * dropped.max(1.0),
        "error {err2} against dropped {dropped}"
    );
}

/// LoKr and LoHa have no rank an SVD can cut: refused by module kind and file.
#[test]
fn resize_refuses_lokr_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let lokr = dir.path().join("lokr.safetensors");
    write_file(
        &lokr,
        vec![
            (
                "lora_unet_blocks_0_ffn_2.lokr_w1".into(),
                randn(1, &[4, 4], 1.0),
            ),
            (
                "lora_unet_blocks_0_ffn_2.lokr_w2".into(),
                randn(1, &[12, 10], 1.0),
            ),
        ],
    );
    let err = format!(
        "{:#}",
        resize(&lokr, &dir.path().join("x.safetensors"), 2)
            .err()
            .unwrap()
    );
    assert!(
        err.contains("LoKr") && err.ends_with("lokr.safetensors"),
        "{err}"
    );
}

#[test]
fn norms_are_summed_in_squares_per_block() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("n.safetensors");
    let mut tensors = lora("lora_unet_blocks_0_self_attn_q", 64, 64, 1);
    tensors.extend(lora("lora_unet_blocks_0_ffn_0", 64, 128, 3));
    tensors.extend(lora("lora_unet_blocks_3_ffn_0", 64, 128, 5));
    write_file(&path, tensors.clone());
    let norms = block_norms(&path).unwrap();
    let norm = |name: &str| {
        let get = |s: &str| {
            tensors
                .iter()
                .find(|(k, _)| k == &format!("{name}.{s}"))
                .unwrap()
                .1
                .to_dtype(DType::F64)
                .unwrap()
        };
        let w = (get("lora_up.weight")
            .matmul(&get("lora_down.weight"))
            .unwrap()
            * 0.75)
            .unwrap();
        w.sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    let block0 = (norm("lora_unet_blocks_0_self_attn_q") + norm("lora_unet_blocks_0_ffn_0")).sqrt();
    let got = norms["blocks"][&0];
    assert!(
        (got - block0).abs() < 1e-6 * block0,
        "{got} against {block0}"
    );
    assert_eq!(norms["blocks"].keys().copied().collect::<Vec<_>>(), [0, 3]);
}
