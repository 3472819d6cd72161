//! Which way a LoKr or LoHa layer applies its update for a given number of rows — through its factors, never
//! forming `ΔW`, or on the merged weight `W + ΔW` — by counting the work of one forward and backward each way,
//! and the working memory each way holds (the planner's count).

/// A byte moved, counted as this many FLOPs: a GPU's bf16 tensor-core rate over its memory bandwidth is of this
/// order, so the passes over large tensors are weighed against the products.
const FLOPS_PER_BYTE: u64 = 128;

/// Bytes per weight the merged path moves in a forward and backward besides its products: `ΔW` built in f32,
/// the base added and the sum rounded (twice: forward and backward), `∂L/∂ΔW` cast to f32, and the factors'
/// Hadamard or Kronecker terms, each a pass over an f32 [out, in].
const MERGED_BYTES_PER_WEIGHT: u64 = 150;

/// Bytes per weight of building `W + ΔW` in the compute dtype for LoHa's forward on the merged weight: its two
/// products written and read, their product written and read, the base read and the sum written.
const MERGED_FORWARD_BYTES_PER_WEIGHT: u64 = 16;

/// Bytes per weight of building LoKr's `W + ΔW` in the compute dtype for its forward: the base read and the sum
/// written, in one pass (the product then reads the sum in place of the base).
const LOKR_MERGED_FORWARD_BYTES_PER_WEIGHT: u64 = 4;

/// Bytes per value of the activations the cost counts passes over (bf16).
const ACTIVATION_BYTES: u64 = 2;

/// Tokens per chunk of LoKr's factored `w1` gradient (its per-token products are summed a chunk at a time).
pub const LOKR_CHUNK_ROWS: usize = 4096;

/// How a layer applies a LoKr or LoHa update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdatePath {
    /// Through the factors: LoHa as a LoRA of rank `rank²`, LoKr by the Kronecker reshape identity.
    Factored,
    /// On `W + ΔW` [out, in], with `∂L/∂ΔW = dyᵀ x`.
    Merged,
    /// LoHa's forward (and its recompute) and its input gradient on `W + ΔW` built in the compute dtype, its
    /// factors' gradients through the factors: for many rows at a large rank, where the rank-`rank²` products of
    /// the forward and of the input gradient cost more than building the weight. LoKr's forward alone (its
    /// backward through the factors), for many rows: where the factored forward's `[m, b·c]` half-applied input
    /// and `[m, out]` update, each written and read, move more than the weight.
    MergedForward,
}

/// What the choice depends on, besides the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateShape {
    /// LoHa of `rank` on a layer [in, out].
    Loha {
        in_dim: usize,
        out_dim: usize,
        rank: usize,
    },
    /// LoKr with `w1` [a, b] and `w2` [c, d] (in = b·d, out = a·c).
    Lokr { w1: [usize; 2], w2: [usize; 2] },
}

impl UpdateShape {
    /// The cheapest way for `rows` rows (a tie goes to the factors, then to the merged forward).
    pub fn path(&self, rows: usize) -> UpdatePath {
        let factored = self.factored_cost(rows);
        let merged_forward = self.merged_forward_cost(rows);
        let merged = self.merged_cost(rows);
        if factored <= merged_forward && factored <= merged {
            UpdatePath::Factored
        } else if merged_forward <= merged {
            UpdatePath::MergedForward
        } else {
            UpdatePath::Merged
        }
    }

    /// FLOPs (bytes moved counted at [`FLOPS_PER_BYTE`]) of a forward on `W + ΔW`, LoHa's input gradient on it
    /// built again, and the factors' gradients through the factors: LoHa's backward recomputes `x V` and runs
    /// `dy U`, `dyᵀ (x V)` and `xᵀ (dy U)`; building the weight takes its two rank-`rank` products and a few
    /// passes. LoKr builds the weight once (one pass) and runs its factored backward.
    fn merged_forward_cost(&self, rows: usize) -> u64 {
        let m = rows as u64;
        let (i, o) = self.dims();
        match *self {
            Self::Loha { rank, .. } => {
                let (width, r2) = (i + o, (rank * rank) as u64);
                let build =
                    i * o * (4 * rank as u64 + MERGED_FORWARD_BYTES_PER_WEIGHT * FLOPS_PER_BYTE);
                2 * m * r2 * (2 * i + 2 * o) + width * r2 * 24 * FLOPS_PER_BYTE + 2 * build
            }
            Self::Lokr { .. } => {
                i * o * LOKR_MERGED_FORWARD_BYTES_PER_WEIGHT * FLOPS_PER_BYTE
                    + self.lokr_backward_cost(rows)
            }
        }
    }

