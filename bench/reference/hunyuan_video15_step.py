"""PyTorch reference for HunyuanVideo 1.5 LoRA training: a training step of the official transformer, diffusers'
`HunyuanVideo15Transformer3DModel` (diffusers 0.42.1, the file bench/reference/hunyuan_video15.py's fixtures come
from; its transformer_hunyuan_video15.py has sha256 5bd3bb204041331639c620f708f5de088a40df523f28a372a94caaca10ce561b),
with its weights read from a DiT file in the official release's layout (the names `framesmith-bench synth-project
--model hunyuan-video15` writes; converted to diffusers' names as diffusers'
scripts/convert_hunyuan_video1_5_to_diffusers.py does). bf16 autocast over frozen bf16 base weights, diffusers'
own attention (SDPA), its per-block activation checkpointing (`enable_gradient_checkpointing()`), LoRA (f32
factors, down Kaiming-uniform, up zero) on every linear of the 54 double-stream blocks (the 14 per block
Framesmith's HunyuanVideo 1.5 trainer adapts, musubi-tuner's `networks.lora_hv_1_5` targets), flow-matching MSE
loss in f32, AdamW (and gradient clipping at 1.0) on the LoRA parameters.

The inputs are a Framesmith / musubi-tuner `_hv15` latent cache ([32, F, H/16, W/16], multiplied by the VAE's
scaling factor 1.03682 as musubi-tuner's trainer does) and `_hv15_te` text cache (Qwen2.5-VL [L, 3584] and byT5
[L2, 1472]), or random ones of --frames x --height x --width and --text-tokens. The text-to-video model input is
the noisy latents with 33 zero condition channels; as the diffusers pipeline calls the model for T2V, the image
embeds are 729 zero SigLIP tokens (masked out) and the byT5 states, when the caption quotes nothing, 256 masked
zero tokens (both stay in diffusers' joint sequence as padding; Framesmith leaves them out). With --i2v the
condition channels are the cache's `latents_image` (first-frame latents and mask, used as cached, as musubi-tuner's
trainer does) and the image embeds its `siglip` features.

Prints each step's time, then `HUNYUAN_VIDEO15_STEP {json}` (mean and median ms of the timed steps after the
warm-up, torch.cuda.max_memory_allocated and max_memory_reserved over the whole run, weights included) and a
`BENCH` line in the format of bench/reference/common.py. Needs diffusers (carry its wheel to the GPU machine) and
safetensors."""
import argparse
import sys
import time

import torch
import torch.nn.functional as F
from safetensors import safe_open

from common import (
    adamw,
    add_step_args,
    cache_tensor,
    optimizer_step,
    report_train_step,
    time_train_steps,
    wrap_block_linears,
)

SCALING_FACTOR = 1.03682
SIGLIP_TOKENS = 729
BYT5_MAX = 256
BLOCK_NAMES = {
    "img_mod.linear": "norm1.linear",
    "txt_mod.linear": "norm1_context.linear",
    "img_attn_q": "attn.to_q",
    "img_attn_k": "attn.to_k",
    "img_attn_v": "attn.to_v",
    "img_attn_q_norm": "attn.norm_q",
    "img_attn_k_norm": "attn.norm_k",
    "img_attn_proj": "attn.to_out.0",
    "txt_attn_q": "attn.add_q_proj",
    "txt_attn_k": "attn.add_k_proj",
    "txt_attn_v": "attn.add_v_proj",
    "txt_attn_q_norm": "attn.norm_added_q",
    "txt_attn_k_norm": "attn.norm_added_k",
    "txt_attn_proj": "attn.to_add_out",
    "img_mlp.fc1": "ff.net.0.proj",
    "img_mlp.fc2": "ff.net.2",
    "txt_mlp.fc1": "ff_context.net.0.proj",
    "txt_mlp.fc2": "ff_context.net.2",
}


def renames(layers, refiners):
    """(official prefix, diffusers prefix) of every module that maps one to one."""
    ce = "context_embedder"
    pairs = [
        ("img_in.proj", "x_embedder.proj"),
        ("time_in.mlp.0", "time_embed.timestep_embedder.linear_1"),
        ("time_in.mlp.2", "time_embed.timestep_embedder.linear_2"),
        ("cond_type_embedding", "cond_type_embed"),
        ("vision_in.proj.0", "image_embedder.norm_in"),
        ("vision_in.proj.1", "image_embedder.linear_1"),
        ("vision_in.proj.3", "image_embedder.linear_2"),
        ("vision_in.proj.4", "image_embedder.norm_out"),
        ("byt5_in.layernorm", "context_embedder_2.norm"),
        ("txt_in.input_embedder", f"{ce}.proj_in"),
        ("txt_in.t_embedder.mlp.0", f"{ce}.time_text_embed.timestep_embedder.linear_1"),
        ("txt_in.t_embedder.mlp.2", f"{ce}.time_text_embed.timestep_embedder.linear_2"),
        ("txt_in.c_embedder.linear_1", f"{ce}.time_text_embed.text_embedder.linear_1"),
        ("txt_in.c_embedder.linear_2", f"{ce}.time_text_embed.text_embedder.linear_2"),
        ("final_layer.linear", "proj_out"),
    ]
    pairs += [(f"byt5_in.fc{i}", f"context_embedder_2.linear_{i}") for i in (1, 2, 3)]
    for i in range(refiners):
        src, dst = f"txt_in.individual_token_refiner.blocks.{i}", f"{ce}.token_refiner.refiner_blocks.{i}"
        pairs += [(f"{src}.norm1", f"{dst}.norm1"), (f"{src}.norm2", f"{dst}.norm2"),
                  (f"{src}.self_attn_proj", f"{dst}.attn.to_out.0"), (f"{src}.mlp.fc1", f"{dst}.ff.net.0.proj"),
                  (f"{src}.mlp.fc2", f"{dst}.ff.net.2"), (f"{src}.adaLN_modulation.1", f"{dst}.norm_out.linear")]
    for i in range(layers):
        pairs += [(f"double_blocks.{i}.{o}", f"transformer_blocks.{i}.{d}") for o, d in BLOCK_NAMES.items()]
    return pairs


