//! The DiT a run trains: a Wan model (the only one, or Wan2.2 A14B's high-noise expert) or FLUX.1 [dev]. The
//! step, the optimizer, the outputs and resume are the same for both; the batch each model takes is its own.

use candle_core::{DType, Device};

use framesmith_models::flux::Flux;
use framesmith_models::trainable::TrainableModel;
use framesmith_models::wan::WanModel;

/// The model of a run.
// One per run, long-lived: the size difference costs nothing worth an indirection.
#[allow(clippy::large_enum_variant)]
pub enum RunModel {
    Wan(WanModel),
    Flux {
        model: Box<Flux>,
        /// The dtype its linears compute in (the batch's conditioning comes in it).
        dtype: DType,
    },
}

impl RunModel {
    /// The device the model computes on.
    pub fn device(&self) -> &Device {
        match self {
            Self::Wan(model) => model.device(),
            Self::Flux { model, .. } => TrainableModel::device(model.as_ref()),
        }
    }

    /// The Wan model, for what only Wan runs do (experts, samples, validation, image-to-video conditioning).
    pub fn wan(&self) -> anyhow::Result<&WanModel> {
        match self {
            Self::Wan(model) => Ok(model),
            Self::Flux { .. } => anyhow::bail!("this is a FLUX.1 run; only Wan runs do this"),
        }
    }

    /// [`RunModel::wan`], mutable.
    pub fn wan_mut(&mut self) -> anyhow::Result<&mut WanModel> {
        match self {
            Self::Wan(model) => Ok(model),
            Self::Flux { .. } => anyhow::bail!("this is a FLUX.1 run; only Wan runs do this"),
        }
    }
}
