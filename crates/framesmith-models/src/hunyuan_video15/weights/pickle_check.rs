//! A PyTorch archive's pickle checked before any of it is trusted: read with candle's pickle reader (which
//! builds objects and never calls them), every global it names must be one a tensor checkpoint needs — the
//! `torch._utils._rebuild_*` functions, `torch.*Storage` classes and dtypes, `collections.OrderedDict`,
//! `_codecs.encode` (PyTorch's own `weights_only` list, narrowed). A pickle naming anything else (`posix.system`,
//! `builtins.eval`, …) is a file that would run code in `torch.load`: it is refused, naming the global.

use std::io::Read;
use std::path::Path;

use candle_core::pickle::{Object, Stack};

/// Local file headers read before giving up on finding the pickle (PyTorch writes it first).
const MAX_ENTRIES: usize = 64;
/// Largest pickle read (a state dict's pickle is kilobytes to a few megabytes).
const MAX_PICKLE_BYTES: u64 = 256 << 20;

/// Whether `module.name` is a global a tensor checkpoint's pickle may name.
fn allowed(module: &str, name: &str) -> bool {
    const DTYPES: [&str; 12] = [
        "float32", "float", "float16", "half", "bfloat16", "float64", "double", "int64", "long",
        "int32", "int16", "uint8",
    ];
    match module {
        "collections" => name == "OrderedDict",
        "torch._utils" => name.starts_with("_rebuild_"),
        "torch._tensor" => name == "_rebuild_from_type_v2",
        "torch" => {
            name.ends_with("Storage")
                || name == "Size"
                || name == "Tensor"
                || DTYPES.contains(&name)
        }
        "torch.nn.parameter" => name == "Parameter",
        "_codecs" => name == "encode",
        _ => false,
    }
}

/// The first global of `obj` a checkpoint never needs, as `module.name`.
fn forbidden(obj: &Object) -> Option<String> {
    match obj {
        Object::Class {
            module_name,
            class_name,
        } => (!allowed(module_name, class_name)).then(|| format!("{module_name}.{class_name}")),
        Object::Tuple(items) | Object::List(items) => items.iter().find_map(forbidden),
        Object::Dict(pairs) => pairs
            .iter()
            .find_map(|(k, v)| forbidden(k).or_else(|| forbidden(v))),
        Object::Reduce { callable, args } | Object::Build { callable, args } => {
            forbidden(callable).or_else(|| forbidden(args))
        }
        Object::PersistentLoad(inner) => forbidden(inner),
        _ => None,
    }
}

fn u16_at(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn u32_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]))
}

/// The bytes of the archive's `data.pkl`, found by walking its local file headers (PyTorch stores entries
/// uncompressed, the pickle first); an error in words when it is not found that way.
fn pickle_bytes(path: &Path) -> Result<Vec<u8>, String> {
    let mut file = std::fs::File::open(path).map_err(|e| format!("cannot open it ({e})"))?;
    for _ in 0..MAX_ENTRIES {
        let mut header = [0u8; 30];
        file.read_exact(&mut header)
            .map_err(|_| "its archive ends before the pickle".to_string())?;
        if header[..4] != *b"PK\x03\x04" {
            return Err("its archive has no data.pkl entry".into());
        }
        let (flags, method, size) = (u16_at(&header, 6), u16_at(&header, 8), u32_at(&header, 18));
        let (name_len, extra_len) = (u16_at(&header, 26), u16_at(&header, 28));
        let mut name = vec![0u8; name_len];
        file.read_exact(&mut name).map_err(|e| e.to_string())?;
        std::io::copy(
            &mut (&mut file).take(extra_len as u64),
            &mut std::io::sink(),
        )
        .map_err(|e| e.to_string())?;
        if flags & 0x8 != 0 || method != 0 || size == u64::from(u32::MAX) {
            return Err("its archive is not laid out as torch.save writes it".into());
        }
        if name.ends_with(b"data.pkl") {
            if size > MAX_PICKLE_BYTES {
                return Err(format!(
                    "its pickle is {size} bytes, more than a state dict needs"
                ));
            }
            let mut bytes = Vec::with_capacity(size as usize);
            (&mut file)
                .take(size)
                .read_to_end(&mut bytes)
                .map_err(|e| e.to_string())?;
            return Ok(bytes);
        }
        std::io::copy(&mut (&mut file).take(size), &mut std::io::sink())
            .map_err(|e| e.to_string())?;
    }
    Err("its archive has no data.pkl among its first entries".into())
}

/// `Ok` when the pickle of the PyTorch archive at `path` names only what a tensor checkpoint needs; otherwise
/// why not (the global it names, or why it could not be checked).
pub(crate) fn check(path: &Path) -> Result<(), String> {
    let bytes = pickle_bytes(path)?;
    let mut stack = Stack::empty();
    stack.read_loop(&mut bytes.as_slice()).map_err(|e| {
        format!(
            "its pickle cannot be read safely ({})",
            crate::wan::weights::pickle_reason(&e)
        )
    })?;
    let obj = stack.finalize().map_err(|e| {
        format!(
            "its pickle cannot be read safely ({})",
            crate::wan::weights::pickle_reason(&e)
        )
    })?;
    match forbidden(&obj) {
        Some(global) => Err(format!(
            "its pickle names `{global}`, which a weights file never needs (torch.load would run it)"
        )),
        None => Ok(()),
    }
}
