"""PyTorch reference for Qwen-Image LoRA training: a training step of the official transformer, diffusers'
`QwenImageTransformer2DModel` (diffusers 0.42.1, the file bench/reference/qwen_image.py's fixtures come from),
with its weights read from a DiT file in the diffusers layout (one file or ComfyUI's `model.diffusion_model.`
prefix; FP8 weights are dequantised to bf16). bf16 autocast over frozen bf16 base weights, diffusers' own
attention (SDPA), its per-block activation checkpointing (`enable_gradient_checkpointing()`), LoRA (f32 factors,
down Kaiming-uniform, up zero) on every linear of the 60 blocks (the 14 per block Framesmith's Qwen-Image trainer
adapts, musubi-tuner's targets), flow-matching MSE loss in f32, AdamW (and gradient clipping at 1.0) on the LoRA
parameters.

The inputs are a Framesmith / musubi-tuner `_qi` latent cache ([16, 1, H/8, W/8]) and `_qi_te` text cache
([L, 3584]), or random ones of --height x --width and --text-tokens.

Prints each step's time, then `QWEN_IMAGE_STEP {json}` (mean and median ms of the timed steps after the warm-up,
torch.cuda.max_memory_allocated and max_memory_reserved over the whole run, weights included) and a `BENCH` line
in the format of bench/reference/common.py. Needs diffusers (carry its wheel to the GPU machine) and safetensors."""
import argparse
import sys
import time

import torch
import torch.nn.functional as F
from safetensors import safe_open

from common import adamw, add_step_args, optimizer_step, report_train_step, time_train_steps, wrap_block_linears

PREFIXES = ("model.diffusion_model.", "diffusion_model.")


def read_state(path, device):
    """The DiT's tensors under diffusers' names, bf16 on `device` (FP8 weights times their `scale_weight`)."""
    out, scales = {}, {}
    with safe_open(path, framework="pt", device="cpu") as f:
        for key in f.keys():
            name = key
            for p in PREFIXES:
                if name.startswith(p):
                    name = name[len(p):]
                    break
            if name == "scaled_fp8":
                continue
            t = f.get_tensor(key)
            if name.endswith(".scale_weight"):
                scales[name[: -len(".scale_weight")] + ".weight"] = t
                continue
            out[name] = t
    for name, t in out.items():
        t = t.to(device)
        if t.dtype == torch.float8_e4m3fn:
            t = t.to(torch.float32) * scales.get(name, torch.tensor(1.0)).to(device, torch.float32)
        out[name] = t.to(torch.bfloat16)
    return out


