"""Parity fixtures for Framesmith's LTX-2 / LTX-2.3 transformer (the video stream), made by the official
implementation: `ltx_core.model.transformer.model.LTXModel` of github:Lightricks/LTX-2 (package ltx-core 1.2.0) at
commit 400fd31054597515f47125691032c04b1c3ee24e, with random weights at small shapes, run forward and backward in
float32 on the CPU with one thread.

The model is built as the release is (`LTXModelType.AudioVideo`, so the checkpoint holds the audio stream and the
audio-video cross-attention too) and called as the official trainer's text-to-video strategy calls it without
audio: `model(video=Modality(...), audio=None, perturbations=None)`. With `audio=None` the block skips both
audio-video cross-attentions (`run_a2v` is false) and the audio stream; that is the computation checked here.
Positions are made as the trainer's `_get_video_positions` makes them (patch bounds, pixel coordinates with the
causal fix, time divided by the fps).

Versions (the environment the committed fixtures were made in):
  - ltx-core from the commit above, on PYTHONPATH (`packages/ltx-core/src`), with einops 0.8.x from PyPI.
  - torch 2.15.0 (PyPI wheel, CPU), safetensors 0.8.0, numpy 2.4.6, Python 3.11.7.

Command (from the repository root; writes crates/framesmith-models/tests/fixtures/ltx2/<case>/):
  git clone https://github.com/Lightricks/LTX-2 /tmp/LTX-2 && git -C /tmp/LTX-2 checkout 400fd310
  pip install --target /tmp/ltxdeps einops
  PYTHONPATH=/tmp/LTX-2/packages/ltx-core/src:/tmp/ltxdeps /work/venv-ref/bin/python bench/reference/ltx2.py

Cases: `ltx2_t2v` (LTX-2, 19B's architecture: caption projection in the transformer, no gated attention, no
cross-attention AdaLN) with ltx-core's key names; `ltx23_t2v` (LTX-2.3, 22B's: gated attention, cross-attention
AdaLN with the prompt AdaLN, the caption projection outside the transformer) stored as the released single file is,
keys under `model.diffusion_model.` and the config as the `config` metadata entry. Each case directory holds
config.json (constructor arguments as `init`, the call's shapes as `call`, seeds), weights.safetensors,
inputs.safetensors and expected.safetensors (intermediates, the output and the gradients of the probe loss
`sum(out * probe)` for the latents, the text context and every block-0 linear of the video stream)."""
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from ltx_core.components.patchifiers import VideoLatentPatchifier, get_pixel_coords
from ltx_core.model.transformer.model import LTXModel, LTXModelType
from ltx_core.model.transformer.modality import Modality
from ltx_core.model.transformer.rope import LTXRopeType
from ltx_core.model.transformer.text_projection import PixArtAlphaTextProjection
from ltx_core.types import SpatioTemporalScaleFactors, VideoLatentShape

COMMIT = "400fd31054597515f47125691032c04b1c3ee24e"
OUT = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/ltx2"

HEADS, HEAD_DIM = 2, 8
INNER = HEADS * HEAD_DIM
CAPTION_CHANNELS = 12
BASE = {
    "num_attention_heads": HEADS,
    "attention_head_dim": HEAD_DIM,
    "in_channels": 8,
    "out_channels": 8,
    "num_layers": 2,
    "cross_attention_dim": INNER,
    "norm_eps": 1e-6,
    "positional_embedding_theta": 10000.0,
    "positional_embedding_max_pos": [20, 2048, 2048],
    "timestep_scale_multiplier": 1000,
    "use_middle_indices_grid": True,
    "audio_num_attention_heads": HEADS,
    "audio_attention_head_dim": 4,
    "audio_in_channels": 8,
    "audio_out_channels": 8,
    "audio_cross_attention_dim": 8,
    "audio_positional_embedding_max_pos": [20],
    "av_ca_timestep_scale_multiplier": 1000,
    "rope_type": "split",
    "frequencies_precision": "float64",
}
VARIANTS = {
    "ltx2": {"caption_channels": CAPTION_CHANNELS},
    "ltx23": {
        "apply_gated_attention": True,
        "cross_attention_adaln": True,
        "caption_proj_before_connector": True,
        "caption_projection_first_linear": False,
        "caption_projection_second_linear": False,
        "caption_proj_input_norm": False,
    },
}

# The video stream's linears of a block, as ltx-core names them.
BLOCK_LINEARS = [
    "attn1.to_q",
    "attn1.to_k",
    "attn1.to_v",
    "attn1.to_out.0",
    "attn2.to_q",
    "attn2.to_k",
    "attn2.to_v",
    "attn2.to_out.0",
    "ff.net.0.proj",
    "ff.net.2",
]
GATES = ["attn1.to_gate_logits", "attn2.to_gate_logits"]

