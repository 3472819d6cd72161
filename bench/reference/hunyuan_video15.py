"""Parity fixtures for Framesmith's HunyuanVideo 1.5 transformer, made by diffusers'
`HunyuanVideo15Transformer3DModel` (src/diffusers/models/transformers/transformer_hunyuan_video15.py, the port of
github:Tencent-Hunyuan/HunyuanVideo-1.5's `HunyuanVideo_1_5_DiffusionTransformer`) with random weights at small
shapes, run forward and backward in float32 on the CPU with one thread.

Versions (the environment the committed fixtures were made in):
  - diffusers 0.42.1 from PyPI. Its transformer_hunyuan_video15.py has sha256
    5bd3bb204041331639c620f708f5de088a40df523f28a372a94caaca10ce561b.
  - torch 2.15.0 (PyPI wheel, run on the CPU), safetensors 0.8.0, numpy 2.4.6, Python 3.11.7.

One change to the model as constructed: the glyph projection `context_embedder_2` (the official `byt5_in`) has a
hidden width fixed at 2048 in the constructor, which alone would make a fixture of 17 MB; it is rebuilt with the
same class and a hidden width of 48 (Framesmith reads that width from the weights' shapes).

Command (from the repository root; writes crates/framesmith-models/tests/fixtures/hunyuan_video15/<case>/):
  /work/venv-ref/bin/python bench/reference/hunyuan_video15.py

Each case directory holds config.json (constructor arguments as `init`, the call's shapes as `call`, seeds),
weights.safetensors (`t2v`: diffusers' key names as `model.state_dict()` has them; `i2v`: the same tensors in the
official release's layout, converted by `to_official` below), inputs.safetensors and expected.safetensors (outputs,
intermediates and gradients; names in the README beside the fixtures)."""
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

import diffusers
from diffusers import HunyuanVideo15Transformer3DModel
from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15ByT5TextProjection

OUT = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/hunyuan_video15"

LATENT = 4  # latent channels; the input is [latents, condition latents, mask] = 2 * LATENT + 1
INIT = {
    "in_channels": 2 * LATENT + 1,
    "out_channels": LATENT,
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "num_layers": 2,
    "num_refiner_layers": 2,
    "mlp_ratio": 4.0,
    "patch_size": 1,
    "patch_size_t": 1,
    "qk_norm": "rms_norm",
    "text_embed_dim": 24,
    "text_embed_2_dim": 20,
    "image_embed_dim": 12,
    "rope_theta": 256.0,
    "rope_axes_dim": [4, 6, 6],
}
BYT5_HIDDEN = 48

# Linears of the first block whose weight gradients are checked (every linear of a block), diffusers' names.
BLOCK_LINEARS = [
    "norm1.linear",
    "norm1_context.linear",
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_out.0",
    "attn.to_add_out",
    "ff.net.0.proj",
    "ff.net.2",
    "ff_context.net.0.proj",
    "ff_context.net.2",
]

CASES = {
    # Text to video: two samples; the second has 3 padded Qwen2.5-VL tokens and no glyph token at all (random
    # values in the padding, so a leaking mask shows); the image embeds are zeros, as the T2V pipeline passes them.
    "t2v": {
        "batch": 2,
        "frames": 3,
        "height": 4,
        "width": 5,
        "txt_len": 7,
        "txt_lens": [7, 4],
        "byt5_len": 5,
        "byt5_lens": [3, 0],
        "image_tokens": 6,
        "i2v": False,
        "timesteps": [750.0, 200.0],
        "seed_weights": 1,
        "seed_inputs": 2,
    },
    # Image to video: the first frame's latents in the condition channels with mask 1 there, SigLIP-like image
    # embeds, weights stored in the official layout.
    "i2v": {
        "batch": 1,
        "frames": 2,
        "height": 3,
        "width": 4,
        "txt_len": 6,
        "txt_lens": [6],
        "byt5_len": 4,
        "byt5_lens": [2],
        "image_tokens": 5,
        "i2v": True,
        "timesteps": [500.0],
        "seed_weights": 3,
        "seed_inputs": 4,
    },
}