def config_of(sd):
    """The constructor arguments of the transformer whose state dict is `sd`."""
    layers = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("transformer_blocks."))
    head = sd["transformer_blocks.0.attn.norm_q.weight"].shape[0]
    dim = sd["img_in.weight"].shape[0]
    return dict(
        patch_size=2,
        in_channels=sd["img_in.weight"].shape[1],
        out_channels=sd["proj_out.weight"].shape[0] // 4,
        num_layers=layers,
        attention_head_dim=head,
        num_attention_heads=dim // head,
        joint_attention_dim=sd["txt_in.weight"].shape[1],
        axes_dims_rope=(head // 8, head * 7 // 16, head * 7 // 16),
    )


def add_lora(model, rank, alpha):
    """Wraps every linear inside the transformer blocks; returns the LoRA parameters."""
    return wrap_block_linears(model.transformer_blocks, rank, alpha)


def pack(latent):
    """[1, 16, 1, H, W] latents → [1, (H/2)(W/2), 64] tokens, as QwenImagePipeline._pack_latents does."""
    b, c, _, h, w = latent.shape
    x = latent[:, :, 0].reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def first_tensor(path, device):
    with safe_open(path, framework="pt", device="cpu") as f:
        keys = [k for k in f.keys() if k.startswith("latents_") or k.startswith("varlen_vl_embed_")]
        if not keys:
            sys.exit(f"no latents / vl_embed tensor in {path}")
        return f.get_tensor(keys[0]).to(device, torch.float32)


def inputs(a, cfg, dev):
    if a.latent_cache:
        latent = first_tensor(a.latent_cache, dev).unsqueeze(0)
    else:
        latent = torch.randn(1, 16, 1, a.height // 8, a.width // 8, device=dev)
    if a.text_cache:
        txt = first_tensor(a.text_cache, dev).unsqueeze(0)
    else:
        txt = torch.randn(1, a.text_tokens, cfg["joint_attention_dim"], device=dev)
    return latent, txt


def forward_flops(cfg, img_len, txt_len):
    """Matrix-product FLOPs of one forward: per token and block q, k, v, out (4 dim²) and the MLP (8 dim²), and
    attention over the joint sequence (the per-sample modulation, embeddings and head left out)."""
    dim = cfg["attention_head_dim"] * cfg["num_attention_heads"]
    n = img_len + txt_len
    return cfg["num_layers"] * (2 * 12 * dim * dim * n + 4 * n * n * dim)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dit", required=True, help="Qwen-Image DiT .safetensors (diffusers names, ComfyUI prefix)")
    p.add_argument("--latent-cache", help="a *_qi.safetensors latent cache (else random latents)")
    p.add_argument("--text-cache", help="a *_qi_te.safetensors text cache (else random features)")
    p.add_argument("--height", type=int, default=1024)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--text-tokens", type=int, default=64)
    add_step_args(p, rank=16, iters=8)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    from diffusers import QwenImageTransformer2DModel

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    t0 = time.perf_counter()
    sd = read_state(a.dit, dev)
    cfg = config_of(sd)
    with torch.device("meta"):
        model = QwenImageTransformer2DModel(**cfg)
    model.load_state_dict(sd, strict=True, assign=True)
    del sd
    # The RoPE tables are plain attributes, not state: made again where the model runs.
    model.pos_embed = type(model.pos_embed)(theta=10000, axes_dim=list(cfg["axes_dims_rope"]), scale_rope=True)
    model.requires_grad_(False)
    if not a.no_checkpointing:
        model.enable_gradient_checkpointing()
    params = add_lora(model, a.rank, a.alpha if a.alpha is not None else float(a.rank))
    model.train()
    load_secs = time.perf_counter() - t0
    latent, txt = inputs(a, cfg, dev)
    _, _, _, h, w = latent.shape
    noise = torch.randn_like(latent)
    xt = pack((1 - a.sigma) * latent + a.sigma * noise).to(torch.bfloat16)
    target = pack(noise - latent)
    txt = txt.to(torch.bfloat16)
    mask = torch.ones(1, txt.shape[1], device=dev, dtype=torch.bfloat16)
    timestep = torch.tensor([a.sigma], device=dev)
    img_shapes = [[(1, h // 2, w // 2)]]
    opt = adamw(params, a.lr)
    losses = []

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            pred = model(hidden_states=xt, encoder_hidden_states=txt, encoder_hidden_states_mask=mask,
                         timestep=timestep, img_shapes=img_shapes, return_dict=False)[0]
        loss = F.mse_loss(pred.float(), target)
        optimizer_step(loss, params, opt, losses)

    timing = time_train_steps(step, losses, a.warmup, a.iters, cuda)
    img_len, txt_len = xt.shape[1], txt.shape[1]
    fields = {
        "blocks": cfg["num_layers"],
        "image": [w * 8, h * 8],
        "img_tokens": img_len,
        "txt_tokens": txt_len,
        "rank": a.rank,
        "lora_modules": len(params) // 2,
        "lora_parameters": sum(q.numel() for q in params),
        "checkpointing": not a.no_checkpointing,
    }
    flops = (3.0 if a.no_checkpointing else 4.0) * forward_flops(cfg, img_len, txt_len)
    shape = f"b=1 {w * 8}x{h * 8} img={img_len} txt={txt_len} r={a.rank}"
    last = {"load_secs": load_secs, "loss": losses[-1].item()}
    bench = ("qwen-image-step", "qwen-image bf16", "lora step", shape, flops)
    report_train_step("QWEN_IMAGE_STEP", cuda, fields, timing, last, bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
