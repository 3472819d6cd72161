//! FLUX.1 between official modules (musubi-tuner's and ComfyUI's names) and diffusers' (its tables live in
//! `framesmith_nn::lora_file`): diffusers splits the fused `qkv` and a single-stream block's `linear1` into q, k,
//! v (and the MLP input). Splitting gives each part the whole `down`, its rows of `up` and the alpha; fusing parts
//! that share one `down` concatenates their `up`s, which undoes the split exactly. Parts trained apart (their own
//! `down`s, as other trainers save them) are stacked instead: `down`s stacked, `up`s block-diagonal with each
//! part's alpha / rank folded in (f32), alpha = the summed rank.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor};
use framesmith_nn::bytes::tensor_bytes;
use framesmith_nn::lora_file::{flux_diffusers_parts, flux_official_module, musubi_name};

use super::{official_path, Modules};

type Parts = BTreeMap<String, Tensor>;

/// Modules under musubi-tuner's names → under diffusers' module paths, fused ones split.
pub(super) fn split(modules: Modules) -> Result<Modules> {
    let mut out = Modules::new();
    for (name, parts) in modules {
        let path = official_path(&name)?;
        let targets = flux_diffusers_parts(&path)
            .with_context(|| format!("FLUX.1 module `{path}` has no diffusers name"))?;
        if let [(only, _)] = targets.as_slice() {
            out.insert(only.clone(), parts);
            continue;
        }
        let (down, up) = match (parts.get("lora_down.weight"), parts.get("lora_up.weight")) {
            (Some(d), Some(u)) => (d, u),
            _ => bail!("`{name}` has no lora_down / lora_up pair"),
        };
        let units: usize = targets.iter().map(|(_, w)| w).sum();
        let rows = up.dim(0)?;
        if rows % units != 0 {
            bail!("`{name}`'s up has {rows} rows, not a multiple of the {units} parts diffusers splits it into");
        }
        let unit = rows / units;
        let mut from = 0;
        for (target, width) in targets {
            let mut part = Parts::new();
            part.insert("lora_down.weight".into(), down.clone());
            part.insert(
                "lora_up.weight".into(),
                up.narrow(0, from, width * unit)?.contiguous()?,
            );
            if let Some(a) = parts.get("alpha") {
                part.insert("alpha".into(), a.clone());
            }
            from += width * unit;
            out.insert(target, part);
        }
    }
    Ok(out)
}

/// Modules under diffusers' module paths → under musubi-tuner's names of the official modules.
pub(super) fn fuse(modules: Modules) -> Result<Modules> {
    let mut groups: BTreeMap<String, Vec<Option<Parts>>> = BTreeMap::new();
    for (path, parts) in modules {
        let (official, index, count) = flux_official_module(&path)
            .map_err(anyhow::Error::msg)?
            .with_context(|| {
                format!("`{path}` is not a module of diffusers' FLUX.1 transformer")
            })?;
        let slots = groups.entry(official).or_insert_with(|| vec![None; count]);
        slots[index] = Some(parts);
    }
    let mut out = Modules::new();
    for (official, slots) in groups {
        let name = musubi_name(&official);
        let fused = match slots.as_slice() {
            [Some(only)] => only.clone(),
            _ => match shared_down(&slots)? {
                Some(fused) => fused,
                None => stacked(&official, &slots)?,
            },
        };
        out.insert(name, fused);
    }
    Ok(out)
}

fn same_bytes(a: &Tensor, b: &Tensor) -> Result<bool> {
    Ok(a.dtype() == b.dtype() && a.dims() == b.dims() && tensor_bytes(a)? == tensor_bytes(b)?)
}

