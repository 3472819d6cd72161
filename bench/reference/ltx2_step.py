"""PyTorch reference for LTX-2 / LTX-2.3 text-to-video LoRA training: a training step of the official transformer,
`ltx_core.model.transformer.model.LTXModel` of github:Lightricks/LTX-2 (package ltx-core 1.2.0) at commit
400fd31054597515f47125691032c04b1c3ee24e (the commit bench/reference/ltx2.py's fixtures come from), built as the
video-only model (`LTXModelType.VideoOnly`: the video stream the text-to-video step runs when no audio is given)
from the `config` metadata of a single file in the official layout (`model.diffusion_model.` names: the file
`framesmith-bench synth-project --model ltx2` writes, or a release), its weights read from that file. bf16
autocast over frozen bf16 base weights, ltx-core's own attention, its per-block activation checkpointing
(`set_gradient_checkpointing(True)`), LoRA (f32 factors, down Kaiming-uniform, up zero) on `to_q`, `to_k`, `to_v`
and `to_out.0` of both attentions of every block (the official trainer's targets, Framesmith's default),
flow-matching MSE loss in f32 as the official trainer's text-to-video strategy computes it (noisy
`(1 − σ)·x + σ·noise`, target `noise − x`, positions of its `_get_video_positions` at 24 fps), AdamW (and gradient
clipping at 1.0) on the LoRA parameters.

The inputs are an `_ltx2` latent cache ([128, F, H/32, W/32]) and `_ltx2_te` text cache (`video_prompt_embeds`
[L, 4096], the connector's output, and its mask) of musubi-tuner's LTX-2 branch, as Framesmith reads them, or random
ones of --frames x --height x --width and --text-tokens.

Prints each step's time, then `LTX2_STEP {json}` (mean and median ms of the timed steps after the warm-up,
torch.cuda.max_memory_allocated and max_memory_reserved over the whole run, weights included) and a `BENCH` line in
the format of bench/reference/common.py. Needs ltx-core and einops importable (carry their wheels to the GPU
machine: `/work/venv-ref/bin/python -m pip wheel --no-deps -w wheels <LTX-2 checkout>/packages/ltx-core einops`)
and safetensors."""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from safetensors import safe_open

from common import LoRALinear, adamw, add_step_args, cache_tensor, optimizer_step, report_train_step, time_train_steps

PREFIX = "model.diffusion_model."
FPS = 24.0
TARGETS = ("to_q", "to_k", "to_v", "to_out.0")


def read_file(path):
    """The transformer config (the `transformer` section of the `config` metadata) and the video stream's
    weights under ltx-core's names (bf16, CPU)."""
    with safe_open(path, framework="pt", device="cpu") as f:
        meta = f.metadata() or {}
        if "config" not in meta:
            sys.exit(f"{path} carries no `config` metadata: use the official single file")
        cfg = json.loads(meta["config"])["transformer"]
        sd = {}
        for k in f.keys():
            name = k[len(PREFIX):] if k.startswith(PREFIX) else k
            if name.startswith(("audio_", "av_ca_")) or ".audio_" in name or "_to_video_" in name \
                    or "video_to_audio" in name or name.startswith(("vae.", "vocoder.", "text_embedding")):
                continue
            if name.startswith(("video_embeddings_connector", "audio_embeddings_connector")):
                continue
            sd[name] = f.get_tensor(k).to(torch.bfloat16)
    return cfg, sd


def build(cfg):
    """The video-only `LTXModel` of `cfg`, on the meta device (ltx-core's defaults for absent keys)."""
    from ltx_core.model.transformer.model import LTXModel, LTXModelType
    from ltx_core.model.transformer.rope import LTXRopeType
    from ltx_core.model.transformer.text_projection import PixArtAlphaTextProjection

    g = cfg.get
    heads, head_dim = g("num_attention_heads", 32), g("attention_head_dim", 128)
    caption = None
    if not g("caption_proj_before_connector", False):
        caption = PixArtAlphaTextProjection(in_features=g("caption_channels") or 3840, hidden_size=heads * head_dim)
    return LTXModel(
        model_type=LTXModelType.VideoOnly,
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        in_channels=g("in_channels", 128),
        out_channels=g("out_channels", 128),
        num_layers=g("num_layers", 48),
        cross_attention_dim=g("cross_attention_dim", 4096),
        norm_eps=g("norm_eps", 1e-6),
        positional_embedding_theta=g("positional_embedding_theta", 10000.0),
        positional_embedding_max_pos=g("positional_embedding_max_pos", [20, 2048, 2048]),
        timestep_scale_multiplier=g("timestep_scale_multiplier", 1000),
        use_middle_indices_grid=g("use_middle_indices_grid", True),
        audio_num_attention_heads=g("audio_num_attention_heads", 32),
        audio_attention_head_dim=g("audio_attention_head_dim", 64),
        audio_in_channels=g("audio_in_channels", 128),
        audio_out_channels=g("audio_out_channels", 128),
        audio_cross_attention_dim=g("audio_cross_attention_dim", 2048),
        audio_positional_embedding_max_pos=g("audio_positional_embedding_max_pos", [20]),
        av_ca_timestep_scale_multiplier=g("av_ca_timestep_scale_multiplier", 1000),
        rope_type=LTXRopeType(g("rope_type", "split")),
        double_precision_rope=g("frequencies_precision") == "float64",
        apply_gated_attention=g("apply_gated_attention", False),
        caption_projection=caption,
        cross_attention_adaln=g("cross_attention_adaln", False),
    )