    /// LoKr's factored backward (0 for LoHa): `w2` on the last axis three times (`z` again, ∂x, ∂w2), `w1` on the
    /// middle one twice (`R`, the per-token `dy_t z_tᵀ` of ∂w1), whose [m, a, b] products are written and read.
    fn lokr_backward_cost(&self, rows: usize) -> u64 {
        let m = rows as u64;
        match *self {
            Self::Lokr {
                w1: [a, b],
                w2: [c, d],
            } => {
                let [a, b, c, d] = [a, b, c, d].map(|v| v as u64);
                2 * m * c * (3 * b * d + 2 * a * b) + 4 * m * a * b * FLOPS_PER_BYTE
            }
            Self::Loha { .. } => 0,
        }
    }

    /// `(in, out)`.
    fn dims(&self) -> (u64, u64) {
        match *self {
            Self::Loha {
                in_dim, out_dim, ..
            } => (in_dim as u64, out_dim as u64),
            Self::Lokr {
                w1: [a, b],
                w2: [c, d],
            } => ((b * d) as u64, (a * c) as u64),
        }
    }

    /// FLOPs (bytes moved counted at [`FLOPS_PER_BYTE`]) of a forward and backward through the factors.
    fn factored_cost(&self, rows: usize) -> u64 {
        let m = rows as u64;
        match *self {
            Self::Loha {
                in_dim,
                out_dim,
                rank,
            } => {
                // x V and (x V) Uᵀ; dyᵀ (x V), dy U, xᵀ (dy U) and (dy U) Vᵀ, each 2·m·r²·width.
                let (width, r2) = ((in_dim + out_dim) as u64, (rank * rank) as u64);
                6 * m * r2 * width + width * r2 * 24 * FLOPS_PER_BYTE
            }
            Self::Lokr {
                w1: [a, b],
                w2: [c, d],
            } => {
                let [a, b, c, d] = [a, b, c, d].map(|v| v as u64);
                // The forward: w2 on the last axis and w1 on the middle one, the half-applied input [m, b·c] and
                // the update [m, a·c] each written and read (the update by the base product); then the backward.
                let forward = 2 * m * c * (b * d + a * b)
                    + 2 * m * c * (b + a) * ACTIVATION_BYTES * FLOPS_PER_BYTE;
                forward + self.lokr_backward_cost(rows)
            }
        }
    }

    /// FLOPs (bytes moved counted at [`FLOPS_PER_BYTE`]) of a forward and backward on the merged weight, beyond
    /// the base's products: `dyᵀ x` and building `ΔW` and its factors' gradients.
    fn merged_cost(&self, rows: usize) -> u64 {
        let (i, o) = self.dims();
        let build = match *self {
            // Both products, in the forward and twice in the backward, and four rank-r gradient products.
            Self::Loha { rank, .. } => 20 * rank as u64,
            Self::Lokr { .. } => 4,
        };
        i * o * (2 * rows as u64 + build + MERGED_BYTES_PER_WEIGHT * FLOPS_PER_BYTE)
    }

    /// Bytes one layer's update arithmetic holds beyond plain LoRA's for `rows` rows in a compute dtype of
    /// `compute_bytes` bytes, the way [`UpdateShape::path`] picks: the merged path's f32 update, sums and products
    /// and the merged weight; LoHa's factored `U`, `V` (f32 and compute dtype) and gradients, and its rank-`r²`
    /// activations; LoKr's half-applied input and a chunk of `z` and of the per-token products of its `w1`
    /// gradient.
    pub fn work_bytes(&self, rows: usize, compute_bytes: u64) -> u64 {
        let m = rows as u64;
        let (i, o) = self.dims();
        match (self.path(rows), *self) {
            (UpdatePath::Merged, Self::Loha { .. }) => i * o * (5 * 4 + compute_bytes),
            (UpdatePath::MergedForward, Self::Loha { rank, .. }) => {
                // The build's three weight-sized terms, or the backward's factored ones, whichever is more.
                let r2 = (rank * rank) as u64;
                let factored =
                    (i + o) * r2 * (3 * 4 + 2 * compute_bytes) + 2 * m * r2 * compute_bytes;
                (3 * i * o * compute_bytes).max(factored)
            }
            (UpdatePath::MergedForward, Self::Lokr { w1, w2 }) => {
                // The weight built for the forward, or the backward's factored terms, whichever is more.
                let factored = Self::lokr_factored_bytes(w1, w2, rows, compute_bytes);
                (i * o * compute_bytes).max(factored)
            }
            (UpdatePath::Merged, Self::Lokr { .. }) => i * o * (4 * 4 + compute_bytes),
            (UpdatePath::Factored, Self::Loha { rank, .. }) => {
                let r2 = (rank * rank) as u64;
                (i + o) * r2 * (3 * 4 + 2 * compute_bytes) + 2 * m * r2 * compute_bytes
            }
            (UpdatePath::Factored, Self::Lokr { w1, w2 }) => {
                Self::lokr_factored_bytes(w1, w2, rows, compute_bytes)
            }
        }
    }