def read_state(path, device):
    """The official-layout DiT at `path` under diffusers' names, bf16 on `device`."""
    with safe_open(path, framework="pt", device="cpu") as f:
        official = {k: f.get_tensor(k) for k in f.keys()}
    layers = 1 + max(int(k.split(".")[1]) for k in official if k.startswith("double_blocks."))
    refiners = len({k.split(".")[3] for k in official if k.startswith("txt_in.individual_token_refiner.")})
    out = {}
    for src, dst in renames(layers, refiners):
        for suffix in ("weight", "bias"):
            if f"{src}.{suffix}" in official:
                out[f"{dst}.{suffix}"] = official.pop(f"{src}.{suffix}")
    for i in range(refiners):
        src = f"txt_in.individual_token_refiner.blocks.{i}.self_attn_qkv"
        dst = f"context_embedder.token_refiner.refiner_blocks.{i}.attn"
        for suffix in ("weight", "bias"):
            for x, part in zip("qkv", official.pop(f"{src}.{suffix}").chunk(3, dim=0)):
                out[f"{dst}.to_{x}.{suffix}"] = part
    for suffix in ("weight", "bias"):
        # The official FinalLayer is (shift, scale); diffusers' AdaLayerNormContinuous is (scale, shift).
        shift, scale = official.pop(f"final_layer.adaLN_modulation.1.{suffix}").chunk(2, dim=0)
        out[f"norm_out.linear.{suffix}"] = torch.cat([scale, shift], dim=0)
    if official:
        sys.exit(f"tensors with no diffusers name: {sorted(official)[:5]}")
    return {k: v.to(device, torch.bfloat16) for k, v in out.items()}, layers, refiners