def add_lora(model, rank, alpha):
    """Wraps q, k, v and out of `attn1` and `attn2` of every block (8 each); returns the LoRA parameters."""
    params = []
    for block in model.transformer_blocks:
        for attn in (block.attn1, block.attn2):
            for target in TARGETS:
                parent, leaf = (attn.to_out, 0) if target == "to_out.0" else (attn, target)
                base = parent[leaf] if leaf == 0 else getattr(parent, leaf)
                wrapped = LoRALinear(base, rank, alpha)
                if leaf == 0:
                    parent[0] = wrapped
                else:
                    setattr(parent, leaf, wrapped)
                params += [wrapped.down, wrapped.up]
    return params


def positions(frames, height, width, dev):
    """The official trainer's `_get_video_positions` ([1, 3, tokens, 2], float32) at 24 fps."""
    from ltx_core.components.patchifiers import VideoLatentPatchifier, get_pixel_coords
    from ltx_core.types import SpatioTemporalScaleFactors, VideoLatentShape

    shape = VideoLatentShape(frames=frames, height=height, width=width, batch=1, channels=128)
    coords = VideoLatentPatchifier(patch_size=1).get_patch_grid_bounds(output_shape=shape, device=dev)
    pixel = get_pixel_coords(coords, SpatioTemporalScaleFactors.default(), causal_fix=True).float()
    pixel[:, 0, ...] = pixel[:, 0, ...] / FPS
    return pixel


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dit", required=True, help="LTX-2 single-file .safetensors (official names, config metadata)")
    p.add_argument("--latent-cache", help="a *_ltx2.safetensors latent cache (else random latents)")
    p.add_argument("--text-cache", help="a *_ltx2_te.safetensors text cache (else random features)")
    p.add_argument("--frames", type=int, default=121)
    p.add_argument("--height", type=int, default=512)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--text-tokens", type=int, default=1024)
    add_step_args(p, rank=32, iters=6)
    p.add_argument("--device", default="cuda")
    return p.parse_args()


def inputs(a, cfg, dev):
    """Latents [1, 128, F, H, W] and the connector's output [1, L, D] with its mask."""
    if a.latent_cache:
        latent = cache_tensor(a.latent_cache, "latents_", dev).unsqueeze(0)
    else:
        f = (a.frames - 1) // 8 + 1
        latent = torch.randn(1, cfg.get("in_channels", 128), f, a.height // 32, a.width // 32, device=dev)
    if a.text_cache:
        context = cache_tensor(a.text_cache, "video_prompt_embeds_", dev).unsqueeze(0)
    else:
        context = torch.randn(1, a.text_tokens, cfg.get("cross_attention_dim", 4096), device=dev)
    # After the connector every token is valid (its learnable registers replace the padding).
    mask = torch.ones(1, context.shape[1], device=dev, dtype=torch.long)
    return latent, context, mask


def main():
    a = parse()
    from ltx_core.model.transformer.modality import Modality

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    t0 = time.perf_counter()
    cfg, sd = read_file(a.dit)
    with torch.device("meta"):
        model = build(cfg)
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    if missing or unexpected:
        sys.exit(f"the file does not make the video-only model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    del sd
    model.to(dev)
    model.requires_grad_(False)
    if not a.no_checkpointing:
        model.set_gradient_checkpointing(True)
    params = add_lora(model, a.rank, a.alpha if a.alpha is not None else float(a.rank))
    model.train()
    load_secs = time.perf_counter() - t0
    latent, context, mask = inputs(a, cfg, dev)
    _, c, f, h, w = latent.shape
    x = latent.permute(0, 2, 3, 4, 1).reshape(1, f * h * w, c)
    noise = torch.randn_like(x)
    noisy = ((1 - a.sigma) * x + a.sigma * noise).to(torch.bfloat16)
    target = noise - x
    sigma = torch.tensor([a.sigma], device=dev)
    video = Modality(
        enabled=True,
        latent=noisy,
        sigma=sigma,
        timesteps=sigma.view(1, 1).expand(1, f * h * w),
        positions=positions(f, h, w, dev),
        context=context.to(torch.bfloat16),
        context_mask=mask,
    )
    opt = adamw(params, a.lr)
    losses = []

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            pred, _ = model(video=video, audio=None, perturbations=None)
        loss = F.mse_loss(pred.float(), target)
        optimizer_step(loss, params, opt, losses)

    timing = time_train_steps(step, losses, a.warmup, a.iters, cuda)
    tokens, txt_len = f * h * w, context.shape[1]
    fields = {
        "blocks": len(model.transformer_blocks),
        "clip": [w * 32, h * 32, (f - 1) * 8 + 1],
        "img_tokens": tokens,
        "txt_tokens": txt_len,
        "rank": a.rank,
        "lora_modules": len(params) // 2,
        "lora_parameters": sum(q.numel() for q in params),
        "checkpointing": not a.no_checkpointing,
    }
    dim = cfg.get("num_attention_heads", 32) * cfg.get("attention_head_dim", 128)
    per_block = 2 * tokens * 12 * dim * dim + 4 * tokens * tokens * dim + 4 * tokens * txt_len * dim
    flops = (3.0 if a.no_checkpointing else 4.0) * len(model.transformer_blocks) * per_block
    shape = f"b=1 {w * 32}x{h * 32}x{(f - 1) * 8 + 1} img={tokens} txt={txt_len} r={a.rank}"
    last = {"load_secs": load_secs, "loss": losses[-1].item()}
    bench = ("ltx2-step", "ltx2.3 bf16", "lora step", shape, flops)
    report_train_step("LTX2_STEP", cuda, fields, timing, last, bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