def randomise(model, seed):
    """Every parameter drawn from a seeded normal: linears ~ N(0, 1/fan_in), biases ~ N(0, 0.05²), norm weights
    ~ 1 + N(0, 0.1²), so no module is the identity or zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            parts = name.split(".")
            if len(parts) > 1 and "norm" in parts[-2] and "norm1.linear" not in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)


def to_official(sd, num_layers, num_refiner_layers):
    """diffusers' state dict in the official release's key names (the inverse of diffusers'
    scripts/convert_hunyuan_video1_5_to_diffusers.py)."""
    out = {}

    def put(dst, src):
        for suffix in ("weight", "bias"):
            if f"{src}.{suffix}" in sd:
                out[f"{dst}.{suffix}"] = sd[f"{src}.{suffix}"]

    put("img_in.proj", "x_embedder.proj")
    put("time_in.mlp.0", "time_embed.timestep_embedder.linear_1")
    put("time_in.mlp.2", "time_embed.timestep_embedder.linear_2")
    put("cond_type_embedding", "cond_type_embed")
    put("vision_in.proj.0", "image_embedder.norm_in")
    put("vision_in.proj.1", "image_embedder.linear_1")
    put("vision_in.proj.3", "image_embedder.linear_2")
    put("vision_in.proj.4", "image_embedder.norm_out")
    put("byt5_in.layernorm", "context_embedder_2.norm")
    for i in (1, 2, 3):
        put(f"byt5_in.fc{i}", f"context_embedder_2.linear_{i}")
    ce = "context_embedder"
    put("txt_in.input_embedder", f"{ce}.proj_in")
    put("txt_in.t_embedder.mlp.0", f"{ce}.time_text_embed.timestep_embedder.linear_1")
    put("txt_in.t_embedder.mlp.2", f"{ce}.time_text_embed.timestep_embedder.linear_2")
    put("txt_in.c_embedder.linear_1", f"{ce}.time_text_embed.text_embedder.linear_1")
    put("txt_in.c_embedder.linear_2", f"{ce}.time_text_embed.text_embedder.linear_2")
    for i in range(num_refiner_layers):
        src, dst = f"{ce}.token_refiner.refiner_blocks.{i}", f"txt_in.individual_token_refiner.blocks.{i}"
        for n in ("norm1", "norm2"):
            put(f"{dst}.{n}", f"{src}.{n}")
        for suffix in ("weight", "bias"):
            out[f"{dst}.self_attn_qkv.{suffix}"] = torch.cat(
                [sd[f"{src}.attn.to_{x}.{suffix}"] for x in "qkv"], dim=0
            )
        put(f"{dst}.self_attn_proj", f"{src}.attn.to_out.0")
        put(f"{dst}.mlp.fc1", f"{src}.ff.net.0.proj")
        put(f"{dst}.mlp.fc2", f"{src}.ff.net.2")
        put(f"{dst}.adaLN_modulation.1", f"{src}.norm_out.linear")
    for i in range(num_layers):
        src, dst = f"transformer_blocks.{i}", f"double_blocks.{i}"
        names = {
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
        for d, s in names.items():
            put(f"{dst}.{d}", f"{src}.{s}")
    put("final_layer.linear", "proj_out")
    for suffix in ("weight", "bias"):
        # diffusers' AdaLayerNormContinuous is (scale, shift); the official FinalLayer is (shift, scale).
        scale, shift = sd[f"norm_out.linear.{suffix}"].chunk(2, dim=0)
        out[f"final_layer.adaLN_modulation.1.{suffix}"] = torch.cat([shift, scale], dim=0)
    # Each refiner block's six q / k / v tensors became two fused ones; everything else maps one to one.
    assert len(out) == len(sd) - 4 * num_refiner_layers, (len(out), len(sd))
    return out


def make_inputs(case):
    b, f, h, w = case["batch"], case["frames"], case["height"], case["width"]
    g = torch.Generator().manual_seed(case["seed_inputs"])
    latents = torch.randn(b, LATENT, f, h, w, generator=g)
    cond = torch.zeros(b, LATENT, f, h, w)
    mask = torch.zeros(b, 1, f, h, w)
    if case["i2v"]:
        cond[:, :, 0] = torch.randn(b, LATENT, h, w, generator=g)
        mask[:, :, 0] = 1.0
    hidden = torch.cat([latents, cond, mask], dim=1).requires_grad_(True)
    txt = torch.randn(b, case["txt_len"], INIT["text_embed_dim"], generator=g).requires_grad_(True)
    byt5 = torch.randn(b, case["byt5_len"], INIT["text_embed_2_dim"], generator=g).requires_grad_(True)
    if case["i2v"]:
        image = torch.randn(b, case["image_tokens"], INIT["image_embed_dim"], generator=g)
    else:
        image = torch.zeros(b, case["image_tokens"], INIT["image_embed_dim"])
    image.requires_grad_(True)
    probe = torch.randn(b, LATENT, f, h, w, generator=g)

    def lens_mask(lens, n):
        m = torch.zeros(b, n, dtype=torch.int64)
        for i, k in enumerate(lens):
            m[i, :k] = 1
        return m

    return {
        "hidden_states": hidden,
        "txt": txt,
        "txt_mask": lens_mask(case["txt_lens"], case["txt_len"]),
        "byt5": byt5,
        "byt5_mask": lens_mask(case["byt5_lens"], case["byt5_len"]),
        "image_embeds": image,
        "timesteps": torch.tensor(case["timesteps"], dtype=torch.float32),
        "probe": probe,
    }


def run_case(name, case):
    torch.manual_seed(0)
    model = HunyuanVideo15Transformer3DModel(**INIT).float().eval()
    inner = INIT["num_attention_heads"] * INIT["attention_head_dim"]
    model.context_embedder_2 = HunyuanVideo15ByT5TextProjection(INIT["text_embed_2_dim"], BYT5_HIDDEN, inner)
    randomise(model, case["seed_weights"])
    x = make_inputs(case)

    seen = {}

    def keep(key):
        def hook(_module, args, kwargs, output):
            seen[key] = (args, kwargs, output)

        return hook

    hooks = [
        model.time_embed.register_forward_hook(keep("temb"), with_kwargs=True),
        model.rope.register_forward_hook(keep("rope"), with_kwargs=True),
        model.context_embedder.register_forward_hook(keep("refiner"), with_kwargs=True),
        model.transformer_blocks[0].register_forward_hook(keep("block0"), with_kwargs=True),
    ]
    out = model(
        hidden_states=x["hidden_states"],
        timestep=x["timesteps"],
        encoder_hidden_states=x["txt"],
        encoder_attention_mask=x["txt_mask"],
        encoder_hidden_states_2=x["byt5"],
        encoder_attention_mask_2=x["byt5_mask"],
        image_embeds=x["image_embeds"],
        return_dict=False,
    )[0]
    for hk in hooks:
        hk.remove()
    assert torch.isfinite(out).all()
    (out * x["probe"]).sum().backward()

    block0_args, _, (block0_img, _) = seen["block0"]
    cos, sin = seen["rope"][2]
    expected = {
        "temb": seen["temb"][2],
        "rope.cos": cos,
        "rope.sin": sin,
        "refiner": seen["refiner"][2],
        "block0.in_img": block0_args[0],
        "block0.img": block0_img,
        "out": out,
        "grad.hidden_states": x["hidden_states"].grad,
        "grad.txt": x["txt"].grad,
        "grad.byt5": x["byt5"].grad,
    }
    if case["i2v"]:
        expected["grad.image_embeds"] = x["image_embeds"].grad
    params = dict(model.named_parameters())
    for linear in BLOCK_LINEARS:
        key = f"transformer_blocks.0.{linear}.weight"
        expected[f"grad.{key}"] = params[key].grad

    def plain(tensors):
        return {k: v.detach().contiguous().clone() for k, v in tensors.items()}

    sd = plain(model.state_dict())
    if case["i2v"]:
        sd = to_official(sd, INIT["num_layers"], INIT["num_refiner_layers"])
    folder = OUT / name
    folder.mkdir(parents=True, exist_ok=True)
    save_file(plain(sd), folder / "weights.safetensors")
    save_file(plain(x), folder / "inputs.safetensors")
    save_file(plain(expected), folder / "expected.safetensors")
    call = {k: v for k, v in case.items() if not k.startswith("seed")}
    config = {
        "kind": "hunyuan_video15_transformer",
        "source": f"diffusers=={diffusers.__version__}",
        "class": "diffusers.HunyuanVideo15Transformer3DModel",
        "init": INIT,
        "byt5_hidden": BYT5_HIDDEN,
        "layout": "official" if case["i2v"] else "diffusers",
        "call": call,
        "seeds": {"weights": case["seed_weights"], "inputs": case["seed_inputs"]},
        "torch": torch.__version__,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"{name}: out {tuple(out.shape)}, |out| max {out.abs().max().item():.3f} -> {folder}")


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for name, case in CASES.items():
        run_case(name, case)
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"{total} bytes in {OUT}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    sys.exit(main())
