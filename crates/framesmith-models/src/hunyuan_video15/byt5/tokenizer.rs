//! The byT5 tokenizer as HunyuanVideo 1.5 uses it (transformers' `ByT5Tokenizer` with Glyph-SDXL-v2's colour and
//! font tokens added by the official `add_special_token`): UTF-8 bytes as ids 3..258, the tokenizer's own
//! `<pad>` / `</s>` / `<unk>` (0, 1, 2, which eat the whitespace on both sides) and `<extra_id_N>` (259 + N),
//! then `<color-N>` (384 + N, 138 colours) and `<xx-font-N>` (522 + the language's offset + N, 988 fonts in the
//! order en, cn, jp, kr) matched as whole tokens; the end token `</s>` closes the text, truncated to fit.

/// The byte ids start after `<pad>`, `</s>` and `<unk>`.
const BYTE_OFFSET: u32 = 3;
/// `</s>`.
pub const EOS_ID: u32 = 1;
/// The byT5 vocabulary before the added tokens (3 specials, 256 bytes, 125 `<extra_id_N>`).
pub const BASE_VOCAB: usize = 384;
/// `<extra_id_N>` tokens and where they start.
const EXTRA_IDS: u32 = 125;
const EXTRA_ID_START: u32 = 259;
/// Glyph-SDXL-v2's colour tokens (`color_idx.json`).
pub const COLORS: u32 = 138;
/// Glyph-SDXL-v2's font tokens per language (`multilingual_10-lang_idx.json`), in the file's order.
pub const FONTS: [(&str, u32); 4] = [("en", 512), ("cn", 143), ("jp", 211), ("kr", 122)];
/// The vocabulary of the released glyph encoder: 384 + 138 + 988.
pub const GLYPH_VOCAB: usize = 1510;

/// An added token: its id, and whether it strips the whitespace to its left and right.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Added {
    id: u32,
    strips: bool,
}

/// The added token spelled exactly `token` (`<…>`), if there is one.
fn added_token(token: &str) -> Option<Added> {
    let plain = |id| Some(Added { id, strips: false });
    match token {
        "<pad>" => {
            return Some(Added {
                id: 0,
                strips: true,
            })
        }
        "</s>" => {
            return Some(Added {
                id: 1,
                strips: true,
            })
        }
        "<unk>" => {
            return Some(Added {
                id: 2,
                strips: true,
            })
        }
        _ => {}
    }
    let inner = token.strip_prefix('<')?.strip_suffix('>')?;
    let number = |digits: &str, below: u32| -> Option<u32> {
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        let n: u32 = digits.parse().ok().filter(|_| canonical)?;
        (n < below).then_some(n)
    };
    if let Some(n) = inner
        .strip_prefix("extra_id_")
        .and_then(|d| number(d, EXTRA_IDS))
    {
        return plain(EXTRA_ID_START + n);
    }
    if let Some(n) = inner.strip_prefix("color-").and_then(|d| number(d, COLORS)) {
        return plain(BASE_VOCAB as u32 + n);
    }
    let (lang, digits) = inner.split_once("-font-")?;
    let mut offset = BASE_VOCAB as u32 + COLORS;
    for (name, count) in FONTS {
        if name == lang {
            return plain(offset + number(digits, count)?);
        }
        offset += count;
    }
    None
}

/// Python's `str.isspace` (what `lstrip`/`rstrip` strip): Unicode whitespace and the separators \x1c–\x1f.
fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The text cut into plain pieces and added tokens, as the tokenizer's trie splits it: a token starting with
/// `<` runs to the first `>` after it and counts when it is an added token; the earliest such token wins.
fn split(text: &str) -> Vec<Result<&str, Added>> {
    let mut pieces = Vec::new();
    let mut plain_start = 0;
    let mut i = 0;
    while let Some(open) = text[i..].find('<').map(|k| i + k) {
        let found = text[open..]
            .find('>')
            .and_then(|k| added_token(&text[open..=open + k]).map(|t| (t, open + k + 1)));
        match found {
            Some((token, end)) => {
                pieces.push(Ok(&text[plain_start..open]));
                pieces.push(Err(token));
                plain_start = end;
                i = end;
            }
            None => i = open + 1,
        }
    }
    pieces.push(Ok(&text[plain_start..]));
    pieces
}

/// The ids of `text` with the end token, at most `max_length` of them (the text's ids truncated to
/// `max_length - 1`, then `</s>`), as the pipeline's tokenizer call gives its unpadded part.
pub fn token_ids(text: &str, max_length: usize) -> Vec<u32> {
    let mut pieces = split(text);
    for i in 0..pieces.len() {
        if !matches!(pieces[i], Err(Added { strips: true, .. })) {
            continue;
        }
        if let Some(Ok(left)) = i.checked_sub(1).and_then(|l| pieces.get_mut(l)) {
            *left = left.trim_end_matches(is_space);
        }
        if let Some(Ok(right)) = pieces.get_mut(i + 1) {
            *right = right.trim_start_matches(is_space);
        }
    }
    let mut ids: Vec<u32> = pieces
        .iter()
        .flat_map(|piece| match piece {
            Ok(text) => text.bytes().map(|b| u32::from(b) + BYTE_OFFSET).collect(),
            Err(token) => vec![token.id],
        })
        .collect();
    ids.truncate(max_length.saturating_sub(1));
    if max_length > 0 {
        ids.push(EOS_ID);
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_added_tokens_get_the_tokenizers_ids() {
        // transformers 5.24.0's ByT5Tokenizer with `<color-0>` and `<en-font-0>` added.
        assert_eq!(
            token_ids("a<color-1>b<en-font-0>", 256),
            [100, 385, 101, 522, 1]
        );
        assert_eq!(
            token_ids("x <color-0> y <pad> z", 256),
            [123, 35, 384, 35, 124, 0, 125, 1]
        );
        assert_eq!(
            token_ids("a<extra_id_0>b</s>c<pad>d<unk> <extra_id_1> e", 256),
            [100, 259, 101, 1, 102, 0, 103, 2, 260, 35, 104, 1]
        );
        assert_eq!(token_ids("<kr-font-121><cn-font-0>", 8), [1509, 1034, 1]);
        // Out of range or not canonical: plain bytes.
        assert_eq!(token_ids("<color-138>", 256).len(), 12);
        assert_eq!(token_ids("<color-01>", 256).len(), 11);
        assert_eq!(token_ids("hé", 3), [107, 198, 1]);
        assert_eq!(token_ids("", 256), [1]);
        assert_eq!(token_ids("a\u{1c}<pad>\u{1d}b", 256), [100, 0, 101, 1]);
        assert_eq!(token_ids("<<color-1>>", 256), [63, 385, 65, 1]);
    }
}
