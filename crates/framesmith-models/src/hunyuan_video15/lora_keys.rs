//! HunyuanVideo 1.5 LoRA files in ComfyUI's layout. Framesmith names its adapters as the official checkpoint and
//! musubi-tuner do (`lora_unet_double_blocks_0_img_attn_q`), which musubi-tuner loads; ComfyUI's HunyuanVideo
//! model has other modules, so a file for ComfyUI is converted as musubi-tuner's
//! `convert_hunyuan_video_1_5_lora_to_comfy.py` does: `img_mod_linear` → `img_mod_lin`, `img_mlp_fc1` / `fc2` →
//! `img_mlp_0` / `img_mlp_2` (and `txt_…`), and each stream's q, k, v made one `img_attn_qkv` adapter of three
//! times the rank — downs stacked, ups block-diagonal, alpha ×3 so that alpha / rank, the scale, is unchanged.
//! [`from_comfyui`] reads such a file (or any stacked LoRA ComfyUI users trained) back exactly: q, k and v each
//! keep the whole `down` and their rows of `up`.

use std::collections::HashMap;

use candle_core::{Result, Tensor};

/// Module-name renames from musubi-tuner's names to ComfyUI's.
const RENAMES: [(&str, &str); 6] = [
    ("_img_mlp_fc1", "_img_mlp_0"),
    ("_img_mlp_fc2", "_img_mlp_2"),
    ("_img_mod_linear", "_img_mod_lin"),
    ("_txt_mlp_fc1", "_txt_mlp_0"),
    ("_txt_mlp_fc2", "_txt_mlp_2"),
    ("_txt_mod_linear", "_txt_mod_lin"),
];

/// `module` without its `_q` / `_k` / `_v` ending when it is a double block's attention projection: (the fused
/// module's name, index of the part).
fn qkv_part(module: &str) -> Option<(String, usize)> {
    ["_q", "_k", "_v"].iter().enumerate().find_map(|(i, end)| {
        let base = module.strip_suffix(end)?;
        (base.ends_with("_img_attn") || base.ends_with("_txt_attn"))
            .then(|| (format!("{base}_qkv"), i))
    })
}

/// The musubi-tuner names of the q, k and v adapters whose rows ComfyUI's stacked module `musubi_module`
/// (`lora_unet_double_blocks_0_img_attn_qkv`) holds, in row order; `None` for any other module. A merge into a
/// ComfyUI-layout HunyuanVideo 1.5 file applies each to its third of the stacked weight's rows.
pub fn stacked_qkv(musubi_module: &str) -> Option<[String; 3]> {
    let base = musubi_module
        .strip_suffix("_qkv")
        .filter(|b| b.ends_with("_img_attn") || b.ends_with("_txt_attn"))?;
    Some(["q", "k", "v"].map(|x| format!("{base}_{x}")))
}

/// One fused q / k / v adapter from its three parts' `lora_down.weight`, `lora_up.weight` and `alpha`.
fn fuse(name: &str, parts: &[HashMap<&str, Tensor>; 3]) -> Result<Vec<(String, Tensor)>> {
    let get = |i: usize, key: &str| -> Result<&Tensor> {
        parts[i].get(key).ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "the LoRA's `{name}` needs q, k and v adapters with `{key}` each to be stacked for ComfyUI"
            ))
        })
    };
    let (rank, _) = get(0, "lora_down.weight")?.dims2()?;
    let downs = (0..3)
        .map(|i| get(i, "lora_down.weight"))
        .collect::<Result<Vec<_>>>()?;
    let down = Tensor::cat(&downs, 0)?;
    let mut rows = Vec::with_capacity(3);
    for i in 0..3 {
        let up = get(i, "lora_up.weight")?;
        let (out, r) = up.dims2()?;
        if r != rank {
            candle_core::bail!("the LoRA's q, k and v of `{name}` have different ranks");
        }
        let zeros = |n: usize| Tensor::zeros((out, n), up.dtype(), up.device());
        rows.push(Tensor::cat(
            &[&zeros(i * rank)?, up, &zeros((2 - i) * rank)?],
            1,
        )?);
    }
    let mut out = vec![
        (format!("{name}.lora_down.weight"), down),
        (format!("{name}.lora_up.weight"), Tensor::cat(&rows, 0)?),
    ];
    let alphas: Vec<Option<&Tensor>> = parts.iter().map(|p| p.get("alpha")).collect();
    match alphas[..] {
        [None, None, None] => {}
        [Some(a), Some(b), Some(c)] => {
            let value = |t: &Tensor| -> Result<Vec<f64>> {
                t.flatten_all()?
                    .to_dtype(candle_core::DType::F64)?
                    .to_vec1::<f64>()
            };
            if value(a)? != value(b)? || value(a)? != value(c)? {
                candle_core::bail!(
                    "the LoRA's q, k and v of `{name}` have different alphas; ComfyUI's stacked adapter has one"
                );
            }
            out.push((format!("{name}.alpha"), a.affine(3.0, 0.0)?))
        }
        _ => candle_core::bail!("the LoRA's q, k and v of `{name}` do not all have an alpha"),
    }
    Ok(out)
}

