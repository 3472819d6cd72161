//! Qwen2.5-VL's multimodal positions (`Qwen2_5_VLModel.get_rope_index` for images): text tokens count up on all
//! three axes; an image's tokens get (start + frame, start + row, start + column) over its merged grid, where
//! `start` is the next text position; the text after an image continues from `start + max(rows, columns)`.

/// The (time, height, width) positions of `ids` (one row's tokens, no padding): `image_token_id` runs hold the
/// images of `grids` in order, `grids[k]` (frames, rows, columns) in patches and `merge`² patches per token. An error says when the image
/// tokens and the grids disagree.
pub fn rope_index(
    ids: &[u32],
    image_token_id: u32,
    grids: &[[usize; 3]],
    merge: usize,
) -> Result<[Vec<u32>; 3], String> {
    let mut out: [Vec<u32>; 3] = std::array::from_fn(|_| Vec::with_capacity(ids.len()));
    let mut grids = grids.iter();
    let mut next = 0u32;
    let mut i = 0;
    while i < ids.len() {
        if ids[i] != image_token_id {
            for axis in &mut out {
                axis.push(next);
            }
            next += 1;
            i += 1;
            continue;
        }
        let Some(&[t, h, w]) = grids.next() else {
            return Err(format!(
                "image tokens at {i} have no image left to take them"
            ));
        };
        let (gh, gw) = (h / merge.max(1), w / merge.max(1));
        let count = t * gh * gw;
        if ids.len() < i + count || ids[i..i + count].iter().any(|&id| id != image_token_id) {
            return Err(format!(
                "an image of {t}×{gh}×{gw} tokens does not fit the image tokens at {i}"
            ));
        }
        for f in 0..t {
            for y in 0..gh {
                for x in 0..gw {
                    out[0].push(next + f as u32);
                    out[1].push(next + y as u32);
                    out[2].push(next + x as u32);
                }
            }
        }
        next += gh.max(gw) as u32;
        i += count;
    }
    if grids.next().is_some() {
        return Err("more images than image tokens".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers' `get_rope_index` for `a <img 2×3> b c`: the image starts at 1, the text after it at 1 + 3.
    #[test]
    fn text_continues_after_the_largest_side() -> Result<(), String> {
        let ids = [5, 9, 9, 9, 9, 9, 9, 6, 7];
        let [t, h, w] = rope_index(&ids, 9, &[[1, 4, 6]], 2)?;
        assert_eq!(t, vec![0, 1, 1, 1, 1, 1, 1, 4, 5]);
        assert_eq!(h, vec![0, 1, 1, 1, 2, 2, 2, 4, 5]);
        assert_eq!(w, vec![0, 1, 2, 3, 1, 2, 3, 4, 5]);
        assert!(rope_index(&ids, 9, &[[1, 4, 4]], 2).is_err());
        assert!(rope_index(&ids, 9, &[], 2).is_err());
        Ok(())
    }
}
