"""Parity fixtures for Framesmith's LTX-2 / LTX-2.3 transformer with both streams (audio and video, the joint
audio-video blocks), made by the official implementation: `ltx_core.model.transformer.model.LTXModel` of
github:Lightricks/LTX-2 (package ltx-core 1.2.0) at commit 400fd31054597515f47125691032c04b1c3ee24e, with random
weights at small shapes, run forward and backward in float32 on the CPU with one thread.

The model is built as `LTXModelConfigurator.from_metadata` builds the release (`LTXModelType.AudioVideo`, LTX-2's
audio caption projection beside the video one) and called as the official trainer's text-to-video strategy calls
it with `with_audio: true`: `model(video=Modality(...), audio=Modality(...), perturbations=None)`, both modalities
at the same sigma (audio timesteps are the sampled sigma on every token), the text mask shared. Video positions
are the trainer's `_get_video_positions`, audio positions its `_get_audio_positions` (the audio patchifier's
`get_patch_grid_bounds`: latent frames to seconds, 16 kHz, hop 160, 4x downsampling, causal).

Versions and command: as bench/reference/ltx2.py (this script imports its model construction helpers):
  PYTHONPATH=/tmp/LTX-2/packages/ltx-core/src:/tmp/ltxdeps /work/venv-ref/bin/python bench/reference/ltx2_av.py
It writes crates/framesmith-models/tests/fixtures/ltx2/<case>/ for the cases `ltx2_av` (LTX-2's switches, ltx-core
names) and `ltx23_av` (LTX-2.3's, stored as the released single file). Each holds config.json, weights.safetensors,
inputs.safetensors and expected.safetensors: both streams' AdaLN rows, the audio-video cross-attention AdaLN rows,
the RoPE tables (each stream's own and the cross-modal ones), the projected texts, the first block's inputs and
outputs, both velocities, and the gradients of the probe loss `sum(out * probe) + sum(audio_out * audio_probe)`
for both latents, both texts and every block-0 linear of the audio stream and of the two audio-video
cross-attentions (and the video stream's)."""
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ltx2 import (  # noqa: E402
    BLOCK_LINEARS,
    COMMIT,
    GATES,
    INNER,
    randomise,
    token_timesteps,
    transformer_config,
    video_positions,
)

from ltx_core.components.patchifiers import AudioPatchifier  # noqa: E402
from ltx_core.model.transformer.model import LTXModel, LTXModelType  # noqa: E402
from ltx_core.model.transformer.modality import Modality  # noqa: E402
from ltx_core.model.transformer.rope import LTXRopeType  # noqa: E402
from ltx_core.model.transformer.text_projection import PixArtAlphaTextProjection  # noqa: E402
from ltx_core.types import AudioLatentShape  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/ltx2"

AUDIO_LINEARS = [f"audio_{name}" for name in BLOCK_LINEARS]
AUDIO_GATES = [f"audio_{name}" for name in GATES]
AV_LINEARS = [
    f"{attn}.{proj}"
    for attn in ["audio_to_video_attn", "video_to_audio_attn"]
    for proj in ["to_q", "to_k", "to_v", "to_out.0"]
]
AV_GATES = ["audio_to_video_attn.to_gate_logits", "video_to_audio_attn.to_gate_logits"]

CASES = {
    # Two samples at different noise levels, the second with 2 padded text tokens; 3 latent frames of 2 x 3 at
    # 24 fps and 5 audio latent frames.
    "ltx2_av": {
        "variant": "ltx2",
        "batch": 2,
        "frames": 3,
        "height": 2,
        "width": 3,
        "audio_frames": 5,
        "txt_len": 5,
        "txt_lens": [5, 3],
        "sigmas": [0.75, 0.2],
        "fps": 24.0,
        "layout": "ltx_core",
        "seed_weights": 5,
        "seed_inputs": 6,
    },
    "ltx23_av": {
        "variant": "ltx23",
        "batch": 2,
        "frames": 2,
        "height": 3,
        "width": 2,
        "audio_frames": 7,
        "txt_len": 4,
        "txt_lens": [4, 2],
        "sigmas": [0.5, 0.9],
        "fps": 25.0,
        "layout": "single_file",
        "seed_weights": 7,
        "seed_inputs": 8,
    },
    # Image-to-video with audio: the second sample's first latent frame (2 x 3 tokens) is conditioning (timestep
    # 0 there, its audio at sigma on every frame, as the trainer's `_prepare_audio_inputs` makes it); the first
    # sample is not conditioned.
    "ltx2_av_i2v": {
        "variant": "ltx2",
        "batch": 2,
        "frames": 3,
        "height": 2,
        "width": 3,
        "audio_frames": 4,
        "txt_len": 5,
        "txt_lens": [4, 5],
        "sigmas": [0.45, 0.8],
        "conditioned": [0, 6],
        "fps": 24.0,
        "layout": "ltx_core",
        "seed_weights": 11,
        "seed_inputs": 12,
    },
}


def audio_inner(cfg):
    return cfg["audio_num_attention_heads"] * cfg["audio_attention_head_dim"]


def build(variant):
    """`LTXModelConfigurator.from_metadata`'s construction (both caption projections for LTX-2)."""
    cfg = transformer_config(variant)
    caption = audio_caption = None
    if not cfg.get("caption_proj_before_connector", False):
        caption = PixArtAlphaTextProjection(in_features=cfg["caption_channels"], hidden_size=INNER)
        audio_caption = PixArtAlphaTextProjection(in_features=cfg["caption_channels"], hidden_size=audio_inner(cfg))
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
        audio_caption_projection=audio_caption,
        cross_attention_adaln=cfg.get("cross_attention_adaln", False),
    )


