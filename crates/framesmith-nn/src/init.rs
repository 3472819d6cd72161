//! Seeded random tensors drawn on the host. candle's CPU device cannot be seeded, and reproducible draws are
//! what make LoRA initialisation, noise and resume deterministic across runs and machines.

use candle_core::{Device, Result, Shape, Tensor};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};

/// A tensor of N(mean, std²) samples.
pub fn randn<S: Into<Shape>, R: Rng>(
    rng: &mut R,
    shape: S,
    mean: f32,
    std: f32,
    device: &Device,
) -> Result<Tensor> {
    let shape = shape.into();
    let data: Vec<f32> = (0..shape.elem_count())
        .map(|_| {
            let z: f32 = StandardNormal.sample(rng);
            mean + std * z
        })
        .collect();
    Tensor::from_vec(data, shape, device)
}

/// A tensor of U(low, high) samples.
pub fn uniform<S: Into<Shape>, R: Rng>(
    rng: &mut R,
    shape: S,
    low: f32,
    high: f32,
    device: &Device,
) -> Result<Tensor> {
    let shape = shape.into();
    let data: Vec<f32> = (0..shape.elem_count())
        .map(|_| rng.random_range(low..high))
        .collect();
    Tensor::from_vec(data, shape, device)
}