/// The fused module when every part is a plain LoRA with the same `down` and alpha (a split this file made):
/// that `down`, the `up`s concatenated.
fn shared_down(slots: &[Option<Parts>]) -> Result<Option<Parts>> {
    let Some(parts) = slots
        .iter()
        .map(Option::as_ref)
        .collect::<Option<Vec<&Parts>>>()
    else {
        return Ok(None);
    };
    let Some(first) = parts.first() else {
        return Ok(None);
    };
    let plain = |p: &Parts| {
        p.keys()
            .all(|k| matches!(k.as_str(), "lora_down.weight" | "lora_up.weight" | "alpha"))
    };
    let (Some(down), Some(_)) = (first.get("lora_down.weight"), first.get("lora_up.weight")) else {
        return Ok(None);
    };
    for p in &parts {
        let same_down = match p.get("lora_down.weight") {
            Some(d) => same_bytes(d, down)?,
            None => false,
        };
        let same_alpha = match (p.get("alpha"), first.get("alpha")) {
            (Some(a), Some(b)) => same_bytes(a, b)?,
            (None, None) => true,
            _ => false,
        };
        if !plain(p) || !same_down || !same_alpha || !p.contains_key("lora_up.weight") {
            return Ok(None);
        }
    }
    let ups: Vec<&Tensor> = parts
        .iter()
        .filter_map(|p| p.get("lora_up.weight"))
        .collect();
    let mut fused = Parts::new();
    fused.insert("lora_down.weight".into(), down.clone());
    fused.insert("lora_up.weight".into(), Tensor::cat(&ups, 0)?);
    if let Some(a) = first.get("alpha") {
        fused.insert("alpha".into(), a.clone());
    }
    Ok(Some(fused))
}

/// The fused module of parts trained apart: `down`s stacked, `up`s block-diagonal with each part's scale folded
/// in, alpha = the summed rank; a missing part adds zero rows (q, k, v: the model width; the MLP input: 4×).
fn stacked(official: &str, slots: &[Option<Parts>]) -> Result<Parts> {
    let mut present = Vec::new();
    for p in slots.iter().flatten() {
        let (Some(down), Some(up)) = (p.get("lora_down.weight"), p.get("lora_up.weight")) else {
            bail!("a part of `{official}` is not a plain LoRA; only plain LoRA parts can be fused for it");
        };
        let rank = down.dim(0)?;
        let alpha = match p.get("alpha") {
            Some(a) => f64::from(
                a.to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?
                    .first()
                    .copied()
                    .unwrap_or(rank as f32),
            ),
            None => rank as f64,
        };
        present.push((
            down.to_dtype(DType::F32)?,
            (up.to_dtype(DType::F32)? * (alpha / rank as f64))?,
        ));
    }
    let Some((first_down, _)) = present.first() else {
        bail!("no parts for `{official}`");
    };
    let in_dim = first_down.dim(1)?;
    let device = first_down.device().clone();
    let total: usize = present
        .iter()
        .map(|(d, _)| d.dim(0))
        .sum::<candle_core::Result<usize>>()?;
    let mut rows = Vec::new();
    let (mut before, mut next) = (0, present.iter());
    for (i, slot) in slots.iter().enumerate() {
        let Some(_) = slot else {
            let width = if i == 3 { 4 * in_dim } else { in_dim };
            rows.push(Tensor::zeros((width, total), DType::F32, &device)?);
            continue;
        };
        let Some((down, up)) = next.next() else { break };
        let rank = down.dim(0)?;
        let out = up.dim(0)?;
        let mut pieces = Vec::new();
        if before > 0 {
            pieces.push(Tensor::zeros((out, before), DType::F32, &device)?);
        }
        pieces.push(up.clone());
        if total - before - rank > 0 {
            pieces.push(Tensor::zeros(
                (out, total - before - rank),
                DType::F32,
                &device,
            )?);
        }
        rows.push(Tensor::cat(&pieces, 1)?);
        before += rank;
    }
    let downs: Vec<&Tensor> = present.iter().map(|(d, _)| d).collect();
    let mut fused = Parts::new();
    fused.insert("lora_down.weight".into(), Tensor::cat(&downs, 0)?);
    fused.insert("lora_up.weight".into(), Tensor::cat(&rows, 0)?);
    fused.insert("alpha".into(), Tensor::new(total as f32, &device)?);
    Ok(fused)
}