def config_of(sd, layers, refiners):
    """The constructor arguments of the transformer whose diffusers state dict is `sd`."""
    head = sd["transformer_blocks.0.attn.norm_q.weight"].shape[0]
    dim = sd["cond_type_embed.weight"].shape[1]
    hw = 2 * (7 * head // 32)
    return dict(
        in_channels=sd["x_embedder.proj.weight"].shape[1],
        out_channels=sd["proj_out.weight"].shape[0],
        num_attention_heads=dim // head,
        attention_head_dim=head,
        num_layers=layers,
        num_refiner_layers=refiners,
        text_embed_dim=sd["context_embedder.proj_in.weight"].shape[1],
        text_embed_2_dim=sd["context_embedder_2.linear_1.weight"].shape[1],
        image_embed_dim=sd["image_embedder.linear_1.weight"].shape[1],
        rope_axes_dim=(head - 2 * hw, hw, hw),
        task_type="t2v",
    )


def add_lora(model, rank, alpha):
    """Wraps every linear inside the double-stream blocks (14 each); returns the LoRA parameters."""
    return wrap_block_linears(model.transformer_blocks, rank, alpha)


def inputs(a, cfg, dev):
    """Latents [1, 32, F, H, W] (scaled), Qwen2.5-VL states [1, L, 3584], byT5 states [L2, 1472] and, with
    --i2v, the condition channels [1, 33, F, H, W] and SigLIP features [1, 729, 1152] (else None)."""
    if a.latent_cache:
        latent = cache_tensor(a.latent_cache, "latents_", dev).unsqueeze(0)
    else:
        f = (a.frames - 1) // 4 + 1
        latent = torch.randn(1, cfg["out_channels"], f, a.height // 16, a.width // 16, device=dev)
    cond = siglip = None
    if a.i2v:
        if not a.latent_cache:
            sys.exit("--i2v reads the first-frame latents and SigLIP features of --latent-cache")
        cond = cache_tensor(a.latent_cache, "latents_image_", dev).unsqueeze(0)
        siglip = cache_tensor(a.latent_cache, "siglip_", dev).unsqueeze(0)
    if a.text_cache:
        txt = cache_tensor(a.text_cache, "varlen_vl_embed_", dev).unsqueeze(0)
        glyph = cache_tensor(a.text_cache, "varlen_byt5_embed_", dev)
    else:
        txt = torch.randn(1, a.text_tokens, cfg["text_embed_dim"], device=dev)
        glyph = torch.zeros(0, cfg["text_embed_2_dim"], device=dev)
    return latent * SCALING_FACTOR, txt, glyph, cond, siglip


def glyph_states(glyph, dim, dev):
    """byT5 states padded to 256 tokens with their mask, as the pipeline passes them."""
    n = glyph.shape[0]
    states = torch.zeros(1, BYT5_MAX, dim, device=dev)
    states[0, :n] = glyph[:BYT5_MAX]
    mask = torch.zeros(1, BYT5_MAX, device=dev, dtype=torch.long)
    mask[0, :n] = 1
    return states, mask


def forward_flops(cfg, img_len, txt_len):
    """Matrix-product FLOPs of one forward: per token and block q, k, v, out (4 dim²) and the MLP (8 dim²), and
    attention over the joint sequence (the modulation, embeddings, refiner and head left out)."""
    dim = cfg["attention_head_dim"] * cfg["num_attention_heads"]
    n = img_len + txt_len
    return cfg["num_layers"] * (2 * 12 * dim * dim * n + 4 * n * n * dim)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dit", required=True, help="HunyuanVideo 1.5 DiT .safetensors (official names)")
    p.add_argument("--latent-cache", help="a *_hv15.safetensors latent cache (else random latents)")
    p.add_argument("--text-cache", help="a *_hv15_te.safetensors text cache (else random features)")
    p.add_argument("--frames", type=int, default=121)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=848)
    p.add_argument("--text-tokens", type=int, default=128)
    add_step_args(p, rank=32, iters=8)
    p.add_argument("--i2v", action="store_true", help="image-to-video: the cache's first frame and SigLIP features")
    p.add_argument("--device", default="cuda")
    return p.parse_args()


def main():
    a = parse()
    from diffusers import HunyuanVideo15Transformer3DModel

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    t0 = time.perf_counter()
    sd, layers, refiners = read_state(a.dit, dev)
    cfg = config_of(sd, layers, refiners)
    with torch.device("meta"):
        model = HunyuanVideo15Transformer3DModel(**cfg)
    model.load_state_dict(sd, strict=True, assign=True)
    del sd
    model.requires_grad_(False)
    if not a.no_checkpointing:
        model.enable_gradient_checkpointing()
    params = add_lora(model, a.rank, a.alpha if a.alpha is not None else float(a.rank))
    model.train()
    load_secs = time.perf_counter() - t0
    latent, txt, glyph, cond, siglip = inputs(a, cfg, dev)
    _, c, f, h, w = latent.shape
    noise = torch.randn_like(latent)
    noisy = (1 - a.sigma) * latent + a.sigma * noise
    if cond is None:
        cond = torch.zeros(1, c + 1, f, h, w, device=dev)
    xt = torch.cat([noisy, cond], dim=1).to(torch.bfloat16)
    target = noise - latent
    txt = txt.to(torch.bfloat16)
    txt_mask = torch.ones(1, txt.shape[1], device=dev, dtype=torch.long)
    byt5, byt5_mask = glyph_states(glyph, cfg["text_embed_2_dim"], dev)
    byt5 = byt5.to(torch.bfloat16)
    if siglip is None:
        siglip = torch.zeros(1, SIGLIP_TOKENS, cfg["image_embed_dim"], device=dev)
    image = siglip.to(torch.bfloat16)
    timestep = torch.tensor([a.sigma * 1000.0 + 1.0], device=dev)
    opt = adamw(params, a.lr)
    losses = []

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            pred = model(hidden_states=xt, timestep=timestep, encoder_hidden_states=txt,
                         encoder_attention_mask=txt_mask, encoder_hidden_states_2=byt5,
                         encoder_attention_mask_2=byt5_mask, image_embeds=image, return_dict=False)[0]
        loss = F.mse_loss(pred.float(), target)
        optimizer_step(loss, params, opt, losses)

    timing = time_train_steps(step, losses, a.warmup, a.iters, cuda)
    img_len, txt_len = f * h * w, txt.shape[1] + BYT5_MAX + image.shape[1]
    fields = {
        "blocks": cfg["num_layers"],
        "clip": [w * 16, h * 16, (f - 1) * 4 + 1],
        "i2v": a.i2v,
        "img_tokens": img_len,
        "txt_tokens": txt_len,
        "rank": a.rank,
        "lora_modules": len(params) // 2,
        "lora_parameters": sum(q.numel() for q in params),
        "checkpointing": not a.no_checkpointing,
    }
    flops = (3.0 if a.no_checkpointing else 4.0) * forward_flops(cfg, img_len, txt_len)
    shape = f"b=1 {w * 16}x{h * 16}x{(f - 1) * 4 + 1} img={img_len} txt={txt_len} r={a.rank}"
    last = {"load_secs": load_secs, "loss": losses[-1].item()}
    bench = ("hunyuan-video15-step", "hunyuan-video15 bf16", "lora step", shape, flops)
    report_train_step("HUNYUAN_VIDEO15_STEP", cuda, fields, timing, last, bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
