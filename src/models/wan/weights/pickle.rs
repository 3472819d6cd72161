//! PyTorch `.pth` files through candle's pickle reader (which never executes code): when the reader fails, a
//! reason in words instead of its op-codes and backtraces.

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
