//! Tests of the cache formats: exact names, keys and metadata as musubi-tuner writes them, reading files made
//! outside our writer, and round trips.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use super::*;
use crate::config::DatasetKind;
use crate::frames::FrameWindow;
use crate::tensor_file::CacheError;

fn ramp(shape: &[usize], dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::arange(0f32, n as f32, &Device::Cpu)
        .unwrap()
        .affine(0.25, -1.0)
        .unwrap()
        .reshape(shape)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn same(a: &Tensor, b: &Tensor) -> bool {
    a.dtype() == b.dtype()
        && a.dims() == b.dims()
        && a.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            == b.to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
}

/// Tensor name, dtype and shape, as stored in a file's header.
type Entry = (String, Dtype, Vec<usize>);

fn header(path: &Path) -> (Vec<Entry>, HashMap<String, String>) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut keys: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(k, v)| (k, v.dtype(), v.shape().to_vec()))
        .collect();
    keys.sort();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    (keys, meta.metadata().clone().unwrap_or_default())
}

#[test]
fn file_names_match_musubi() {
    let w = FrameWindow {
        start: 0,
        frames: 17,
    };
    assert_eq!(
        video_latent_cache_name("clip", w, (1280, 720)),
        "clip_00000-017_1280x0720_wan.safetensors"
    );
    let w = FrameWindow {
        start: 120,
        frames: 81,
    };
    assert_eq!(
        video_latent_cache_name("a_b", w, (832, 480)),
        "a_b_00120-081_0832x0480_wan.safetensors"
    );
    assert_eq!(
        image_latent_cache_name("img", (512, 512)),
        "img_0512x0512_wan.safetensors"
    );
    assert_eq!(
        image_latent_cache_name("big", (12000, 90)),
        "big_12000x0090_wan.safetensors"
    );
    assert_eq!(text_cache_name("clip"), "clip_wan_te.safetensors");
    assert_eq!(media_stem(Path::new("/d/my.clip.v2.mp4")), "my.clip.v2");
}

#[test]
fn names_parse_back_like_musubis_loader() {
    let n = parse_latent_cache_name(
        "my_clip_1_00005-033_0832x0480_wan.safetensors",
        DatasetKind::Video,
    )
    .unwrap();
    assert_eq!(n.stem, "my_clip_1");
    assert_eq!(
        n.window,
        Some(FrameWindow {
            start: 5,
            frames: 33
        })
    );
    assert_eq!(n.original_size, (832, 480));
    // FramePack-style section index after the frame count.
    let n = parse_latent_cache_name(
        "v_00000-017-02_0640x0360_wan.safetensors",
        DatasetKind::Video,
    )
    .unwrap();
    assert_eq!(
        n.window,
        Some(FrameWindow {
            start: 0,
            frames: 17
        })
    );
    let n =
        parse_latent_cache_name("photo_one_1024x0768_wan.safetensors", DatasetKind::Image).unwrap();
    assert_eq!(
        (n.stem.as_str(), n.window, n.original_size),
        ("photo_one", None, (1024, 768))
    );
    assert_eq!(
        parse_latent_cache_name("x_0512x0512_hv.safetensors", DatasetKind::Image),
        None
    );
    assert_eq!(
        parse_latent_cache_name("clip_wan_te.safetensors", DatasetKind::Image),
        None
    );
    assert_eq!(
        parse_latent_cache_name("x_0512x0512_wan.safetensors", DatasetKind::Video),
        None
    );
}

