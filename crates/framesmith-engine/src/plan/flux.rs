//! FLUX.1's side of block streaming: which blocks stream for a count, by `memory.flux_stream_order`.

use framesmith_config::run::FluxStreamOrder;
use framesmith_models::flux::FluxConfig;
use framesmith_nn::offload::{streamed_blocks, Placement};

/// The indices (into `Flux::blocks`: the `depth` double-stream blocks, then the single-stream ones) of `count`
/// streamed blocks. `single_first` / `double_first` take blocks of that kind until it runs out, then of the other;
/// within a kind, and over all blocks with `spread`, the streamed blocks are spread evenly so resident blocks sit
/// between them and hide their copies. At most every block but one streams.
pub fn flux_streamed_blocks(cfg: &FluxConfig, count: usize, order: FluxStreamOrder) -> Vec<usize> {
    let (double, single) = (cfg.depth, cfg.depth_single_blocks);
    let total = double + single;
    let count = count.min(total.saturating_sub(1));
    let of_kind = |n: usize, first: usize, len: usize| -> Vec<usize> {
        streamed_blocks(len, n.min(len), Placement::Spread)
            .into_iter()
            .map(|i| first + i)
            .collect()
    };
    let mut out = match order {
        FluxStreamOrder::Spread => streamed_blocks(total, count, Placement::Spread),
        FluxStreamOrder::SingleFirst => {
            let s = count.min(single);
            let mut v = of_kind(count - s, 0, double);
            v.extend(of_kind(s, double, single));
            v
        }
        FluxStreamOrder::DoubleFirst => {
            let d = count.min(double);
            let mut v = of_kind(d, 0, double);
            v.extend(of_kind(count - d, double, single));
            v
        }
    };
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(depth: usize, single: usize) -> FluxConfig {
        FluxConfig {
            depth,
            depth_single_blocks: single,
            ..FluxConfig::dev()
        }
    }

    #[test]
    fn each_order_takes_its_kind_first_and_spreads_within_it() {
        let c = cfg(19, 38);
        let s = flux_streamed_blocks(&c, 10, FluxStreamOrder::SingleFirst);
        assert_eq!(s.len(), 10);
        assert!(s.iter().all(|&i| i >= 19), "{s:?}");
        // Spread through the single-stream blocks, not bunched at their end.
        assert!(s[0] < 19 + 10, "{s:?}");
        let s = flux_streamed_blocks(&c, 40, FluxStreamOrder::SingleFirst);
        assert_eq!(s.iter().filter(|&&i| i >= 19).count(), 38);
        assert_eq!(s.iter().filter(|&&i| i < 19).count(), 2);

        let d = flux_streamed_blocks(&c, 10, FluxStreamOrder::DoubleFirst);
        assert!(d.iter().all(|&i| i < 19), "{d:?}");
        let d = flux_streamed_blocks(&c, 25, FluxStreamOrder::DoubleFirst);
        assert_eq!(d.iter().filter(|&&i| i < 19).count(), 19);
        assert_eq!(d.len(), 25);

        let sp = flux_streamed_blocks(&c, 19, FluxStreamOrder::Spread);
        assert_eq!(sp.len(), 19);
        assert!(sp.iter().any(|&i| i < 19) && sp.iter().any(|&i| i >= 19));

        for order in [
            FluxStreamOrder::SingleFirst,
            FluxStreamOrder::DoubleFirst,
            FluxStreamOrder::Spread,
        ] {
            assert!(flux_streamed_blocks(&c, 0, order).is_empty());
            let all = flux_streamed_blocks(&c, 100, order);
            assert_eq!(all.len(), 56, "{order:?}: at most every block but one");
            assert!(all.windows(2).all(|w| w[0] < w[1]));
        }
    }
}
