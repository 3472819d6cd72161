//! Aspect-ratio buckets exactly as musubi-tuner builds them for Wan: 16-pixel steps around the area of the
//! configured resolution, nearest aspect ratio wins, and `bucket_no_upscale` keeps small items at their size. The
//! Wan2.2 VAE of TI2V-5B (16× in space, then 2×2 patches) needs 32-pixel steps ([`BucketSelector::with_step`]).

use super::config::{DatasetKind, ResolvedDataset};

/// Bucket sides are multiples of this (musubi-tuner's `RESOLUTION_STEPS_WAN`).
pub const WAN_BUCKET_STEP: u32 = 16;

/// `(width, height)` in pixels.
pub type Size = (u32, u32);

/// Picks the training resolution for an item from its size (musubi-tuner's `BucketSelector`).
#[derive(Clone, Debug, PartialEq)]
pub struct BucketSelector {
    resolution: Size,
    area: u64,
    step: u32,
    enable_bucket: bool,
    no_upscale: bool,
    buckets: Vec<Size>,
    aspect_ratios: Vec<f64>,
}

/// `num` rounded down to a multiple of `divisor` (musubi-tuner's `divisible_by`).
pub fn round_down_to(num: u32, divisor: u32) -> u32 {
    num - num % divisor
}

impl BucketSelector {
    /// Buckets for `resolution`. Without `enable_bucket` there is one bucket, the resolution itself, and
    /// `no_upscale` is ignored, as in musubi-tuner.
    pub fn new(resolution: Size, enable_bucket: bool, no_upscale: bool) -> Self {
        let step = WAN_BUCKET_STEP;
        let area = u64::from(resolution.0) * u64::from(resolution.1);
        let buckets = if enable_bucket {
            bucket_list(area, step)
        } else {
            vec![resolution]
        };
        let aspect_ratios = buckets
            .iter()
            .map(|&(w, h)| f64::from(w) / f64::from(h))
            .collect();
        Self {
            resolution,
            area,
            step,
            enable_bucket,
            no_upscale: enable_bucket && no_upscale,
            buckets,
            aspect_ratios,
        }
    }

    /// The selector musubi-tuner uses when it writes latent caches for `ds`. For video datasets it builds the
    /// selector from the resolution alone, so videos are always bucketed and never kept from upscaling,
    /// whatever `enable_bucket` and `bucket_no_upscale` say; image datasets use both settings.
    pub fn for_latent_caching(ds: &ResolvedDataset) -> Self {
        match ds.kind() {
            DatasetKind::Video => Self::new(ds.resolution, true, false),
            DatasetKind::Image => Self::new(ds.resolution, ds.enable_bucket, ds.bucket_no_upscale),
        }
    }

    /// The same buckets at `step`-pixel steps (a multiple of 16: the VAE's stride times the DiT's patch). A
    /// selector without bucketing keeps its one bucket, the resolution: check it is a multiple of `step` first.
    pub fn with_step(self, step: u32) -> Self {
        if step == self.step || step == 0 || !self.enable_bucket {
            return Self { step, ..self };
        }
        let buckets = bucket_list(self.area, step);
        let aspect_ratios = buckets
            .iter()
            .map(|&(w, h)| f64::from(w) / f64::from(h))
            .collect();
        Self {
            step,
            buckets,
            aspect_ratios,
            ..self
        }
    }

    /// Whether items go to aspect-ratio buckets (else every item is resized to the resolution).
    pub fn bucketed(&self) -> bool {
        self.enable_bucket
    }

    /// Every bucket, sorted by width then height.
    pub fn buckets(&self) -> &[Size] {
        &self.buckets
    }

    /// The configured resolution.
    pub fn resolution(&self) -> Size {
        self.resolution
    }

    /// The bucket for an item of `size`: with `no_upscale`, an item no larger than the bucket area keeps its size
    /// rounded down to the step (16 pixels); otherwise the bucket with the nearest aspect ratio (the first on a tie).
    pub fn bucket_for(&self, size: Size) -> Size {
        let (w, h) = size;
        if self.no_upscale && u64::from(w) * u64::from(h) <= self.area {
            return (round_down_to(w, self.step), round_down_to(h, self.step));
        }
        let aspect = f64::from(w) / f64::from(h);
        let mut best = 0;
        let mut best_err = f64::INFINITY;
        for (i, ar) in self.aspect_ratios.iter().enumerate() {
            let err = (ar - aspect).abs();
            if err < best_err {
                best = i;
                best_err = err;
            }
        }
        self.buckets.get(best).copied().unwrap_or(self.resolution)
    }
}

