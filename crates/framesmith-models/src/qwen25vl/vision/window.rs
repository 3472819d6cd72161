//! The index arithmetic of the Qwen2.5-VL vision tower (transformers' `vision_utils.py`): each patch's (row,
//! column) for the 2-D rotary embedding, the reordering of merged patches into attention windows and back, and the
//! segment boundaries of windowed and full attention. Plain integers, no tensors.

/// One image's grid in patches: (frames, rows, columns), as the processor's `image_grid_thw` gives it.
pub type Grid = [usize; 3];

/// Each patch's (row, column), in the processor's patch order (merge squares one after the other, row-major
/// inside each), repeated for every frame: `get_vision_position_ids`.
pub fn patch_positions(grids: &[Grid], merge: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for &[t, h, w] in grids {
        let mut frame = Vec::with_capacity(h * w);
        for by in 0..h / merge {
            for bx in 0..w / merge {
                for my in 0..merge {
                    for mx in 0..merge {
                        frame.push((by * merge + my, bx * merge + mx));
                    }
                }
            }
        }
        for _ in 0..t {
            out.extend_from_slice(&frame);
        }
    }
    out
}

/// `get_vision_window_index`: the order in which merged patches (groups of `merge²` patches) are visited window
/// by window (windows of `window`×`window` merged patches, row-major over the image; the last row and column of
/// windows may be partial), and the cumulative window lengths in patches (starting at 0, empty windows dropped).
pub fn window_index(grids: &[Grid], merge: usize, window: usize) -> (Vec<usize>, Vec<usize>) {
    let mut index = Vec::new();
    let mut cu = vec![0usize];
    let mut offset = 0;
    for &[t, h, w] in grids {
        let (lh, lw) = (h / merge, w / merge);
        for frame in 0..t {
            for wy in 0..lh.div_ceil(window) {
                for wx in 0..lw.div_ceil(window) {
                    let before = index.len();
                    for y in wy * window..((wy + 1) * window).min(lh) {
                        for x in wx * window..((wx + 1) * window).min(lw) {
                            index.push(offset + (frame * lh + y) * lw + x);
                        }
                    }
                    let n = index.len() - before;
                    if n > 0 {
                        let last = cu.last().copied().unwrap_or(0);
                        cu.push(last + n * merge * merge);
                    }
                }
            }
        }
        offset += t * lh * lw;
    }
    (index, cu)
}

/// Cumulative lengths of full attention's segments in patches: every frame of every image on its own.
pub fn full_seqlens(grids: &[Grid]) -> Vec<usize> {
    let mut cu = vec![0usize];
    for &[t, h, w] in grids {
        for _ in 0..t {
            let last = cu.last().copied().unwrap_or(0);
            cu.push(last + h * w);
        }
    }
    cu
}

/// The permutation that undoes `index`: `inverse[index[i]] = i` (`argsort` of a permutation).
pub fn inverse(index: &[usize]) -> Vec<usize> {
    let mut out = vec![0; index.len()];
    for (i, &j) in index.iter().enumerate() {
        if let Some(slot) = out.get_mut(j) {
            *slot = i;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers' `get_vision_window_index` for one image of 4×6 merged patches (grid 8×12) in windows of 4
    /// merged patches: windows of 4×4 and 4×2.
    #[test]
    fn windows_are_visited_as_transformers_does() {
        let (index, cu) = window_index(&[[1, 8, 12]], 2, 4);
        let first: Vec<usize> = (0..4)
            .flat_map(|y| (0..4).map(move |x| y * 6 + x))
            .collect();
        let second: Vec<usize> = (0..4).flat_map(|y| [y * 6 + 4, y * 6 + 5]).collect();
        assert_eq!(index, [first, second].concat());
        assert_eq!(cu, vec![0, 64, 96]);
    }

    #[test]
    fn a_grid_that_windows_divide_has_no_empty_window() {
        let (index, cu) = window_index(&[[1, 4, 4], [2, 2, 2]], 2, 2);
        // The second image: two frames of one merged patch each, after the first image's 4.
        assert_eq!(index, vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(cu, vec![0, 16, 20, 24]);
        assert_eq!(full_seqlens(&[[1, 4, 4], [2, 2, 2]]), vec![0, 16, 20, 24]);
    }

    #[test]
    fn positions_go_merge_square_by_merge_square() {
        let pos = patch_positions(&[[1, 2, 4]], 2);
        assert_eq!(
            pos,
            vec![
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
                (0, 2),
                (0, 3),
                (1, 2),
                (1, 3)
            ]
        );
        let order = vec![2, 0, 1];
        assert_eq!(inverse(&order), vec![1, 2, 0]);
    }
}
