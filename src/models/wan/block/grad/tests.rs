//! The hand-written block backward against candle's autograd through `Block::forward`, on tiny f32 models of
//! every block shape the variants have.

use candle_core::{DType, Device, Result, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::models::wan::config::{Generation, ModelType};
use crate::models::wan::random::{random_inputs, random_weights};
use crate::models::wan::{ModelOptions, Timesteps, WanConfig, WanInputs, WanModel};
use crate::nn::fp8::Fp8Scale;
use crate::nn::init::randn;
use crate::nn::lora::Lora;
use crate::nn::vb::Vb;

use crate::nn::testing::rel;

/// A tiny model with LoRAs (random, non-zero `up`, multiplier ≠ 1) on every block linear.
fn model_with_loras(cfg: &WanConfig, options: &ModelOptions) -> Result<(WanModel, Vec<Var>)> {
    let dev = Device::Cpu;
    let vb = Vb::from_tensors(random_weights(cfg, 7, DType::F32, &dev)?, DType::F32, &dev);
    let mut model = WanModel::new(cfg, vb, options)?;
    let mut vars = Vec::new();
    let rng = &mut StdRng::seed_from_u64(11);
    for (_, linear) in model.linears_mut() {
        let mut lora = Lora::new(linear.in_dim(), linear.out_dim(), 4, 8.0, DType::F32, &dev)?;
        lora.up.set(&randn(rng, lora.up.shape(), 0.0, 0.1, &dev)?)?;
        lora.multiplier = 0.7;
        vars.push(lora.down.clone());
        vars.push(lora.up.clone());
        linear.set_lora(Some(lora));
    }
    Ok((model, vars))
}

/// Runs block 0 (and the last block) both ways on the model's prepared inputs and compares the output, the
/// input gradient and every LoRA gradient of the block.
fn check(model: &WanModel, vars: &[Var], inputs: &WanInputs, tol: f64) -> Result<()> {
    let prepared = model.prepare(inputs)?;
    let rng = &mut StdRng::seed_from_u64(5);
    let mut xs = prepared.x.clone();
    for (i, block) in model.blocks().iter().enumerate() {
        let grad = randn(rng, xs.shape(), 0.0, 1.0, xs.device())?.to_dtype(xs.dtype())?;
        let x = Var::from_tensor(&xs)?;
        let out_ref = block.forward(x.as_tensor(), &prepared.blocks)?;
        let surrogate = (out_ref.to_dtype(DType::F32)? * grad.to_dtype(DType::F32)?)?.sum_all()?;
        let store = surrogate.backward()?;

        let (out, kept) = block.forward_untracked(&xs, &prepared.blocks)?;
        assert!(!out.track_op(), "the untracked forward built a graph");
        assert!(rel(&out, &out_ref)? <= tol, "block {i} output");
        let tape = block.recompute(&xs, &prepared.blocks, None)?;
        let grads = block.backward(tape, &grad)?;
        assert_eq!(grads.input.dtype(), xs.dtype());
        let want = store
            .get(x.as_tensor())
            .ok_or_else(|| candle_core::Error::msg("no reference input gradient"))?;
        let r = rel(&grads.input, want)?;
        eprintln!("block {i}: input gradient rel {r:.2e}");
        assert!(r <= tol, "block {i} input gradient: rel {r}");

        let per_block = vars.len() / model.blocks().len();
        assert_eq!(
            grads.params.len(),
            per_block,
            "one gradient per LoRA factor"
        );
        let mut worst = 0f64;
        for p in &grads.params {
            let want = store
                .get(p.var.as_tensor())
                .ok_or_else(|| candle_core::Error::msg("no reference LoRA gradient"))?;
            let r = rel(&p.grad, want)?;
            worst = worst.max(r);
            assert!(
                r <= tol,
                "block {i} LoRA gradient {:?}: rel {r}",
                p.grad.dims()
            );
            assert!(want.abs()?.sum_all()?.to_scalar::<f32>()? > 0.0);
        }

        eprintln!("block {i}: worst LoRA gradient rel {worst:.2e}");
        // Selective checkpointing: the kept attention gives the same gradients as recomputing it.
        let tape = block.recompute(&xs, &prepared.blocks, Some(&kept))?;
        let again = block.backward(tape, &grad)?;
        assert!(rel(&again.input, &grads.input)? <= 1e-7);
        xs = out;
    }
    Ok(())
}

fn two_samples(cfg: &WanConfig) -> Result<WanInputs> {
    // Different latent sizes: the second sample is padded (seq_lens differ).
    random_inputs(cfg, &[[2, 4, 6], [1, 4, 4]], 3, &Device::Cpu)
}

#[test]
fn t2v_padded_batch_matches_autograd() -> Result<()> {
    let cfg = WanConfig::tiny(2);
    let (model, vars) = model_with_loras(&cfg, &ModelOptions::default())?;
    check(&model, &vars, &two_samples(&cfg)?, 1e-5)
}

#[test]
fn i2v_image_branch_matches_autograd() -> Result<()> {
    let cfg = WanConfig {
        model_type: ModelType::I2v,
        in_dim: 32,
        clip_dim: 48,
        clip_tokens: 9,
        ..WanConfig::tiny(1)
    };
    assert!(cfg.has_clip());
    let (model, vars) = model_with_loras(&cfg, &ModelOptions::default())?;
    check(&model, &vars, &two_samples(&cfg)?, 1e-5)
}

#[test]
fn ti2v_per_token_timesteps_match_autograd() -> Result<()> {
    let cfg = WanConfig {
        generation: Generation::Wan22,
        model_type: ModelType::Ti2v,
        ..WanConfig::tiny(1)
    };
    let (model, vars) = model_with_loras(&cfg, &ModelOptions::default())?;
    let mut inputs = two_samples(&cfg)?;
    let seq_len = 2 * 2 * 3;
    inputs.timesteps = Timesteps::PerToken(
        (0..2)
            .map(|s| {
                (0..seq_len)
                    .map(|t| 100.0 * s as f64 + 30.0 * t as f64)
                    .collect()
            })
            .collect(),
    );
    let prepared = model.prepare(&inputs)?;
    assert_eq!(prepared.blocks.e0.dim(1)?, seq_len, "per-token modulation");
    check(&model, &vars, &inputs, 1e-5)
}

#[test]
fn fp8_base_matches_autograd() -> Result<()> {
    let cfg = WanConfig::tiny(1);
    let options = ModelOptions {
        residual_dtype: DType::F32,
        blocks_fp8: Some(Fp8Scale::Block64),
    };
    let (model, vars) = model_with_loras(&cfg, &options)?;
    check(&model, &vars, &two_samples(&cfg)?, 1e-5)
}

/// With a bf16 residual stream the gradient is rounded to bf16 where the forward rounds, as autograd does; the
/// f32 arithmetic in between runs in another order, so an occasional value rounds to the neighbouring bf16
/// (2⁻⁸ relative): agreement to bf16 precision, not to f32's.
#[test]
fn bf16_residual_matches_autograd() -> Result<()> {
    let cfg = WanConfig::tiny(1);
    let options = ModelOptions {
        residual_dtype: DType::BF16,
        blocks_fp8: None,
    };
    let (model, vars) = model_with_loras(&cfg, &options)?;
    check(&model, &vars, &two_samples(&cfg)?, 1e-3)
}