/// The tensors of a HunyuanVideo 1.5 LoRA file with musubi-tuner's names (`lora_unet_…`) in ComfyUI's layout.
/// Adapters that are not plain LoRAs cannot be stacked: a LoKr, LoHa or DoRA on q, k or v is an error.
pub fn to_comfyui(tensors: &HashMap<String, Tensor>) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    let mut fused: HashMap<String, [HashMap<&str, Tensor>; 3]> = HashMap::new();
    for (key, tensor) in tensors {
        let Some((module, suffix)) = key.split_once('.') else {
            out.insert(key.clone(), tensor.clone());
            continue;
        };
        if let Some((name, part)) = qkv_part(module) {
            if !matches!(suffix, "lora_down.weight" | "lora_up.weight" | "alpha") {
                candle_core::bail!(
                    "`{key}`: ComfyUI stacks q, k and v in one adapter, which only plain LoRAs can be (save a LoRA, \
                     or keep musubi-tuner's names)"
                );
            }
            fused.entry(name).or_default()[part].insert(suffix, tensor.clone());
            continue;
        }
        let renamed = RENAMES
            .iter()
            .find_map(|(from, to)| module.strip_suffix(from).map(|base| format!("{base}{to}")))
            .unwrap_or_else(|| module.to_string());
        out.insert(format!("{renamed}.{suffix}"), tensor.clone());
    }
    for (name, parts) in &fused {
        out.extend(fuse(name, parts)?);
    }
    Ok(out)
}

/// The tensors of a HunyuanVideo 1.5 LoRA file in ComfyUI's layout with musubi-tuner's names, exactly: a stacked
/// `img_attn_qkv` adapter whose `up` is block-diagonal (as [`to_comfyui`] writes it) becomes the three adapters
/// it was made of (a third of the rank each, alpha / 3), so musubi → ComfyUI → musubi gives the same tensors;
/// any other stacked adapter becomes three of the same rank and alpha, each with the whole `down` and its third
/// of `up`'s rows (up · down restricted to those rows is that projection's weight change).
pub fn from_comfyui(tensors: &HashMap<String, Tensor>) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    let mut stacked: HashMap<&str, HashMap<&str, &Tensor>> = HashMap::new();
    for (key, tensor) in tensors {
        let Some((module, suffix)) = key.split_once('.') else {
            out.insert(key.clone(), tensor.clone());
            continue;
        };
        if let Some(base) = module
            .strip_suffix("_qkv")
            .filter(|b| b.ends_with("_img_attn") || b.ends_with("_txt_attn"))
        {
            if !matches!(suffix, "lora_up.weight" | "lora_down.weight" | "alpha") {
                candle_core::bail!(
                    "`{key}`: only a plain LoRA on ComfyUI's stacked q, k, v can be split for musubi-tuner's names"
                );
            }
            stacked.entry(base).or_default().insert(suffix, tensor);
            continue;
        }
        let renamed = RENAMES
            .iter()
            .find_map(|(to, from)| module.strip_suffix(from).map(|base| format!("{base}{to}")))
            .unwrap_or_else(|| module.to_string());
        out.insert(format!("{renamed}.{suffix}"), tensor.clone());
    }
    for (base, parts) in stacked {
        let (Some(down), Some(up)) = (parts.get("lora_down.weight"), parts.get("lora_up.weight"))
        else {
            candle_core::bail!("`{base}_qkv` needs lora_down and lora_up tensors");
        };
        out.extend(split_stacked(base, down, up, parts.get("alpha").copied())?);
    }
    Ok(out)
}

