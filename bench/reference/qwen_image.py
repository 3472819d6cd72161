"""Parity fixtures for Framesmith's Qwen-Image transformer, made by the official implementation: diffusers'
`QwenImageTransformer2DModel` (src/diffusers/models/transformers/transformer_qwenimage.py) with random weights at
small shapes, run forward and backward in float32 on the CPU with one thread.

Versions (the environment the committed fixtures were made in):
  - diffusers 0.42.1 from PyPI. Its transformer_qwenimage.py has sha256
    39df645130da4ad05521cb373f3bc0ce14c40d12d8065b72d5a0d9043355545d (git blob 29a98c0e9e57); in
    github:huggingface/diffusers it is commit 7d2e86a85a372df75ee2ccefe84e5a44cfc60429's file ("Support tensor
    parallelism for model inference", #13718) without that commit's Neuron-only RoPE path (unused on the CPU) and
    with one return annotation more. The release's own tag was not in the snapshot of the repository we could read.
  - torch 2.15.0 (PyPI wheel, run on the CPU), safetensors 0.8.0, numpy 2.4.6, Python 3.11.7.

Command (from the repository root; writes crates/framesmith-models/tests/fixtures/qwen_image/<case>/):
  python3 -m venv /work/venv-ref
  /work/venv-ref/bin/pip install torch==2.15.0 diffusers==0.42.1 safetensors==0.8.0 numpy==2.4.6
  /work/venv-ref/bin/python bench/reference/qwen_image.py

Each case directory holds config.json (the constructor arguments as `init`, the call's shapes as `call`, the
seeds, the source), weights.safetensors (`model.state_dict()`, official key names), inputs.safetensors and
expected.safetensors (outputs, intermediates and gradients; names in the README beside the fixtures)."""
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

import diffusers
from diffusers import QwenImageTransformer2DModel

OUT = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/qwen_image"

INIT = {
    "patch_size": 2,
    "in_channels": 16,
    "out_channels": 4,
    "num_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 24,
    "guidance_embeds": False,
    "axes_dims_rope": [4, 6, 6],
}

# Linears of the first block whose weight gradients are checked (every linear of a block).
BLOCK_LINEARS = [
    "img_mod.1",
    "txt_mod.1",
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_out.0",
    "attn.to_add_out",
    "img_mlp.net.0.proj",
    "img_mlp.net.2",
    "txt_mlp.net.0.proj",
    "txt_mlp.net.2",
]

CASES = {
    # Text to image: two samples, one with three padded text tokens (random, not zero, so a mask that leaks shows),
    # an odd latent height so the centred ("scale_rope") positions are asymmetric.
    "t2i": {
        "batch": 2,
        "img_shapes": [[1, 5, 6]],
        "txt_len": 7,
        "txt_lens": [7, 4],
        "timesteps": [0.75, 0.2],
        "seed_weights": 1,
        "seed_inputs": 2,
    },
    # Edit-style: a second image's tokens after the first (RoPE frame index 1), one sample, no mask.
    "edit": {
        "batch": 1,
        "img_shapes": [[1, 4, 6], [1, 3, 4]],
        "txt_len": 5,
        "txt_lens": None,
        "timesteps": [0.5],
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
            if "norm" in name.split(".")[-2]:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def run_case(name, case):
    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(**INIT).float().eval()
    randomise(model, case["seed_weights"])

    b, t = case["batch"], case["txt_len"]
    shapes = [tuple(s) for s in case["img_shapes"]]
    img_len = sum(f * h * w for f, h, w in shapes)
    g = torch.Generator().manual_seed(case["seed_inputs"])
    img = torch.randn(b, img_len, INIT["in_channels"], generator=g).requires_grad_(True)
    txt = torch.randn(b, t, INIT["joint_attention_dim"], generator=g).requires_grad_(True)
    out_dim = INIT["patch_size"] ** 2 * INIT["out_channels"]
    probe = torch.randn(b, img_len, out_dim, generator=g)
    timesteps = torch.tensor(case["timesteps"], dtype=torch.float32)
    mask = None
    if case["txt_lens"] is not None:
        mask = torch.zeros(b, t, dtype=torch.int64)
        for i, n in enumerate(case["txt_lens"]):
            mask[i, :n] = 1

    seen = {}

    def keep(key):
        def hook(_module, _args, kwargs, output):
            seen[key] = (kwargs, output)

        return hook

    hooks = [
        model.time_text_embed.register_forward_hook(keep("temb"), with_kwargs=True),
        model.pos_embed.register_forward_hook(keep("rope"), with_kwargs=True),
        model.transformer_blocks[0].register_forward_hook(keep("block0"), with_kwargs=True),
    ]
    out = model(
        hidden_states=img,
        encoder_hidden_states=txt,
        encoder_hidden_states_mask=mask,
        timestep=timesteps,
        img_shapes=[shapes] * b,
        return_dict=False,
    )[0]
    for h in hooks:
        h.remove()
    (out * probe).sum().backward()

    block0_kwargs, (block0_txt, block0_img) = seen["block0"]
    img_freqs, txt_freqs = seen["rope"][1]
    expected = {
        "temb": seen["temb"][1],
        "rope.img_cos": img_freqs.real,
        "rope.img_sin": img_freqs.imag,
        "rope.txt_cos": txt_freqs.real,
        "rope.txt_sin": txt_freqs.imag,
        "block0.in_img": block0_kwargs["hidden_states"],
        "block0.in_txt": block0_kwargs["encoder_hidden_states"],
        "block0.img": block0_img,
        "block0.txt": block0_txt,
        "out": out,
        "grad.img": img.grad,
        "grad.txt": txt.grad,
    }
    params = dict(model.named_parameters())
    for linear in BLOCK_LINEARS:
        key = f"transformer_blocks.0.{linear}.weight"
        expected[f"grad.{key}"] = params[key].grad
    inputs = {"img": img, "txt": txt, "timesteps": timesteps, "probe": probe}
    if mask is not None:
        inputs["txt_mask"] = mask

    def plain(tensors):
        return {k: v.detach().contiguous().clone() for k, v in tensors.items()}

    folder = OUT / name
    folder.mkdir(parents=True, exist_ok=True)
    save_file(plain(model.state_dict()), folder / "weights.safetensors")
    save_file(plain(inputs), folder / "inputs.safetensors")
    save_file(plain(expected), folder / "expected.safetensors")
    config = {
        "kind": "qwen_image_transformer",
        "source": f"diffusers=={diffusers.__version__}",
        "class": "diffusers.QwenImageTransformer2DModel",
        "init": INIT,
        "call": {
            "batch": b,
            "img_shapes": case["img_shapes"],
            "txt_len": t,
            "txt_lens": case["txt_lens"],
            "timesteps": case["timesteps"],
        },
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