fn bucket_list(area: u64, step: u32) -> Vec<Size> {
    // Truncating sqrt as Python's int(math.sqrt(area)).
    let sqrt_size = (area as f64).sqrt() as u32;
    let min_size = round_down_to(sqrt_size / 2, step);
    let mut buckets = Vec::new();
    let mut w = min_size;
    while w < sqrt_size + step {
        // musubi-tuner would divide by zero here for resolutions under 32 pixels; such sizes get no bucket.
        if w > 0 {
            let h = round_down_to(u32::try_from(area / u64::from(w)).unwrap_or(u32::MAX), step);
            if h > 0 {
                buckets.push((w, h));
                buckets.push((h, w));
            }
        }
        w += step;
    }
    buckets.sort_unstable();
    buckets.dedup();
    buckets
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    // Expected lists computed by hand from musubi-tuner's BucketSelector (area = 960*544 = 522240,
    // sqrt = 722, min_size = 352, w = 352..=736 step 16, h = (522240 // w) rounded down to 16).
    #[test]
    fn buckets_for_960x544_match_musubi() {
        let sel = BucketSelector::new((960, 544), true, false);
        let b = sel.buckets();
        assert_eq!(b.len(), 47);
        assert_eq!(b.first(), Some(&(352, 1472)));
        assert_eq!(b.last(), Some(&(1472, 352)));
        assert!(b.contains(&(720, 720)));
        assert!(b.contains(&(960, 544)));
        assert!(b.contains(&(544, 960)));
        assert!(b.windows(2).all(|p| p[0] < p[1]));
    }

    #[test]
    fn picks_nearest_aspect_ratio() {
        let sel = BucketSelector::new((960, 544), true, false);
        assert_eq!(sel.bucket_for((1920, 1080)), (960, 544));
        assert_eq!(sel.bucket_for((1080, 1920)), (544, 960));
        assert_eq!(sel.bucket_for((1000, 1000)), (720, 720));
        assert_eq!(sel.bucket_for((100, 100)), (720, 720));
        // 4:3 → 832/624 = 1.3333 exactly.
        assert_eq!(sel.bucket_for((640, 480)), (832, 624));
    }

    #[test]
    fn no_upscale_keeps_small_items() {
        let sel = BucketSelector::new((960, 544), true, true);
        assert_eq!(sel.bucket_for((500, 300)), (496, 288));
        // Larger than the bucket area: bucketed as usual.
        assert_eq!(sel.bucket_for((1920, 1080)), (960, 544));
    }

    #[test]
    fn without_buckets_everything_goes_to_the_resolution() {
        let sel = BucketSelector::new((960, 544), false, true);
        assert_eq!(sel.buckets(), &[(960, 544)]);
        assert_eq!(sel.bucket_for((500, 300)), (960, 544));
        assert_eq!(sel.bucket_for((300, 900)), (960, 544));
    }

    #[test]
    fn steps_of_32_give_buckets_the_wan22_vae_and_patches_divide() {
        let sel = BucketSelector::new((1280, 704), true, false).with_step(32);
        assert!(sel.bucketed());
        assert!(sel
            .buckets()
            .iter()
            .all(|&(w, h)| w % 32 == 0 && h % 32 == 0));
        assert_eq!(sel.bucket_for((1280, 720)), (1280, 704));
        assert_eq!(sel.bucket_for((720, 1280)), (704, 1280));
        let small = BucketSelector::new((1280, 704), true, true).with_step(32);
        assert_eq!(small.bucket_for((500, 300)), (480, 288));
        let fixed = BucketSelector::new((848, 480), false, false).with_step(32);
        assert!(!fixed.bucketed());
        assert_eq!(fixed.bucket_for((1920, 1080)), (848, 480));
        let tiny = BucketSelector::new((16, 16), true, false).with_step(32);
        assert!(tiny
            .buckets()
            .iter()
            .all(|&(w, h)| w % 32 == 0 && h % 32 == 0));
    }

    #[test]
    fn tiny_resolution_does_not_panic() {
        let sel = BucketSelector::new((16, 16), true, false);
        assert_eq!(sel.bucket_for((10, 20)), (16, 16));
    }
}
