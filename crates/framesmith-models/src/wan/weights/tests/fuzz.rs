//! Damaged inputs never make the reader panic: every prefix of a small checkpoint, random byte flips in the
//! header and data, and damaged shard indexes.

use anyhow::Result;
use candle_core::Device;
use rand::{Rng, SeedableRng};

use crate::wan::weights::header::read_header_from;
use crate::wan::weights::testkit::{dit_specs, safetensors_bytes, scratch_dir, write_sharded};
use crate::wan::weights::*;

/// A complete Wan DiT small enough to try every prefix of (about 8 kB).
fn micro() -> WanConfig {
    let mut cfg = WanConfig::tiny(1);
    (
        cfg.dim,
        cfg.ffn_dim,
        cfg.freq_dim,
        cfg.text_dim,
        cfg.num_heads,
    ) = (8, 16, 8, 8, 2);
    cfg
}

#[test]
fn every_prefix_is_refused_without_panic() -> Result<()> {
    let full = safetensors_bytes(&dit_specs(&micro(), "F16"), &[("format", "pt")]);
    let path = std::path::Path::new("micro.safetensors");
    let read =
        |bytes: &[u8]| read_header_from(&mut std::io::Cursor::new(bytes), bytes.len() as u64, path);
    assert!(read(&full).is_ok());
    for len in 0..full.len() {
        assert!(
            read(&full[..len]).is_err(),
            "a {len}-byte prefix of {} bytes was accepted",
            full.len()
        );
    }
    // The whole path (files, detection) on a sample of prefix lengths: every length up to 64, then a spread.
    let dir = scratch_dir()?;
    let file = dir.path().join("micro.safetensors");
    std::fs::write(&file, &full)?;
    assert_eq!(inspect(&file)?.config.dim, 8);
    for len in (0..64).chain((64..full.len()).step_by(97)) {
        std::fs::write(&file, &full[..len])?;
        assert!(inspect(&file).is_err(), "a {len}-byte prefix was accepted");
    }
    Ok(())
}

#[test]
fn random_byte_flips_never_panic() -> Result<()> {
    let dir = scratch_dir()?;
    let path = dir.path().join("flipped.safetensors");
    let full = safetensors_bytes(&dit_specs(&micro(), "F16"), &[]);
    let header_end = u64::from_le_bytes(full[..8].try_into()?) as usize + 8;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5afe);
    let mut accepted = 0;
    for _ in 0..1000 {
        let mut bytes = full.clone();
        for _ in 0..rng.random_range(1..4) {
            // Mostly the header, where the parsing is; sometimes the data or the length field.
            let at = if rng.random_bool(0.8) {
                rng.random_range(0..header_end)
            } else {
                rng.random_range(0..bytes.len())
            };
            bytes[at] = match rng.random_range(0..3) {
                0 => bytes[at] ^ (1 << rng.random_range(0..8)),
                1 => rng.random(),
                _ => *b"{}[]\",:0123456789-e"
                    .get(rng.random_range(0..19))
                    .unwrap_or(&b'0'),
            };
        }
        if rng.random_bool(0.1) {
            bytes.truncate(rng.random_range(0..bytes.len()));
        }
        std::fs::write(&path, &bytes)?;
        if inspect(&path).is_ok() {
            accepted += 1;
            let _ = load(&path, Some(&micro()), &Device::Cpu);
        }
    }
    // Flips in tensor data leave a valid file: the test did reach the loader.
    assert!(accepted > 0);
    Ok(())
}

#[test]
fn damaged_indexes_never_panic() -> Result<()> {
    let dir = scratch_dir()?;
    write_sharded(dir.path(), &dit_specs(&micro(), "F16"), 2, true)?;
    let index = dir
        .path()
        .join("diffusion_pytorch_model.safetensors.index.json");
    let original = std::fs::read(&index)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x1d);
    for _ in 0..300 {
        let mut bytes = original.clone();
        let at = rng.random_range(0..bytes.len());
        bytes[at] = rng.random();
        std::fs::write(&index, &bytes)?;
        let _ = inspect(dir.path());
    }
    Ok(())
}
