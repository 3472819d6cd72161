//! A double-stream block of HunyuanVideo 1.5 (`double_blocks.N`, the official `MMDoubleStreamBlock`), read from
//! the official key names into the dual-stream block it shares with Qwen-Image (`crate::mmdit`): the two
//! architectures are the same (per-stream AdaLN-zero modulation of six vectors, parameter-free LayerNorms, q/k RMSNorm per head,
//! one joint attention with the text padding masked, GELU-tanh MLPs 4× wide), so its tracked forward, its
//! hand-written backward and its streaming serve both. HunyuanVideo rotates only the latent tokens (the text's
//! RoPE table is the identity, [`super::rope`]).

use candle_core::Result;

use super::config::HunyuanVideo15Config;
use crate::mmdit::{DualStreamBlock, FeedForward, JointAttention, Modulation, StreamQkv};
use framesmith_nn::linear::Linear;
use framesmith_nn::vb::Vb;

/// The linears of one block (paths under `double_blocks.{i}.`), the official names that musubi-tuner's LoRAs
/// use (`lora_unet_double_blocks_0_img_attn_q`).
pub const BLOCK_LINEARS: [&str; 14] = [
    "img_mod.linear",
    "img_attn_q",
    "img_attn_k",
    "img_attn_v",
    "img_attn_proj",
    "img_mlp.fc1",
    "img_mlp.fc2",
    "txt_mod.linear",
    "txt_attn_q",
    "txt_attn_k",
    "txt_attn_v",
    "txt_attn_proj",
    "txt_mlp.fc1",
    "txt_mlp.fc2",
];

/// One stream's q, k, v and q / k norms (`img_attn_q`, …, `img_attn_q_norm.weight`).
fn stream(stream: &str, dim: usize, head_dim: usize, vb: &Vb) -> Result<StreamQkv> {
    let linear = |x: &str| Linear::load(&vb.pp(format!("{stream}_attn_{x}")), dim, dim);
    let norm = |x: &str| {
        vb.pp(format!("{stream}_attn_{x}_norm"))
            .get(head_dim, "weight")
    };
    Ok(StreamQkv {
        q: linear("q")?,
        k: linear("k")?,
        v: linear("v")?,
        norm_q: norm("q")?,
        norm_k: norm("k")?,
    })
}

/// One stream's MLP (`img_mlp.fc1` → GELU-tanh → `img_mlp.fc2`).
fn mlp(stream: &str, dim: usize, hidden: usize, vb: &Vb) -> Result<FeedForward> {
    let vb = vb.pp(format!("{stream}_mlp"));
    Ok(FeedForward {
        proj_in: Linear::load(&vb.pp("fc1"), dim, hidden)?,
        proj_out: Linear::load(&vb.pp("fc2"), hidden, dim)?,
    })
}

/// Reads `double_blocks.N` under `vb`.
pub fn load_block(cfg: &HunyuanVideo15Config, vb: &Vb) -> Result<DualStreamBlock> {
    let (dim, head_dim, hidden) = (
        cfg.inner_dim(),
        cfg.attention_head_dim,
        cfg.mlp_hidden_dim(),
    );
    let modulation = |s: &str| -> Result<Modulation> {
        Ok(Modulation {
            lin: Linear::load(&vb.pp(format!("{s}_mod")).pp("linear"), dim, 6 * dim)?,
        })
    };
    let attn = JointAttention::from_parts(
        (
            stream("img", dim, head_dim, vb)?,
            stream("txt", dim, head_dim, vb)?,
        ),
        Linear::load(&vb.pp("img_attn_proj"), dim, dim)?,
        Linear::load(&vb.pp("txt_attn_proj"), dim, dim)?,
        head_dim,
    );
    Ok(DualStreamBlock {
        img_mod: modulation("img")?,
        txt_mod: modulation("txt")?,
        attn,
        img_mlp: mlp("img", dim, hidden, vb)?,
        txt_mlp: mlp("txt", dim, hidden, vb)?,
    })
}

/// The block's linears by their official path under the block, in [`BLOCK_LINEARS`]' order, for LoRA.
pub fn linears_mut(block: &mut DualStreamBlock) -> Vec<(String, &mut Linear)> {
    let attn = &mut block.attn;
    let linears: [&mut Linear; 14] = [
        &mut block.img_mod.lin,
        &mut attn.img.q,
        &mut attn.img.k,
        &mut attn.img.v,
        &mut attn.to_out,
        &mut block.img_mlp.proj_in,
        &mut block.img_mlp.proj_out,
        &mut block.txt_mod.lin,
        &mut attn.txt.q,
        &mut attn.txt.k,
        &mut attn.txt.v,
        &mut attn.to_add_out,
        &mut block.txt_mlp.proj_in,
        &mut block.txt_mlp.proj_out,
    ];
    BLOCK_LINEARS
        .iter()
        .map(|name| name.to_string())
        .zip(linears)
        .collect()
}
