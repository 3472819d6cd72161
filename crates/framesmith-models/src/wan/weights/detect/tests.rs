//! Variant detection on synthetic shape tables: the official sizes (too large to write as files), hints,
//! the expected-variant check and FP8 scale shapes.

use super::*;

fn shapes_of(cfg: &WanConfig) -> Shapes {
    official_shapes(cfg).into_iter().collect()
}

fn hints(wan22: bool, expert: Option<Expert>) -> NameHints {
    NameHints {
        wan21: false,
        wan22,
        expert,
    }
}

#[test]
fn official_sizes_are_named() -> Result<(), DetectError> {
    let cases = [
        (WanConfig::wan21_t2v_1_3b(), "Wan2.1 T2V-1.3B"),
        (WanConfig::wan21_i2v_14b(), "Wan2.1 I2V-14B"),
        (WanConfig::wan22_i2v_a14b(), "Wan2.2 I2V-A14B expert"),
        (WanConfig::wan22_ti2v_5b(), "Wan2.2 TI2V-5B"),
    ];
    for (cfg, name) in cases {
        let det = detect(&shapes_of(&cfg), NameHints::default(), None)?;
        assert_eq!(det.names, vec![name.to_string()]);
        assert_eq!(det.config, cfg, "{name}");
        assert_eq!(det.heads, HeadsSource::Rule);
    }
    Ok(())
}

#[test]
fn t2v_14b_and_a14b_expert_are_reported_honestly() -> Result<(), DetectError> {
    let shapes = shapes_of(&WanConfig::wan21_t2v_14b());
    let det = detect(&shapes, NameHints::default(), None)?;
    assert_eq!(
        det.names,
        vec![
            "Wan2.1 T2V-14B".to_string(),
            "Wan2.2 T2V-A14B expert".to_string()
        ]
    );
    assert_eq!(det.config, WanConfig::wan21_t2v_14b());
    assert!(det.notes.iter().any(|n| n.contains("identical tensors")));

    let det = detect(&shapes, hints(true, Some(Expert::HighNoise)), None)?;
    assert_eq!(
        det.names,
        vec!["Wan2.2 T2V-A14B high-noise expert".to_string()]
    );
    assert_eq!(det.config, WanConfig::wan22_t2v_a14b());
    assert_eq!(det.expert, Some(Expert::HighNoise));

    let wan21 = NameHints {
        wan21: true,
        ..NameHints::default()
    };
    let det = detect(&shapes, wan21, None)?;
    assert_eq!(det.names, vec!["Wan2.1 T2V-14B".to_string()]);

    let det = detect(
        &shapes_of(&WanConfig::wan22_i2v_a14b()),
        hints(true, Some(Expert::LowNoise)),
        None,
    )?;
    assert_eq!(
        det.names,
        vec!["Wan2.2 I2V-A14B low-noise expert".to_string()]
    );
    Ok(())
}

#[test]
fn hints_from_names() {
    use super::super::source::hints_from_text;
    let h = hints_from_text(
        "Wan2.2-T2V-A14B/high_noise_model/diffusion_pytorch_model-00001-of-00006.safetensors",
    );
    assert_eq!(h, hints(true, Some(Expert::HighNoise)));
    let h = hints_from_text("wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors");
    assert_eq!(h, hints(true, Some(Expert::LowNoise)));
    let h = hints_from_text("wan2.1_t2v_14B_bf16.safetensors");
    assert!(h.wan21 && !h.wan22 && h.expert.is_none());
    assert_eq!(hints_from_text("model.safetensors"), NameHints::default());
}

#[test]
fn heads_rule() {
    let cases = [
        (1536, 12),
        (3072, 24),
        (5120, 40),
        (64, 2),
        (128, 2),
        (96, 3),
        (1, 1),
    ];
    for (dim, heads) in cases {
        assert_eq!(heads_for_dim(dim), heads, "dim {dim}");
    }
}

