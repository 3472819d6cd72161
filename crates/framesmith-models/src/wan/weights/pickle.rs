//! PyTorch `.pth` files through candle's pickle reader (which never executes code): the tensor listing without
//! the data, and, when the reader fails, a reason in words instead of its op-codes and backtraces.

use std::path::Path;

use super::error::ModelFormatError;

/// One tensor of a `.pth` file, from its pickle (no data read).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PthTensor {
    pub name: String,
    /// Safetensors-style dtype spelling (`BF16`, `F32`).
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// The tensors of a PyTorch zip archive, at the top level or under a `state_dict` / `model` entry as training
/// checkpoints store them.
pub(crate) fn pth_listing(path: &Path) -> Result<Vec<PthTensor>, ModelFormatError> {
    let mut infos = candle_core::pickle::read_pth_tensor_info(path, false, None)
        .map_err(|e| unreadable_pickle(&e, path))?;
    for key in ["state_dict", "model"] {
        if !infos.is_empty() {
            break;
        }
        // A missing key is not an error here: the file simply has no such entry.
        infos =
            candle_core::pickle::read_pth_tensor_info(path, false, Some(key)).unwrap_or_default();
    }
    Ok(infos
        .into_iter()
        .map(|t| PthTensor {
            name: t.name,
            dtype: format!("{:?}", t.dtype).to_ascii_uppercase(),
            shape: t.layout.dims().to_vec(),
        })
        .collect())
}

/// The error for a PyTorch file candle's reader cannot read.
pub(crate) fn unreadable_pickle(e: &candle_core::Error, path: &Path) -> ModelFormatError {
    ModelFormatError::UnreadablePickle {
        reason: pickle_reason(e),
        path: path.to_path_buf(),
    }
}

/// What went wrong reading a PyTorch file, in one line: no backtrace, no op-code numbers left unexplained.
pub fn pickle_reason(e: &candle_core::Error) -> String {
    let text = innermost(e).to_string();
    let first = text.lines().next().unwrap_or_default().trim();
    if let Some(code) = first.strip_prefix("unknown op-code ") {
        let name = match code.trim() {
            "149" => " (FRAME, from pickle protocol 4 or newer)",
            "140" => " (SHORT_BINUNICODE, from pickle protocol 4 or newer)",
            "148" => " (MEMOIZE, from pickle protocol 4 or newer)",
            _ => "",
        };
        return format!(
            "its pickle uses op-code {}{name}, which Framesmith's safe reader does not read: it was saved with a \
             newer pickle protocol than torch.save's default, or by another tool",
            code.trim()
        );
    }
    if matches!(innermost(e), candle_core::Error::Zip(_)) {
        return format!(
            "it is not a complete PyTorch zip archive ({first}); the download may be cut short"
        );
    }
    first.to_string()
}

fn innermost(e: &candle_core::Error) -> &candle_core::Error {
    match e {
        candle_core::Error::WithBacktrace { inner, .. }
        | candle_core::Error::WithPath { inner, .. }
        | candle_core::Error::Context { inner, .. } => innermost(inner),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_codes_and_backtraces_become_words() {
        let e = candle_core::Error::Msg("unknown op-code 149".into()).bt();
        let e = candle_core::Error::Context {
            inner: Box::new(e),
            context: Box::new("reading data.pkl"),
        };
        let reason = pickle_reason(&e);
        assert!(
            reason.contains("op-code 149 (FRAME, from pickle protocol 4 or newer)")
                && !reason.contains('\n'),
            "{reason}"
        );
    }
}