def audio_positions(case):
    """The official trainer's `_get_audio_positions` ([b, 1, frames, 2], seconds)."""
    patchifier = AudioPatchifier(patch_size=1)
    shape = AudioLatentShape(frames=case["audio_frames"], mel_bins=16, batch=case["batch"], channels=8)
    return patchifier.get_patch_grid_bounds(output_shape=shape, device=torch.device("cpu")).float()


def make_inputs(case, cfg):
    b, f, h, w = case["batch"], case["frames"], case["height"], case["width"]
    tokens, audio_tokens = f * h * w, case["audio_frames"]
    g = torch.Generator().manual_seed(case["seed_inputs"])
    latent = torch.randn(b, tokens, cfg["in_channels"], generator=g).requires_grad_(True)
    audio_latent = torch.randn(b, audio_tokens, cfg["audio_in_channels"], generator=g).requires_grad_(True)
    projected = not cfg.get("caption_proj_before_connector")
    ctx_dim = cfg["caption_channels"] if projected else INNER
    audio_ctx_dim = cfg["caption_channels"] if projected else audio_inner(cfg)
    context = torch.randn(b, case["txt_len"], ctx_dim, generator=g).requires_grad_(True)
    audio_context = torch.randn(b, case["txt_len"], audio_ctx_dim, generator=g).requires_grad_(True)
    mask = torch.zeros(b, case["txt_len"], dtype=torch.int64)
    for i, n in enumerate(case["txt_lens"]):
        mask[i, :n] = 1
    sigma = torch.tensor(case["sigmas"], dtype=torch.float32)
    return {
        "latent": latent,
        "audio_latent": audio_latent,
        "context": context,
        "audio_context": audio_context,
        "context_mask": mask,
        "sigma": sigma,
        "timesteps": token_timesteps(sigma, tokens, case),
        "audio_timesteps": sigma.view(-1, 1).expand(-1, audio_tokens).contiguous(),
        "positions": video_positions(case),
        "audio_positions": audio_positions(case),
        "probe": torch.randn(b, tokens, cfg["out_channels"], generator=g),
        "audio_probe": torch.randn(b, audio_tokens, cfg["audio_out_channels"], generator=g),
    }


def stream_expected(prefix, args, block_out):
    cos, sin = args.positional_embeddings
    ccos, csin = args.cross_positional_embeddings
    out = {
        f"{prefix}timestep": args.timesteps,
        f"{prefix}embedded_timestep": args.embedded_timestep,
        f"{prefix}rope.cos": cos,
        f"{prefix}rope.sin": sin,
        f"{prefix}cross_rope.cos": ccos,
        f"{prefix}cross_rope.sin": csin,
        f"{prefix}cross_scale_shift_timestep": args.cross_scale_shift_timestep,
        f"{prefix}cross_gate_timestep": args.cross_gate_timestep,
        f"{prefix}context": args.context,
        f"{prefix}block0.in": args.x,
        f"{prefix}block0.out": block_out.x,
    }
    if args.prompt_timestep is not None:
        out[f"{prefix}prompt_timestep"] = args.prompt_timestep
    return out


def run_case(name, case):
    torch.manual_seed(0)
    cfg = transformer_config(case["variant"])
    model = build(case["variant"]).float().eval()
    randomise(model, case["seed_weights"])
    x = make_inputs(case, cfg)

    seen = {}

    def hook(_module, _args, kwargs, output):
        seen["block0"] = (kwargs, output)

    handle = model.transformer_blocks[0].register_forward_hook(hook, with_kwargs=True)
    video = Modality(
        latent=x["latent"],
        sigma=x["sigma"],
        timesteps=x["timesteps"],
        positions=x["positions"],
        context=x["context"],
        context_mask=x["context_mask"],
    )
    audio = Modality(
        latent=x["audio_latent"],
        sigma=x["sigma"],
        timesteps=x["audio_timesteps"],
        positions=x["audio_positions"],
        context=x["audio_context"],
        context_mask=x["context_mask"],
    )
    out, audio_out = model(video=video, audio=audio, perturbations=None)
    handle.remove()
    assert torch.isfinite(out).all() and torch.isfinite(audio_out).all()
    ((out * x["probe"]).sum() + (audio_out * x["audio_probe"]).sum()).backward()

    kwargs, (video_block0, audio_block0) = seen["block0"]
    expected = {
        **stream_expected("", kwargs["video"], video_block0),
        **stream_expected("audio.", kwargs["audio"], audio_block0),
        "out": out,
        "audio.out": audio_out,
        "grad.latent": x["latent"].grad,
        "grad.audio_latent": x["audio_latent"].grad,
        "grad.context": x["context"].grad,
        "grad.audio_context": x["audio_context"].grad,
    }
    params = dict(model.named_parameters())
    linears = BLOCK_LINEARS + AUDIO_LINEARS + AV_LINEARS
    if cfg.get("apply_gated_attention"):
        linears += GATES + AUDIO_GATES + AV_GATES
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
    print(
        f"{name}: out {tuple(out.shape)}, audio {tuple(audio_out.shape)}, "
        f"|out| max {out.abs().max().item():.3f}, |audio| max {audio_out.abs().max().item():.3f} -> {folder}"
    )


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for name, case in CASES.items():
        run_case(name, case)
    total = sum(f.stat().st_size for name in CASES for f in (OUT / name).rglob("*") if f.is_file())
    print(f"{total} bytes in {', '.join(CASES)}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    sys.exit(main())
