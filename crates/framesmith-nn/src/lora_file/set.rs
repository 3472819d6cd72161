//! Writing a [`LoraSet`] (musubi-tuner's keys, LyCORIS' for the other kinds, fsynced then renamed into place) and
//! reading a file's weights back into one (resume, `lora.init_from`).

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use safetensors::tensor::{Dtype as StDtype, TensorView};

use super::{
    check_shapes, kinds, musubi_name, not_in_model, sorted_write, FileResult, LoraFile,
    LoraFileError,
};
use crate::lora::LoraSet;

/// One tensor of a file being written: key, dtype, shape, little-endian bytes.
type Entry = (String, StDtype, Vec<usize>, Vec<u8>);

/// The keys a saved LoRA file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveLayout {
    /// musubi-tuner's (`lora_unet_blocks_0_self_attn_q.lora_down.weight`, `lora_up`, `alpha`); LyCORIS' for the
    /// other adapter kinds.
    Musubi,
    /// PEFT's state dict under `prefix` with the module's dotted path (`diffusion_model.transformer_blocks.0.
    /// attn1.to_q.lora_A.weight`, `lora_B`) and no alpha: `lora_B` carries `alpha / rank`, as loaders
    /// that apply `B · A` unscaled need (an official trainer's layout). Other adapter kinds keep musubi's keys.
    Peft { prefix: &'static str },
}

impl LoraSet {
    /// Writes the adapters with musubi-tuner's keys, tensors in `dtype` (f32, bf16 or f16; `alpha` always an f32
    /// scalar) and `metadata` in the header. Refuses to write NaN or infinite values; an existing file at
    /// `path` is replaced only once the new one is complete on disk.
    pub fn save(
        &self,
        path: &Path,
        dtype: DType,
        metadata: &HashMap<String, String>,
    ) -> FileResult<()> {
        self.save_as(path, dtype, metadata, SaveLayout::Musubi)
    }

    /// [`LoraSet::save`] with the keys of `layout`.
    pub fn save_as(
        &self,
        path: &Path,
        dtype: DType,
        metadata: &HashMap<String, String>,
        layout: SaveLayout,
    ) -> FileResult<()> {
        let st_dtype = match dtype {
            DType::F32 => StDtype::F32,
            DType::BF16 => StDtype::BF16,
            DType::F16 => StDtype::F16,
            other => return Err(LoraFileError::SaveDtype(other)),
        };
        let mut entries: Vec<Entry> = Vec::new();
        let entry = |key: String, t: &Tensor| -> FileResult<Entry> {
            let t = t.to_device(&Device::Cpu)?.to_dtype(dtype)?;
            let bytes = tensor_bytes(&t)?.ok_or_else(|| LoraFileError::NonFinite {
                key: key.clone(),
                path: path.to_path_buf(),
            })?;
            Ok((key, st_dtype, t.dims().to_vec(), bytes))
        };
        for (module_path, lora) in self.iter() {
            let name = musubi_name(module_path);
            if !lora.alpha().is_finite() {
                return Err(LoraFileError::NonFinite {
                    key: format!("{name}.alpha"),
                    path: path.to_path_buf(),
                });
            }
            if let (SaveLayout::Peft { prefix }, Some(plain)) = (layout, lora.as_lora()) {
                let key = format!("{prefix}{module_path}");
                entries.push(entry(
                    format!("{key}.lora_A.weight"),
                    plain.down.as_tensor(),
                )?);
                // Loaders of this layout apply `B · A` unscaled: the scale goes into B.
                let up = plain.up.as_tensor().to_dtype(DType::F32)?;
                let scale = plain.alpha / plain.rank() as f64;
                entries.push(entry(format!("{key}.lora_B.weight"), &(up * scale)?)?);
                continue;
            }
            for (suffix, var) in lora.named_vars() {
                entries.push(entry(format!("{name}.{suffix}"), var.as_tensor())?);
            }
            let alpha = (lora.alpha() as f32).to_le_bytes().to_vec();
            entries.push((format!("{name}.alpha"), StDtype::F32, vec![], alpha));
        }
        for (key, dt, shape, bytes) in &entries {
            // The sizes must agree before the header promises them.
            TensorView::new(*dt, shape.clone(), bytes).map_err(|e| LoraFileError::Format {
                reason: format!("tensor `{key}`: {e}"),
                path: path.to_path_buf(),
            })?;
        }
        write_atomically(path, |tmp| {
            sorted_write::write_sorted(tmp, &entries, metadata).map_err(|source| {
                LoraFileError::Io {
                    action: "write",
                    path: path.to_path_buf(),
                    source,
                }
            })
        })
    }

