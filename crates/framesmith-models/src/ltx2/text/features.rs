//! LTX-2's feature extractor (ltx-core's `FeatureExtractorV1` / `V2`): Gemma's hidden states of a prompt, every
//! layer's (the embedding included), normalised and projected to the connector's width, with the checkpoint's
//! names (`text_embedding_projection.aggregate_embed`, `.video_aggregate_embed`). The layers are stacked as
//! ltx-core stacks them ([b, l, d, layers] flattened, so the layer index runs fastest in the projection's input).
//! The statistics are computed in f32 (ltx-core computes them in the states' dtype); the normalised features
//! go into the projection in the compute dtype, as ltx-core's do. Padding is zeroed. The audio stream's features
//! ([`FeatureExtractor::forward_av`]) are V1's same features, or V2's `audio_aggregate_embed` of the normalised
//! states rescaled by `√(audio_dim / gemma_width)`.

use candle_core::{DType, Result, Tensor, D};

use super::config::FeatureVersion;
use framesmith_nn::linear::Linear;
use framesmith_nn::vb::Vb;

/// The epsilon of both normalisations.
const EPS: f64 = 1e-6;

/// The feature extractor.
pub struct FeatureExtractor {
    version: FeatureVersion,
    /// `aggregate_embed` (V1) or `video_aggregate_embed` (V2).
    projection: Linear,
    /// V2's `audio_aggregate_embed`, when loaded with the audio side.
    audio_projection: Option<Linear>,
    /// Gemma's width.
    gemma_width: usize,
    /// Gemma's hidden states per prompt (layers + 1).
    states: usize,
}

impl FeatureExtractor {
    /// Reads the projection of `version` under `vb` (`text_embedding_projection`) for Gemma states of
    /// `gemma_width` × `states`.
    pub fn load(
        vb: &Vb,
        version: FeatureVersion,
        gemma_width: usize,
        states: usize,
    ) -> Result<Self> {
        let flat = gemma_width * states;
        let projection = match version {
            FeatureVersion::V1 => Linear::load(&vb.pp("aggregate_embed"), flat, gemma_width)?,
            FeatureVersion::V2 { video_dim, .. } => {
                Linear::load(&vb.pp("video_aggregate_embed"), flat, video_dim)?
            }
        };
        Ok(Self {
            version,
            projection,
            audio_projection: None,
            gemma_width,
            states,
        })
    }

    /// [`Self::load`] with the audio side: V2's `audio_aggregate_embed` too (V1 shares its features).
    pub fn load_av(
        vb: &Vb,
        version: FeatureVersion,
        gemma_width: usize,
        states: usize,
    ) -> Result<Self> {
        let mut extractor = Self::load(vb, version, gemma_width, states)?;
        if let FeatureVersion::V2 { audio_dim, .. } = version {
            extractor.audio_projection = Some(Linear::load(
                &vb.pp("audio_aggregate_embed"),
                gemma_width * states,
                audio_dim,
            )?);
        }
        Ok(extractor)
    }

    /// The width of the features.
    pub fn out_dim(&self) -> usize {
        self.projection.out_dim()
    }

    /// The features [b, l, out] of Gemma's `states` (each [b, l, gemma_width]) for `mask` [b, l] (non-zero: a
    /// token), in the states' dtype.
    pub fn forward(&self, states: &[Tensor], mask: &Tensor) -> Result<Tensor> {
        Ok(self.features(states, mask, false)?.0)
    }

    /// The video features and, when loaded with the audio side ([`Self::load_av`]), the audio stream's.
    pub fn forward_av(&self, states: &[Tensor], mask: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        self.features(states, mask, true)
    }

    fn features(
        &self,
        states: &[Tensor],
        mask: &Tensor,
        audio: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        if states.len() != self.states {
            candle_core::bail!(
                "LTX-2 feature extractor: {} hidden states, the checkpoint's projection takes {}",
                states.len(),
                self.states
            );
        }
        let dtype = states[0].dtype();
        let (b, l, d) = states[0].dims3()?;
        if d != self.gemma_width {
            candle_core::bail!(
                "LTX-2 feature extractor: hidden states of width {d}, expected {}",
                self.gemma_width
            );
        }
        let refs: Vec<&Tensor> = states.iter().collect();
        // [b, l, d, layers] in f32.
        let x = Tensor::stack(&refs, D::Minus1)?.to_dtype(DType::F32)?;
        let keep = mask
            .to_device(x.device())?
            .to_dtype(DType::F32)?
            .reshape((b, l, 1, 1))?;
        let flat = |normed: Tensor| -> Result<Tensor> {
            normed
                .broadcast_mul(&keep)?
                .reshape((b, l, d * self.states))?
                .to_dtype(dtype)
        };
        match self.version {
            FeatureVersion::V1 => {
                let video = self
                    .projection
                    .forward(&flat(masked_range_norm(&x, &keep)?)?)?;
                let audio = audio.then(|| video.clone());
                Ok((video, audio))
            }
            FeatureVersion::V2 { video_dim, .. } => {
                let ms = x.sqr()?.mean_keepdim(2)?;
                let normed = x.broadcast_div(&(ms + EPS)?.sqrt()?)?;
                let rescaled = |dim: usize| normed.affine((dim as f64 / d as f64).sqrt(), 0.0);
                let video = self.projection.forward(&flat(rescaled(video_dim)?)?)?;
                let audio = match (&self.audio_projection, audio) {
                    (Some(p), true) => Some(p.forward(&flat(rescaled(p.out_dim())?)?)?),
                    _ => None,
                };
                Ok((video, audio))
            }
        }
    }
}

/// V1's `8 · (x − mean) / (max − min + eps)` per sample and layer, the statistics over the valid tokens' values
/// (`keep` [b, l, 1, 1], 1 at tokens) of `x` [b, l, d, layers].
fn masked_range_norm(x: &Tensor, keep: &Tensor) -> Result<Tensor> {
    let (_, _, d, _) = x.dims4()?;
    let tokens = keep.sum_keepdim(1)?; // [b, 1, 1, 1]
    let mean = x
        .broadcast_mul(keep)?
        .sum_keepdim(1)?
        .sum_keepdim(2)?
        .broadcast_div(&((tokens * d as f64)? + EPS)?)?;
    let valid = keep.broadcast_as(x.shape())?.ne(0f32)?;
    let inf = Tensor::full(f32::INFINITY, x.shape(), x.device())?;
    let min = valid.where_cond(x, &inf)?.min_keepdim(1)?.min_keepdim(2)?;
    let max = valid
        .where_cond(x, &inf.neg()?)?
        .max_keepdim(1)?
        .max_keepdim(2)?;
    let range = ((max - min)? + EPS)?;
    (x.broadcast_sub(&mean)? * 8.0)?.broadcast_div(&range)
}