    /// LoKr's factored terms: `z` (forward) or `R` (backward), [m, b, c]; a chunk's `z` [rows, b, c] and
    /// `dy_t z_tᵀ` [rows, a, b].
    fn lokr_factored_bytes(
        [a, b]: [usize; 2],
        [c, _]: [usize; 2],
        rows: usize,
        compute_bytes: u64,
    ) -> u64 {
        let chunk = rows.min(LOKR_CHUNK_ROWS) as u64;
        (rows as u64 * (b * c) as u64 + chunk * (b * c + a * b) as u64) * compute_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Typical image and video layers take the factors; LoHa's factors give way to the merged weight once `r²`
    /// nears the layer's widths, and LoKr's forward to the merged weight at many rows.
    #[test]
    fn the_cheaper_path_is_picked() {
        let loha = |in_dim, out_dim, rank| UpdateShape::Loha {
            in_dim,
            out_dim,
            rank,
        };
        assert_eq!(loha(3072, 3072, 16).path(4608), UpdatePath::Factored);
        // Wan's 32760 tokens at rank 32: the r² = 1024 products of the forward cost more than the weight.
        assert_eq!(loha(5120, 13824, 32).path(32760), UpdatePath::MergedForward);
        assert_eq!(loha(5120, 5120, 32).path(32760), UpdatePath::MergedForward);
        assert_eq!(loha(5120, 5120, 32).path(512), UpdatePath::Factored);
        assert_eq!(loha(3072, 12288, 16).path(4608), UpdatePath::Factored);
        assert_eq!(loha(3072, 3072, 128).path(4608), UpdatePath::Merged);
        assert_eq!(loha(64, 64, 16).path(4096), UpdatePath::Merged);
        let lokr = |w1, w2| UpdateShape::Lokr { w1, w2 };
        // FLUX.1's image stream builds the weight for the forward; its 512 text tokens run through the factors.
        assert_eq!(
            lokr([48, 48], [64, 64]).path(4608),
            UpdatePath::MergedForward
        );
        assert_eq!(
            lokr([96, 48], [96, 64]).path(4096),
            UpdatePath::MergedForward
        );
        assert_eq!(lokr([96, 48], [96, 64]).path(512), UpdatePath::Factored);
        assert_eq!(lokr([48, 48], [64, 64]).path(512), UpdatePath::Factored);
        assert_eq!(
            lokr([4, 4], [768, 768]).path(4608),
            UpdatePath::MergedForward
        );
        assert_eq!(
            lokr([1, 1], [127, 3072]).path(4608),
            UpdatePath::MergedForward
        );
        assert_eq!(lokr([48, 48], [64, 64]).path(1), UpdatePath::Factored);
        // A rank whose r² products lose at many rows still wins at few.
        assert_eq!(loha(3072, 3072, 64).path(4608), UpdatePath::Merged);
        assert_eq!(loha(3072, 3072, 64).path(1), UpdatePath::Factored);
    }

    /// The factored paths hold far less than the merged weight on a large layer.
    #[test]
    fn the_factored_paths_hold_less_than_the_merged_weight() {
        let merged = 5120 * 13824 * (5 * 4 + 2);
        let loha = UpdateShape::Loha {
            in_dim: 5120,
            out_dim: 13824,
            rank: 16,
        };
        assert_eq!(loha.path(4608), UpdatePath::Factored);
        assert!(loha.work_bytes(4608, 2) < merged / 4);
        // The forward on the merged weight builds it in the compute dtype only.
        assert_eq!(loha.path(32760), UpdatePath::MergedForward);
        assert!(loha.work_bytes(32760, 2) < merged / 3);
        let lokr = UpdateShape::Lokr {
            w1: [64, 64],
            w2: [216, 80],
        };
        assert_eq!(
            lokr.work_bytes(100, 2),
            100 * (64 * 216 + 64 * 216 + 64 * 64) * 2
        );
        // Past a chunk, the per-chunk terms stop growing.
        let chunk = LOKR_CHUNK_ROWS as u64;
        assert_eq!(
            lokr.work_bytes(32760, 2),
            (32760 * 64 * 216 + chunk * (64 * 216 + 64 * 64)) * 2
        );
        assert!(lokr.work_bytes(32760, 2) < 5120 * 13824 * (4 * 4 + 2));
    }
}