    /// Copies a file's weights into these adapters' variables (resuming or continuing training); the layers
    /// share the variables, so they see the new values. The file must hold exactly these modules, of the same
    /// kind, with the same shapes and alphas.
    pub fn load_weights(&self, file: &LoraFile) -> FileResult<()> {
        let ours: Vec<String> = self.iter().map(|(p, _)| musubi_name(p)).collect();
        let extra: Vec<&str> = file
            .modules
            .iter()
            .map(|m| m.name.as_str())
            .chain(file.adapters.iter().map(|m| m.name.as_str()))
            .filter(|name| !ours.iter().any(|o| o == name))
            .collect();
        if !extra.is_empty() {
            return Err(not_in_model(&extra));
        }
        let mismatch = |name: &str, reason: String| LoraFileError::ShapeMismatch {
            name: name.to_string(),
            reason,
        };
        let mut pairs = Vec::with_capacity(ours.len());
        let mut others = Vec::new();
        for ((_, adapter), name) in self.iter().zip(&ours) {
            let Some(lora) = adapter.as_lora() else {
                let m = file.adapter(name).ok_or_else(|| {
                    let what = match file.get(name) {
                        Some(_) => "a plain LoRA module",
                        None => "no weights for this module",
                    };
                    mismatch(
                        name,
                        format!(
                            "the file has {what}; this run trains {}",
                            adapter.kind_name()
                        ),
                    )
                })?;
                others.push((adapter, m, name));
                continue;
            };
            let m = file.get(name).ok_or_else(|| {
                mismatch(
                    name,
                    "the file has no plain LoRA weights for this module".to_string(),
                )
            })?;
            check_shapes(m, lora.in_dim(), lora.out_dim(), Some(lora.rank()))?;
            if (m.alpha - lora.alpha).abs() > 1e-6 * lora.alpha.abs().max(1.0) {
                let reason = format!("alpha {} in the file, {} configured", m.alpha, lora.alpha);
                return Err(mismatch(name, reason));
            }
            pairs.push((lora, m));
        }
        for (adapter, m, name) in others {
            kinds::copy_into(adapter, m, name)?;
        }
        for (lora, m) in pairs {
            lora.down.set(
                &m.down
                    .to_dtype(lora.down.dtype())?
                    .to_device(lora.down.device())?,
            )?;
            lora.up.set(
                &m.up
                    .to_dtype(lora.up.dtype())?
                    .to_device(lora.up.device())?,
            )?;
        }
        Ok(())
    }
}

/// Little-endian bytes of a CPU f32/bf16/f16 tensor, or `None` when a value is not finite.
fn tensor_bytes(t: &Tensor) -> FileResult<Option<Vec<u8>>> {
    let flat = t.flatten_all()?;
    let all_finite = flat
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?
        .iter()
        .all(|v| v.is_finite());
    if !all_finite {
        return Ok(None);
    }
    if !matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16) {
        return Err(LoraFileError::SaveDtype(t.dtype()));
    }
    let bytes = crate::bytes::tensor_bytes(t)?;
    Ok(Some(bytes))
}

/// Runs `write` on a temporary file next to `path`, fsyncs it, renames it over `path` and fsyncs the folder.
/// On failure the temporary file is removed and `path` is untouched.
pub(super) fn write_atomically(
    path: &Path,
    write: impl FnOnce(&Path) -> FileResult<()>,
) -> FileResult<()> {
    let io = |action, source| LoraFileError::Io {
        action,
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Some(file_name) = path.file_name() else {
        return Err(io("write", std::io::Error::other("the path names no file")));
    };
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = write(&tmp).and_then(|()| {
        // Write access: Windows refuses FlushFileBuffers on a read-only handle.
        let file = OpenOptions::new()
            .write(true)
            .open(&tmp)
            .map_err(|e| io("reopen", e))?;
        file.sync_all().map_err(|e| io("flush", e))?;
        drop(file);
        fs::rename(&tmp, path).map_err(|e| io("rename", e))
    });
    if result.is_err() {
        // Best effort: the temporary file may not exist if writing failed early.
        let _ = fs::remove_file(&tmp);
        return result;
    }
    // Makes the rename itself durable on Unix; some filesystems reject fsync on folders, and the file's own
    // data is already on disk, so a failure here is not worth failing the save.
    #[cfg(unix)]
    if let Ok(d) = fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