/// Whether `up` [3·out, 3·r] is zero off its three diagonal blocks [out, r].
fn block_diagonal(up: &Tensor) -> Result<bool> {
    let (rows, cols) = up.dims2()?;
    if rows % 3 != 0 || cols % 3 != 0 {
        return Ok(false);
    }
    let (o, r) = (rows / 3, cols / 3);
    for i in 0..3 {
        let band = up.narrow(0, i * o, o)?;
        for j in (0..3).filter(|j| *j != i) {
            let block = band
                .narrow(1, j * r, r)?
                .to_dtype(candle_core::DType::F32)?;
            if block.abs()?.max_all()?.to_scalar::<f32>()? != 0.0 {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// The q, k and v adapters (musubi-tuner's keys) of a stacked `{base}_qkv` adapter.
fn split_stacked(
    base: &str,
    down: &Tensor,
    up: &Tensor,
    alpha: Option<&Tensor>,
) -> Result<Vec<(String, Tensor)>> {
    let exact = block_diagonal(up)? && down.dim(0)? == up.dim(1)?;
    let rows = up.dim(0)? / 3;
    let rank = if exact { up.dim(1)? / 3 } else { up.dim(1)? };
    let mut out = Vec::with_capacity(9);
    for (i, x) in ["q", "k", "v"].iter().enumerate() {
        let m = format!("{base}_{x}");
        let from = if exact { i * rank } else { 0 };
        let part_up = up.narrow(0, i * rows, rows)?.narrow(1, from, rank)?;
        out.push((format!("{m}.lora_down.weight"), down.narrow(0, from, rank)?));
        out.push((format!("{m}.lora_up.weight"), part_up.contiguous()?));
        if let Some(a) = alpha {
            let a = if exact { third(a)? } else { a.clone() };
            out.push((format!("{m}.alpha"), a));
        }
    }
    Ok(out)
}

/// `alpha / 3` in `alpha`'s dtype and shape, divided in f64 (exact for the alphas [`to_comfyui`] tripled from
/// integers and halves).
fn third(alpha: &Tensor) -> Result<Tensor> {
    let value = alpha
        .flatten_all()?
        .to_dtype(candle_core::DType::F64)?
        .to_vec1::<f64>()?;
    let thirds: Vec<f64> = value.iter().map(|v| v / 3.0).collect();
    Tensor::from_vec(thirds, alpha.shape(), alpha.device())?.to_dtype(alpha.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn randn(shape: (usize, usize), seed: f64) -> Result<Tensor> {
        let n = shape.0 * shape.1;
        let values: Vec<f32> = (0..n)
            .map(|i| ((i as f64 * 0.7 + seed).sin()) as f32)
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu)
    }

    /// The weight change alpha / rank · up · down of one adapter.
    fn delta(t: &HashMap<String, Tensor>, module: &str) -> Result<Tensor> {
        let down = &t[&format!("{module}.lora_down.weight")];
        let up = &t[&format!("{module}.lora_up.weight")];
        let rank = down.dim(0)? as f64;
        let alpha = f64::from(t[&format!("{module}.alpha")].to_scalar::<f32>()?);
        up.matmul(down)?.affine(alpha / rank, 0.0)
    }

    #[test]
    fn q_k_v_stack_into_one_adapter_with_the_same_weight_change() -> Result<()> {
        let base = "lora_unet_double_blocks_3_img_attn";
        let mut musubi = HashMap::new();
        for (i, x) in ["q", "k", "v"].iter().enumerate() {
            let m = format!("{base}_{x}");
            musubi.insert(format!("{m}.lora_down.weight"), randn((2, 4), i as f64)?);
            musubi.insert(
                format!("{m}.lora_up.weight"),
                randn((4, 2), 10.0 + i as f64)?,
            );
            musubi.insert(format!("{m}.alpha"), Tensor::new(1.5f32, &Device::Cpu)?);
        }
        let mlp = "lora_unet_double_blocks_3_txt_mlp_fc1.lora_up.weight";
        musubi.insert(mlp.into(), Tensor::zeros((4, 2), DType::F32, &Device::Cpu)?);
        let comfy = to_comfyui(&musubi)?;
        assert!(comfy.contains_key("lora_unet_double_blocks_3_txt_mlp_0.lora_up.weight"));
        assert_eq!(comfy.len(), 4);
        let fused = delta(&comfy, &format!("{base}_qkv"))?;
        let parts = ["q", "k", "v"]
            .iter()
            .map(|x| delta(&musubi, &format!("{base}_{x}")))
            .collect::<Result<Vec<_>>>()?;
        let want = Tensor::cat(&parts, 0)?;
        let diff = (fused - want)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(
            diff < 1e-6,
            "the stacked adapter changes the weight by {diff} more"
        );
        Ok(())
    }

    #[test]
    fn q_k_v_of_different_alphas_are_not_stacked_under_one() -> Result<()> {
        let base = "lora_unet_double_blocks_0_img_attn";
        let mut musubi = HashMap::new();
        for (i, x) in ["q", "k", "v"].iter().enumerate() {
            let m = format!("{base}_{x}");
            musubi.insert(format!("{m}.lora_down.weight"), randn((2, 4), i as f64)?);
            musubi.insert(
                format!("{m}.lora_up.weight"),
                randn((4, 2), 5.0 + i as f64)?,
            );
            let alpha = if *x == "k" { 2f32 } else { 1.5 };
            musubi.insert(format!("{m}.alpha"), Tensor::new(alpha, &Device::Cpu)?);
        }
        let err = to_comfyui(&musubi)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("different alphas"), "{err}");
        Ok(())
    }

    #[test]
    fn a_lokr_on_q_cannot_be_stacked() -> Result<()> {
        let key = "lora_unet_double_blocks_0_txt_attn_q.lokr_w1".to_string();
        let lokr = HashMap::from([(key, Tensor::zeros((2, 2), DType::F32, &Device::Cpu)?)]);
        let err = to_comfyui(&lokr)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("plain LoRAs"), "{err}");
        Ok(())
    }
}