CASES = {
    # Two samples at different noise levels; the second has 2 padded text tokens (random values there, so a
    # leaking mask shows). 3 latent frames of 2 x 3 at 24 fps.
    "ltx2_t2v": {
        "variant": "ltx2",
        "batch": 2,
        "frames": 3,
        "height": 2,
        "width": 3,
        "txt_len": 5,
        "txt_lens": [5, 3],
        "sigmas": [0.75, 0.2],
        "fps": 24.0,
        "layout": "ltx_core",
        "seed_weights": 1,
        "seed_inputs": 2,
    },
    "ltx23_t2v": {
        "variant": "ltx23",
        "batch": 2,
        "frames": 2,
        "height": 3,
        "width": 2,
        "txt_len": 4,
        "txt_lens": [4, 2],
        "sigmas": [0.5, 0.9],
        "fps": 25.0,
        "layout": "single_file",
        "seed_weights": 3,
        "seed_inputs": 4,
    },
    # Image-to-video (the trainer's first-frame conditioning): the first sample's first latent frame (its 3 x 2
    # leading tokens) is conditioning, timestep 0 on those tokens; the second sample is not conditioned.
    "ltx23_i2v": {
        "variant": "ltx23",
        "batch": 2,
        "frames": 3,
        "height": 3,
        "width": 2,
        "txt_len": 4,
        "txt_lens": [4, 3],
        "sigmas": [0.6, 0.35],
        "conditioned": [6, 0],
        "fps": 25.0,
        "layout": "single_file",
        "seed_weights": 9,
        "seed_inputs": 10,
    },
}


def transformer_config(variant):
    return {**BASE, **VARIANTS[variant]}


def build(variant):
    """`LTXModelConfigurator.from_metadata`'s construction for the variant's config (the audio-video model)."""
    cfg = transformer_config(variant)
    caption = None
    if not cfg.get("caption_proj_before_connector", False):
        caption = PixArtAlphaTextProjection(in_features=cfg["caption_channels"], hidden_size=INNER)
    return LTXModel(
        model_type=LTXModelType.AudioVideo,
        num_attention_heads=cfg["num_attention_heads"],
        attention_head_dim=cfg["attention_head_dim"],
        in_channels=cfg["in_channels"],
        out_channels=cfg["out_channels"],
        num_layers=cfg["num_layers"],
        cross_attention_dim=cfg["cross_attention_dim"],
        norm_eps=cfg["norm_eps"],
        positional_embedding_theta=cfg["positional_embedding_theta"],
        positional_embedding_max_pos=cfg["positional_embedding_max_pos"],
        timestep_scale_multiplier=cfg["timestep_scale_multiplier"],
        use_middle_indices_grid=cfg["use_middle_indices_grid"],
        audio_num_attention_heads=cfg["audio_num_attention_heads"],
        audio_attention_head_dim=cfg["audio_attention_head_dim"],
        audio_in_channels=cfg["audio_in_channels"],
        audio_out_channels=cfg["audio_out_channels"],
        audio_cross_attention_dim=cfg["audio_cross_attention_dim"],
        audio_positional_embedding_max_pos=cfg["audio_positional_embedding_max_pos"],
        av_ca_timestep_scale_multiplier=cfg["av_ca_timestep_scale_multiplier"],
        rope_type=LTXRopeType(cfg["rope_type"]),
        double_precision_rope=cfg["frequencies_precision"] == "float64",
        apply_gated_attention=cfg.get("apply_gated_attention", False),
        caption_projection=caption,
        cross_attention_adaln=cfg.get("cross_attention_adaln", False),
    )


def randomise(model, seed):
    """Every parameter drawn from a seeded normal: matrices ~ N(0, 1/fan_in), biases ~ N(0, 0.05²), q / k norm
    weights ~ 1 + N(0, 0.1²), scale-shift tables ~ N(0, 0.1²), so no module is the identity or zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            elif "scale_shift_table" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)


def video_positions(case):
    """The official trainer's `_get_video_positions` ([b, 3, tokens, 2], float32)."""
    patchifier = VideoLatentPatchifier(patch_size=1)
    shape = VideoLatentShape(
        frames=case["frames"], height=case["height"], width=case["width"], batch=case["batch"], channels=8
    )
    latent_coords = patchifier.get_patch_grid_bounds(output_shape=shape)
    pixel = get_pixel_coords(latent_coords, SpatioTemporalScaleFactors.default(), causal_fix=True).float()
    pixel[:, 0, ...] = pixel[:, 0, ...] / case["fps"]
    return pixel