#[test]
fn latent_cache_has_musubis_keys_and_metadata_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(video_latent_cache_name(
        "clip",
        FrameWindow {
            start: 0,
            frames: 17,
        },
        (1280, 720),
    ));
    let cache = WanLatentCache {
        latents: ramp(&[16, 5, 4, 6], DType::BF16),
        latents_image: Some(ramp(&[20, 5, 4, 6], DType::BF16)),
        latents_control: None,
        clip: Some(ramp(&[3, 8], DType::F16)),
        f_indices: Some(vec![0, 9]),
    };
    let meta = LatentCacheMetadata::wan((1280, 720), Some(17));
    assert!(write_wan_latent_cache(&path, &cache, &meta)
        .unwrap()
        .is_empty());

    // The planner reads the latents' shape from the header alone (not the image latents' 20 channels).
    assert_eq!(read_latent_shape(&path).unwrap(), [16, 5, 4, 6]);
    let (keys, metadata) = header(&path);
    let names: Vec<&str> = keys.iter().map(|(k, _, _)| k.as_str()).collect();
    // musubi-tuner names the clip tensor after the latents' dtype, though the tensor is float16.
    assert_eq!(
        names,
        vec![
            "clip_bfloat16",
            "f_indices_int32",
            "latents_5x4x6_bfloat16",
            "latents_image_5x4x6_bfloat16"
        ]
    );
    assert_eq!(keys[0].1, Dtype::F16);
    assert_eq!((keys[1].1, keys[1].2.clone()), (Dtype::I32, vec![2]));
    assert_eq!(
        (keys[2].1, keys[2].2.clone()),
        (Dtype::BF16, vec![16, 5, 4, 6])
    );
    let expected: HashMap<String, String> = [
        ("architecture", "wan"),
        ("width", "1280"),
        ("height", "720"),
        ("format_version", "1.0.1"),
        ("frame_count", "17"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(metadata, expected);

    let (back, back_meta) = read_wan_latent_cache(&path, &Device::Cpu).unwrap();
    assert_eq!(back_meta, meta);
    assert!(same(&back.latents, &cache.latents));
    assert!(same(
        back.latents_image.as_ref().unwrap(),
        cache.latents_image.as_ref().unwrap()
    ));
    assert!(same(
        back.clip.as_ref().unwrap(),
        cache.clip.as_ref().unwrap()
    ));
    assert!(back.latents_control.is_none());
    assert_eq!(back.f_indices, Some(vec![0, 9]));
    assert!(!dir
        .path()
        .join(format!(
            "{}.tmp",
            path.file_name().unwrap().to_string_lossy()
        ))
        .exists());
}

#[test]
fn image_cache_has_no_frame_count_and_nans_become_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(image_latent_cache_name("img", (512, 384)));
    let latents = Tensor::new(&[f32::NAN, 1.0, 2.0, 3.0], &Device::Cpu)
        .unwrap()
        .reshape((1, 1, 2, 2))
        .unwrap();
    let cache = WanLatentCache {
        latents,
        latents_image: None,
        latents_control: None,
        clip: None,
        f_indices: None,
    };
    let nan =
        write_wan_latent_cache(&path, &cache, &LatentCacheMetadata::wan((512, 384), None)).unwrap();
    assert_eq!(nan, vec!["latents_1x2x2_float32".to_string()]);
    let (keys, metadata) = header(&path);
    assert_eq!(keys.len(), 1);
    assert!(!metadata.contains_key("frame_count"));
    let (back, meta) = read_wan_latent_cache(&path, &Device::Cpu).unwrap();
    assert_eq!(meta.frame_count, None);
    assert_eq!(
        back.latents
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap(),
        vec![0.0, 1.0, 2.0, 3.0]
    );
}

