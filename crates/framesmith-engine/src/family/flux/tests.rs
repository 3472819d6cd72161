//! FLUX.1 through the generic checkpointed step: its gradients against autograd (`step`) and block streaming
//! against the resident model (`streaming`).

mod kontext;
mod step;
pub(crate) mod streaming;