def token_timesteps(sigma, tokens, case):
    """The per-token timesteps [b, tokens]: the sample's sigma, and 0 on the leading `conditioned` tokens of each
    sample (the trainer's `_create_per_token_timesteps` for a first-frame conditioning mask)."""
    timesteps = sigma.view(-1, 1).expand(-1, tokens).contiguous()
    mask = torch.zeros(timesteps.shape, dtype=torch.bool)
    for i, n in enumerate(case.get("conditioned", [])):
        mask[i, :n] = True
    return torch.where(mask, torch.zeros_like(timesteps), timesteps)


def make_inputs(case, cfg):
    b, f, h, w = case["batch"], case["frames"], case["height"], case["width"]
    tokens = f * h * w
    g = torch.Generator().manual_seed(case["seed_inputs"])
    latent = torch.randn(b, tokens, cfg["in_channels"], generator=g).requires_grad_(True)
    ctx_dim = cfg.get("caption_channels", INNER) if not cfg.get("caption_proj_before_connector") else INNER
    context = torch.randn(b, case["txt_len"], ctx_dim, generator=g).requires_grad_(True)
    mask = torch.zeros(b, case["txt_len"], dtype=torch.int64)
    for i, n in enumerate(case["txt_lens"]):
        mask[i, :n] = 1
    sigma = torch.tensor(case["sigmas"], dtype=torch.float32)
    return {
        "latent": latent,
        "context": context,
        "context_mask": mask,
        "sigma": sigma,
        "timesteps": token_timesteps(sigma, tokens, case),
        "positions": video_positions(case),
        "probe": torch.randn(b, tokens, cfg["out_channels"], generator=g),
    }


def run_case(name, case):
    torch.manual_seed(0)
    cfg = transformer_config(case["variant"])
    model = build(case["variant"]).float().eval()
    randomise(model, case["seed_weights"])
    x = make_inputs(case, cfg)

    seen = {}

    def keep(key):
        def hook(_module, args, kwargs, output):
            seen[key] = (args, kwargs, output)

        return hook

    hooks = [model.transformer_blocks[0].register_forward_hook(keep("block0"), with_kwargs=True)]
    video = Modality(
        latent=x["latent"],
        sigma=x["sigma"],
        timesteps=x["timesteps"],
        positions=x["positions"],
        context=x["context"],
        context_mask=x["context_mask"],
    )
    out, audio_out = model(video=video, audio=None, perturbations=None)
    for hk in hooks:
        hk.remove()
    assert audio_out is None and torch.isfinite(out).all()
    (out * x["probe"]).sum().backward()

    _, kwargs, (block0_out, _) = seen["block0"]
    args0 = kwargs["video"]
    cos, sin = args0.positional_embeddings
    expected = {
        "timestep": args0.timesteps,
        "embedded_timestep": args0.embedded_timestep,
        "rope.cos": cos,
        "rope.sin": sin,
        "context": args0.context,
        "block0.in": args0.x,
        "block0.out": block0_out.x,
        "out": out,
        "grad.latent": x["latent"].grad,
        "grad.context": x["context"].grad,
    }
    if args0.prompt_timestep is not None:
        expected["prompt_timestep"] = args0.prompt_timestep
    params = dict(model.named_parameters())
    linears = BLOCK_LINEARS + (GATES if cfg.get("apply_gated_attention") else [])
    for linear in linears:
        key = f"transformer_blocks.0.{linear}.weight"
        expected[f"grad.{key}"] = params[key].grad

    def plain(tensors):
        return {k: v.detach().contiguous().clone() for k, v in tensors.items()}

    sd = plain(model.state_dict())
    metadata = None
    if case["layout"] == "single_file":
        sd = {f"model.diffusion_model.{k}": v for k, v in sd.items()}
        metadata = {"config": json.dumps({"transformer": cfg}), "model_version": "2.3.0"}
    folder = OUT / name
    folder.mkdir(parents=True, exist_ok=True)
    save_file(sd, folder / "weights.safetensors", metadata=metadata)
    save_file(plain(x), folder / "inputs.safetensors")
    save_file(plain(expected), folder / "expected.safetensors")
    call = {k: v for k, v in case.items() if not k.startswith("seed")}
    config = {
        "kind": "ltx2_transformer",
        "source": f"github:Lightricks/LTX-2@{COMMIT} (ltx-core 1.2.0)",
        "class": "ltx_core.model.transformer.model.LTXModel",
        "model_type": "AudioVideo",
        "init": cfg,
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