/// A cache as musubi-tuner's Python writes it, built with the safetensors crate alone.
#[test]
fn reads_a_cache_written_outside_framesmith() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v_00000-005_0064x0048_wan.safetensors");
    let latents: Vec<u8> = (0..16 * 2 * 6 * 8)
        .flat_map(|i| half::bf16::from_f32(i as f32).to_le_bytes())
        .collect();
    let control: Vec<u8> = vec![0; 16 * 2 * 6 * 8 * 2];
    let views = vec![
        (
            "latents_2x6x8_bfloat16",
            TensorView::new(Dtype::BF16, vec![16, 2, 6, 8], &latents).unwrap(),
        ),
        (
            "latents_control_2x6x8_bfloat16",
            TensorView::new(Dtype::BF16, vec![16, 2, 6, 8], &control).unwrap(),
        ),
    ];
    let meta: HashMap<String, String> = [
        ("architecture", "wan"),
        ("width", "64"),
        ("height", "48"),
        ("format_version", "1.0.1"),
        ("frame_count", "5"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    safetensors::serialize_to_file(views, Some(meta), &path).unwrap();
    let (cache, meta) = read_wan_latent_cache(&path, &Device::Cpu).unwrap();
    assert_eq!(cache.latents.dims(), &[16, 2, 6, 8]);
    assert_eq!(cache.latents.dtype(), DType::BF16);
    assert!(cache.latents_control.is_some());
    assert_eq!(
        (meta.width, meta.height, meta.frame_count),
        (64, 48, Some(5))
    );
}

#[test]
fn damaged_or_foreign_caches_are_reported_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad_wan.safetensors");
    std::fs::write(&path, b"not a safetensors file").unwrap();
    let err = read_wan_latent_cache(&path, &Device::Cpu).unwrap_err();
    assert!(
        matches!(err, CacheError::Format { .. })
            && err.to_string().ends_with("bad_wan.safetensors"),
        "{err}"
    );
    let err = read_latent_shape(&path).unwrap_err();
    assert!(
        matches!(err, CacheError::Format { .. })
            && err.to_string().ends_with("bad_wan.safetensors"),
        "{err}"
    );

    let hv = dir.path().join("x_hv.safetensors");
    let data = vec![0u8; 4];
    let views = vec![(
        "latents_1x1x1_float32",
        TensorView::new(Dtype::F32, vec![1, 1, 1, 1], &data).unwrap(),
    )];
    let meta = HashMap::from([("architecture".to_string(), "hunyuan_video".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &hv).unwrap();
    let err = read_wan_latent_cache(&hv, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(err.contains("hunyuan_video"), "{err}");
}

#[test]
fn text_cache_keys_metadata_and_merge() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(text_cache_name("clip"));
    let t5 = ramp(&[7, 16], DType::BF16);
    write_wan_text_cache(&path, &t5, "a cat, walking").unwrap();
    let (keys, metadata) = header(&path);
    assert_eq!(
        keys,
        vec![("varlen_t5_bfloat16".to_string(), Dtype::BF16, vec![7, 16])]
    );
    let expected: HashMap<String, String> = [
        ("architecture", "wan"),
        ("caption1", "a cat, walking"),
        ("format_version", "1.0.1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(metadata, expected);
    let back = read_wan_text_cache(&path, &Device::Cpu).unwrap();
    assert!(same(&back.t5, &t5));
    assert_eq!(back.caption, "a cat, walking");

    // Re-encoding in another dtype replaces the old tensor (no second varlen_t5), keeping unrelated keys.
    let extra = dir.path().join("extra.safetensors");
    let data = vec![0u8; 4];
    let views = vec![
        (
            "varlen_t5_bfloat16",
            TensorView::new(Dtype::BF16, vec![1, 2], &data).unwrap(),
        ),
        (
            "other_float32",
            TensorView::new(Dtype::F32, vec![1], &data).unwrap(),
        ),
    ];
    let meta = HashMap::from([
        ("architecture".to_string(), "wan".to_string()),
        ("caption1".to_string(), "old".to_string()),
        ("note".to_string(), "kept".to_string()),
    ]);
    safetensors::serialize_to_file(views, Some(meta), &extra).unwrap();
    write_wan_text_cache(&extra, &t5.to_dtype(DType::F32).unwrap(), "new").unwrap();
    let (keys, metadata) = header(&extra);
    let names: Vec<&str> = keys.iter().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(names, vec!["other_float32", "varlen_t5_float32"]);
    assert_eq!(metadata.get("caption1").map(String::as_str), Some("new"));
    assert_eq!(metadata.get("note").map(String::as_str), Some("kept"));
}