#[test]
fn expected_variant_is_checked() -> Result<(), DetectError> {
    let i2v = detect(
        &shapes_of(&WanConfig::wan21_i2v_14b()),
        NameHints::default(),
        None,
    )?;
    let Err(Mismatch::Task {
        found,
        expected,
        found_kind,
    }) = check_expected(&i2v, &WanConfig::wan21_t2v_14b())
    else {
        panic!("an I2V file must not pass as T2V");
    };
    assert_eq!(
        (found.as_str(), expected.as_str()),
        ("Wan2.1 I2V-14B", "Wan2.1 T2V-14B")
    );
    assert!(found_kind.contains("image-to-video"));
    assert!(matches!(
        check_expected(&i2v, &WanConfig::wan22_i2v_a14b()),
        Err(Mismatch::Variant { .. })
    ));

    let small = detect(
        &shapes_of(&WanConfig::wan21_t2v_1_3b()),
        NameHints::default(),
        None,
    )?;
    assert!(matches!(
        check_expected(&small, &WanConfig::wan21_t2v_14b()),
        Err(Mismatch::Variant { .. })
    ));

    // T2V-14B and an A14B expert have the same tensors: the caller's choice stands.
    let t2v = detect(
        &shapes_of(&WanConfig::wan21_t2v_14b()),
        NameHints::default(),
        None,
    )?;
    assert_eq!(
        check_expected(&t2v, &WanConfig::wan22_t2v_a14b()),
        Ok(WanConfig::wan22_t2v_a14b())
    );
    Ok(())
}

#[test]
fn incomplete_checkpoints_are_refused() {
    let cfg = WanConfig::tiny(3);
    let mut shapes = shapes_of(&cfg);
    shapes.retain(|k, _| !k.starts_with("blocks.1."));
    let Err(DetectError::Incomplete { problem, .. }) = detect(&shapes, NameHints::default(), None)
    else {
        panic!("a missing block must be refused");
    };
    assert!(problem.contains("block 1 is missing"), "{problem}");

    let mut shapes = shapes_of(&cfg);
    shapes.remove("blocks.2.cross_attn.o.bias");
    let Err(DetectError::Incomplete { problem, .. }) = detect(&shapes, NameHints::default(), None)
    else {
        panic!("a missing tensor must be refused");
    };
    assert!(
        problem.contains("1 tensors are missing (`blocks.2.cross_attn.o.bias`)"),
        "{problem}"
    );

    let mut shapes = shapes_of(&cfg);
    shapes.insert("blocks.0.self_attn.k.weight".into(), vec![64, 32]);
    let Err(DetectError::Incomplete { problem, .. }) = detect(&shapes, NameHints::default(), None)
    else {
        panic!("a misshapen tensor must be refused");
    };
    assert!(problem.contains("`blocks.0.self_attn.k.weight` has shape [64, 32], expected [64, 64]"));

    // Absurd sizes from a damaged header are refused, not multiplied.
    let mut shapes = shapes_of(&cfg);
    shapes.insert("patch_embedding.weight".into(), vec![1 << 40, 0, 1, 2, 2]);
    assert!(matches!(
        detect(&shapes, NameHints::default(), None),
        Err(DetectError::Incomplete { .. })
    ));
    assert!(matches!(
        detect(&Shapes::new(), NameHints::default(), None),
        Err(DetectError::Unknown(_))
    ));
}

#[test]
fn fp8_scale_shapes() {
    let w = [5120, 5120];
    assert_eq!(scaling_mode(&w, None), Fp8Scaling::Unscaled);
    assert_eq!(scaling_mode(&w, Some(&[])), Fp8Scaling::Tensor);
    assert_eq!(scaling_mode(&w, Some(&[1])), Fp8Scaling::Tensor);
    assert_eq!(scaling_mode(&w, Some(&[5120])), Fp8Scaling::Channel);
    assert_eq!(scaling_mode(&w, Some(&[5120, 1])), Fp8Scaling::Channel);
    assert_eq!(
        scaling_mode(&w, Some(&[5120, 80, 1])),
        Fp8Scaling::Block { size: 64 }
    );
    assert_eq!(
        scaling_mode(&w, Some(&[40, 40])),
        Fp8Scaling::Tile {
            rows: 128,
            cols: 128
        }
    );
    assert_eq!(scaling_mode(&w, Some(&[7, 3, 2])), Fp8Scaling::Unrecognised);
    assert_eq!(scaling_mode(&[], Some(&[2])), Fp8Scaling::Unrecognised);
}
