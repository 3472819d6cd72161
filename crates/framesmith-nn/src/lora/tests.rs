#![allow(clippy::unwrap_used, clippy::expect_used)]

use candle_core::{DType, Device, Tensor};

use super::*;
use crate::fp8::tests::randn;
use crate::linear::Linear;

fn tensor(seed: u64, dims: &[usize], scale: f32, dtype: DType) -> Tensor {
    let v: Vec<f32> = randn(seed, dims.iter().product())
        .into_iter()
        .map(|x| x * scale)
        .collect();
    Tensor::from_vec(v, dims, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn spec(rank: usize, alpha: f64) -> LoraSpec {
    LoraSpec {
        rank,
        alpha,
        dtype: DType::F32,
        include_patterns: vec![],
        exclude_patterns: vec![],
        seed: 7,
        kind: Default::default(),
    }
}

fn targets(include: &[&str], exclude: &[&str]) -> LoraTargets {
    let s = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    LoraTargets::new(&s(include), &s(exclude)).unwrap()
}

#[test]
fn default_targets_are_musubis_wan_block_linears() {
    let t = targets(&[], &[]);
    for block in [0, 39] {
        for linear in WAN_BLOCK_LINEARS {
            assert!(
                t.matches(&format!("blocks.{block}.{linear}")),
                "blocks.{block}.{linear}"
            );
        }
    }
    for outside in [
        "text_embedding.0",
        "text_embedding.2",
        "time_embedding.0",
        "time_projection.1",
        "head.head",
        "img_emb.proj.1",
        "blocks.0.norm3",
        "blocks.x.self_attn.q",
        "blocks.0",
    ] {
        assert!(!t.matches(outside), "{outside}");
    }
}

#[test]
fn exclude_and_include_patterns_follow_musubi() {
    let no_ffn = targets(&[], &[r".*ffn.*"]);
    assert!(!no_ffn.matches("blocks.3.ffn.0") && !no_ffn.matches("blocks.3.ffn.2"));
    assert!(no_ffn.matches("blocks.3.self_attn.o"));
    // Include re-admits excluded modules…
    let only_img = targets(&[r".*cross_attn\.(k|v)_img"], &[r".*cross_attn.*"]);
    assert!(
        only_img.matches("blocks.1.cross_attn.k_img")
            && only_img.matches("blocks.1.cross_attn.v_img")
    );
    assert!(!only_img.matches("blocks.1.cross_attn.q"));
    // …but does not narrow the selection.
    let include_q = targets(&[r".*self_attn\.q"], &[]);
    assert!(include_q.matches("blocks.0.ffn.0"));
    // Patterns match the whole path, like Python's re.fullmatch.
    let partial = targets(&[], &["self_attn"]);
    assert!(partial.matches("blocks.0.self_attn.q"));
    let err = LoraTargets::new(&[], &["blocks.(".to_string()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("blocks.("), "{err}");
}

fn flux_targets(include: &[&str], exclude: &[&str]) -> LoraTargets {
    let s = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    LoraTargets::for_family(LoraFamily::Flux, &s(include), &s(exclude)).unwrap()
}

#[test]
fn flux_default_targets_are_musubis_block_linears_without_modulation() {
    let t = flux_targets(&[], &[]);
    let modulation = ["img_mod.lin", "txt_mod.lin", "modulation.lin"];
    for block in [0, 18] {
        for linear in FLUX_DOUBLE_BLOCK_LINEARS {
            let path = format!("double_blocks.{block}.{linear}");
            assert_eq!(t.matches(&path), !modulation.contains(&linear), "{path}");
        }
    }
    for block in [0, 37] {
        for linear in FLUX_SINGLE_BLOCK_LINEARS {
            let path = format!("single_blocks.{block}.{linear}");
            assert_eq!(t.matches(&path), !modulation.contains(&linear), "{path}");
        }
    }
    for outside in [
        "img_in",
        "txt_in",
        "time_in.in_layer",
        "guidance_in.out_layer",
        "vector_in.in_layer",
        "final_layer.linear",
        "final_layer.adaLN_modulation.1",
        "blocks.0.self_attn.q",
        "double_blocks.x.img_attn.qkv",
        "single_blocks.0",
    ] {
        assert!(!t.matches(outside), "{outside}");
    }
    // Wan's targets are not FLUX's.
    assert!(!targets(&[], &[]).matches("double_blocks.0.img_attn.qkv"));
}

#[test]
fn flux_user_excludes_replace_the_modulation_default_and_includes_readmit_it() {
    // As musubi-tuner: the user's excludes replace the default one, `norm` stays excluded.
    let no_txt = flux_targets(&[], &[r".*txt_.*"]);
    assert!(no_txt.matches("double_blocks.0.img_mod.lin"));
    assert!(no_txt.matches("single_blocks.0.modulation.lin"));
    assert!(!no_txt.matches("double_blocks.0.txt_attn.qkv"));
    assert!(!no_txt.matches("double_blocks.0.img_attn.norm.query_norm"));
    // sd-scripts' selection: every block linear.
    let all = flux_targets(&[r".*mod(ulation)?\.lin"], &[]);
    for linear in FLUX_DOUBLE_BLOCK_LINEARS {
        assert!(
            all.matches(&format!("double_blocks.3.{linear}")),
            "{linear}"
        );
    }
    for linear in FLUX_SINGLE_BLOCK_LINEARS {
        assert!(
            all.matches(&format!("single_blocks.3.{linear}")),
            "{linear}"
        );
    }
}

#[test]
fn qwen_image_default_targets_are_every_block_linear_as_musubi_adapts_them() {
    let s = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    let t = LoraTargets::for_family(LoraFamily::QwenImage, &[], &[]).unwrap();
    for block in [0, 59] {
        for linear in QWEN_IMAGE_BLOCK_LINEARS {
            let path = format!("transformer_blocks.{block}.{linear}");
            assert!(t.matches(&path), "{path}");
        }
    }
    for outside in [
        "img_in",
        "txt_in",
        "time_text_embed.timestep_embedder.linear_1",
        "norm_out.linear",
        "proj_out",
        "blocks.0.self_attn.q",
        "double_blocks.0.img_attn.qkv",
        "transformer_blocks.x.attn.to_q",
    ] {
        assert!(!t.matches(outside), "{outside}");
    }
    // Neither Wan's nor FLUX.1's targets are Qwen-Image's.
    assert!(!targets(&[], &[]).matches("transformer_blocks.0.attn.to_q"));
    assert!(!flux_targets(&[], &[]).matches("transformer_blocks.0.attn.to_q"));
    // The user's excludes add to musubi-tuner's (which keeps applying to underscored names).
    let no_mod = LoraTargets::for_family(LoraFamily::QwenImage, &[], &s(&[r".*_mod\.1"])).unwrap();
    assert!(!no_mod.matches("transformer_blocks.0.img_mod.1"));
    assert!(no_mod.matches("transformer_blocks.0.attn.to_q"));
    assert!(!t.matches("transformer_blocks.0.img_mod_x"));
}

#[test]
fn ltx2_default_targets_are_the_official_trainers_attention_projections() {
    let s = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    let t = LoraTargets::for_family(LoraFamily::Ltx2, &[], &[]).unwrap();
    for linear in [
        "attn1.to_q",
        "attn1.to_k",
        "attn2.to_v",
        "attn2.to_out.0",
        "audio_attn1.to_q",
        "audio_attn2.to_out.0",
        "audio_to_video_attn.to_k",
        "video_to_audio_attn.to_v",
    ] {
        assert!(
            t.matches(&format!("transformer_blocks.47.{linear}")),
            "{linear}"
        );
    }
    for left_out in [
        "transformer_blocks.0.ff.net.0.proj",
        "transformer_blocks.0.ff.net.2",
        "transformer_blocks.0.audio_ff.net.0.proj",
        "transformer_blocks.0.audio_ff.net.2",
        "transformer_blocks.0.attn1.to_gate_logits",
        "transformer_blocks.0.audio_to_video_attn.to_gate_logits",
        "patchify_proj",
        "adaln_single.linear",
    ] {
        assert!(!t.matches(left_out), "{left_out}");
    }
    // An exclude of the user's own replaces the default: the feed-forward is trained too.
    let own = LoraTargets::for_family(LoraFamily::Ltx2, &[], &s(&[r".*attn2.*"])).unwrap();
    assert!(own.matches("transformer_blocks.0.ff.net.2"));
    assert!(!own.matches("transformer_blocks.0.attn2.to_q"));
}

/// A toy model: `blocks.{i}.self_attn.q` and `blocks.{i}.ffn.0` for 12 blocks, plus a head.
fn toy_model(dtype: DType) -> Vec<(String, Linear)> {
    let mut layers = Vec::new();
    for i in 0..12 {
        for (j, name) in ["self_attn.q", "ffn.0"].into_iter().enumerate() {
            let w = tensor(100 + 2 * i + j as u64, &[6, 8], 0.3, dtype);
            layers.push((format!("blocks.{i}.{name}"), Linear::from_weights(w, None)));
        }
    }
    layers.push((
        "head.head".to_string(),
        Linear::from_weights(tensor(99, &[4, 8], 0.3, dtype), None),
    ));
    layers
}

fn as_list(model: &mut [(String, Linear)]) -> Vec<(String, &mut Linear)> {
    model.iter_mut().map(|(p, l)| (p.clone(), l)).collect()
}

#[test]
fn attach_creates_seeded_adapters_in_natural_order() {
    let mut model = toy_model(DType::F32);
    let x = tensor(1, &[3, 8], 1.0, DType::F32);
    let before: Vec<Tensor> = model.iter().map(|(_, l)| l.forward(&x).unwrap()).collect();
    let set = attach_loras(as_list(&mut model), &spec(4, 0.0)).unwrap();
    assert_eq!(set.len(), 24);
    let paths: Vec<&str> = set.iter().map(|(p, _)| p).collect();
    assert_eq!(
        &paths[..4],
        [
            "blocks.0.ffn.0",
            "blocks.0.self_attn.q",
            "blocks.1.ffn.0",
            "blocks.1.self_attn.q"
        ]
    );
    assert_eq!(
        paths[4], "blocks.2.ffn.0",
        "blocks.10 must sort after blocks.2"
    );
    assert_eq!(set.vars().len(), 48);
    assert_eq!(set.parameter_count(), 24 * (4 * 8 + 6 * 4));
    for ((path, layer), y0) in model.iter().zip(&before) {
        assert_eq!(layer.lora().is_some(), path != "head.head", "{path}");
        // A fresh adapter (up = 0) leaves the output unchanged.
        let diff = (layer.forward(&x).unwrap() - y0)
            .unwrap()
            .abs()
            .unwrap()
            .sum_all()
            .unwrap();
        assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0);
    }
    let lora = set.get("blocks.3.ffn.0").unwrap().as_lora().unwrap();
    assert_eq!(lora.alpha, 4.0, "alpha 0 means alpha = rank");
    let down = lora.down.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let bound = 1.0 / 8f32.sqrt();
    assert!(down.iter().all(|v| v.abs() <= bound) && down.iter().any(|v| v.abs() > bound / 2.0));
    // Same seed, same adapters; the path enters the seed.
    let mut again = toy_model(DType::F32);
    let set2 = attach_loras(as_list(&mut again), &spec(4, 0.0)).unwrap();
    let d2 = set2
        .get("blocks.3.ffn.0")
        .unwrap()
        .as_lora()
        .unwrap()
        .down
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(down, d2);
    let other = set2
        .get("blocks.4.ffn.0")
        .unwrap()
        .as_lora()
        .unwrap()
        .down
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_ne!(down, other);
}

#[test]
fn a_shared_set_updates_both_models_at_once() {
    let mut first = toy_model(DType::F32);
    let mut second = toy_model(DType::F32);
    let set = attach_loras(as_list(&mut first), &spec(2, 0.0)).unwrap();
    set.share_with(as_list(&mut second)).unwrap();
    let x = tensor(1, &[3, 8], 1.0, DType::F32);
    let lora = set.iter().next().unwrap().1.as_lora().unwrap();
    lora.up
        .set(&Tensor::ones(lora.up.shape(), DType::F32, &Device::Cpu).unwrap())
        .unwrap();
    for ((path, a), (_, b)) in first.iter().zip(&second) {
        let (ya, yb) = (a.forward(&x).unwrap(), b.forward(&x).unwrap());
        let diff = (ya - yb)
            .unwrap()
            .abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert_eq!(diff, 0.0, "{path}: both models see the one update");
    }
    // A model without one of the paths gets nothing.
    let mut short = toy_model(DType::F32);
    short.retain(|(p, _)| p != "blocks.3.ffn.0");
    let err = set.share_with(as_list(&mut short)).unwrap_err();
    assert!(err.to_string().contains("blocks.3.ffn.0"), "{err}");
    assert!(short.iter().all(|(_, l)| l.lora().is_none()));
}

#[test]
fn attach_rejects_zero_rank_and_empty_selection() {
    let mut model = toy_model(DType::F32);
    assert!(matches!(
        attach_loras(as_list(&mut model), &spec(0, 1.0)),
        Err(LoraError::ZeroRank)
    ));
    let mut nothing = spec(4, 1.0);
    nothing.exclude_patterns = vec![".*".to_string()];
    let err = attach_loras(as_list(&mut model), &nothing).err().unwrap();
    assert!(matches!(err, LoraError::NoTargets { .. }), "{err}");
}

#[test]
fn attach_refuses_a_rank_wider_than_the_narrowest_target() {
    // The toy linears are 8 in, 6 out: rank 6 is the most that adds capacity.
    let mut model = toy_model(DType::F32);
    let err = attach_loras(as_list(&mut model), &spec(100_000, 0.0))
        .err()
        .unwrap();
    let shown = err.to_string();
    assert!(
        matches!(err, LoraError::RankTooLarge { max: 6, .. }),
        "{shown}"
    );
    assert!(
        shown.contains("lora.rank <= 6") && shown.contains("blocks.0.self_attn.q: 8 in, 6 out"),
        "{shown}"
    );
    assert!(model.iter().all(|(_, l)| l.lora().is_none()));
    // A rank too large to allocate is refused the same way, before anything is made.
    let huge = attach_loras(as_list(&mut model), &spec(10_000_000_000, 0.0));
    assert!(matches!(huge, Err(LoraError::RankTooLarge { .. })));
    assert_eq!(
        attach_loras(as_list(&mut model), &spec(6, 0.0))
            .unwrap()
            .len(),
        24
    );
}

#[test]
fn output_scales_with_alpha_over_rank_and_multiplier() {
    let down = tensor(2, &[4, 8], 0.5, DType::F32);
    let up = tensor(3, &[6, 4], 0.5, DType::F32);
    let x = tensor(4, &[5, 8], 1.0, DType::F32);
    let plain = x
        .matmul(&down.t().unwrap())
        .unwrap()
        .matmul(&up.t().unwrap())
        .unwrap();
    for (alpha, multiplier) in [(4.0, 1.0), (8.0, 1.0), (1.0, 0.5), (16.0, -1.0)] {
        let mut lora = Lora::from_tensors(&down, &up, alpha).unwrap();
        lora.multiplier = multiplier;
        let want_scale = alpha / 4.0 * multiplier;
        assert_eq!(lora.scale(), want_scale);
        let diff = (lora.forward(&x).unwrap() - (&plain * want_scale).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-5, "alpha {alpha} multiplier {multiplier}: {diff}");
    }
    assert!(Lora::from_tensors(&down, &up.t().unwrap(), 1.0).is_err());
}

/// Gradients of `down` and `up` in a two-layer stack (linear, tanh, linear, all with adapters) match central
/// finite differences, in f64.
#[test]
fn lora_gradients_match_finite_differences() {
    let mut model = [
        (
            "blocks.0.ffn.0".to_string(),
            Linear::from_weights(tensor(10, &[7, 5], 0.4, DType::F64), None),
        ),
        (
            "blocks.0.ffn.2".to_string(),
            Linear::from_weights(tensor(11, &[3, 7], 0.4, DType::F64), None),
        ),
    ];
    let mut s = spec(2, 3.0);
    s.dtype = DType::F64;
    let set = attach_loras(as_list(&mut model), &s).unwrap();
    for (i, (_, lora)) in set.iter().enumerate() {
        let lora = lora.as_lora().unwrap();
        let dims = lora.up.dims().to_vec();
        lora.up
            .set(&tensor(20 + i as u64, &dims, 0.5, DType::F64))
            .unwrap();
    }
    let x = tensor(12, &[4, 5], 1.0, DType::F64);
    let r = tensor(13, &[4, 3], 1.0, DType::F64);
    let loss = || {
        let h = model[0].1.forward(&x).unwrap().tanh().unwrap();
        (model[1].1.forward(&h).unwrap() * &r)
            .unwrap()
            .sum_all()
            .unwrap()
    };
    let grads = loss().backward().unwrap();
    let mut checked = 0;
    for var in set.vars() {
        let g = grads
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let base = var.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        for k in (0..base.len()).step_by(2) {
            let eps = 1e-6;
            let at = |delta: f64| {
                let mut v = base.clone();
                v[k] += delta;
                var.set(&Tensor::from_vec(v, var.dims(), &Device::Cpu).unwrap())
                    .unwrap();
                loss().to_scalar::<f64>().unwrap()
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * eps);
            var.set(&Tensor::from_vec(base.clone(), var.dims(), &Device::Cpu).unwrap())
                .unwrap();
            assert!(
                (fd - g[k]).abs() <= 1e-6 * (1.0 + fd.abs()),
                "element {k}: fd {fd}, autodiff {}",
                g[k]
            );
            checked += 1;
        }
    }
    assert!(checked > 20);
}

#[test]
fn natural_order_compares_numbers_as_numbers() {
    let mut v = vec![
        "blocks.10.ffn.0",
        "blocks.2.ffn.2",
        "blocks.2.ffn.0",
        "blocks.1.self_attn.q",
        "blocks.1",
    ];
    v.sort_by(|a, b| natural_cmp(a, b));
    assert_eq!(
        v,
        [
            "blocks.1",
            "blocks.1.self_attn.q",
            "blocks.2.ffn.0",
            "blocks.2.ffn.2",
            "blocks.10.ffn.0"
        ]
    );
}

/// Inside `untracked` a LoRA's output records no graph and equals the tracked one; the flag is restored after,
/// also when nested or left by a panic.
#[test]
fn untracked_reads_the_weights_detached_and_restores_tracking() {
    let lora = Lora::from_tensors(
        &tensor(1, &[2, 4], 0.5, DType::F32),
        &tensor(2, &[3, 2], 0.5, DType::F32),
        2.0,
    )
    .unwrap();
    let x = tensor(3, &[5, 4], 1.0, DType::F32);
    let tracked = lora.forward(&x).unwrap();
    assert!(tracked.track_op());
    let inner = untracked(|| {
        let nested = untracked(|| lora.forward(&x).unwrap());
        assert!(!nested.track_op());
        lora.forward(&x).unwrap()
    });
    assert!(!inner.track_op(), "still untracked after a nested call");
    assert_eq!(
        inner.to_vec2::<f32>().unwrap(),
        tracked.to_vec2::<f32>().unwrap()
    );
    let caught = std::panic::catch_unwind(|| untracked(|| panic!("inside")));
    assert!(caught.is_err());
    assert!(lora.forward(&x).unwrap().track_op(), "tracking is back");
}

/// A mirror (`copy_to`) owns its tensors: an update of the original does not reach it until `assign_from`, which
/// makes it equal again; sets of other modules are refused.
#[test]
fn a_mirror_is_its_own_copy_until_assigned() {
    let dev = Device::Cpu;
    let lora = |seed| {
        Lora::from_tensors(
            &tensor(seed, &[4, 8], 0.5, DType::F32),
            &tensor(seed + 1, &[6, 4], 0.5, DType::F32),
            4.0,
        )
        .unwrap()
    };
    let mut scaled = lora(3);
    scaled.multiplier = 0.5;
    let set = LoraSet::new(vec![
        ("blocks.0.q".into(), lora(1)),
        ("blocks.1.q".into(), scaled),
    ]);
    let mirror = set.copy_to(&dev).unwrap();
    let values = |s: &LoraSet| -> Vec<Vec<f32>> {
        s.vars()
            .iter()
            .map(|v| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
            .collect()
    };
    assert_eq!(values(&set), values(&mirror));
    assert_eq!(
        mirror
            .get("blocks.1.q")
            .unwrap()
            .as_lora()
            .unwrap()
            .multiplier,
        0.5
    );
    assert_eq!(
        mirror.get("blocks.1.q").unwrap().as_lora().unwrap().alpha,
        4.0
    );
    for v in set.vars() {
        v.set(&(v.as_tensor() * 2.0).unwrap()).unwrap();
    }
    assert_ne!(
        values(&set),
        values(&mirror),
        "the mirror shares no storage"
    );
    mirror.assign_from(&set).unwrap();
    assert_eq!(values(&set), values(&mirror));
    let other = LoraSet::new(vec![
        ("blocks.0.k".into(), lora(5)),
        ("blocks.1.q".into(), lora(7)),
    ]);
    assert!(mirror.assign_from(&other).is_err());
    let fewer = LoraSet::new(vec![("blocks.0.q".into(), lora(5))]);
    assert!(mirror.assign_from(&fewer).is_err());
}
