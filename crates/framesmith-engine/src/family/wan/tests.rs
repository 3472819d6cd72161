//! Wan through the generic step and trainer on tiny models: the checkpointed step against the whole-graph
//! backward (`step`), block streaming (`streaming`), image-to-video training and its samples (`i2v`, `i2v_grad`,
//! `i2v_sample`) and Wan2.2 TI2V-5B (`ti2v`).

pub(crate) mod i2v;
mod i2v_grad;
mod i2v_sample;
mod step;
mod streaming;
mod ti2v;
