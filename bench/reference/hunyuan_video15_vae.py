"""Parity fixtures for Framesmith's HunyuanVideo 1.5 VAE, made by the official implementation with random weights at
small shapes, in float32 on the CPU with one thread.

Official code: github:Tencent-Hunyuan/HunyuanVideo-1.5, hyvideo/models/autoencoders/hunyuanvideo_15_vae.py
(`AutoencoderKLConv3D`) at commit 60783e704160023913bee78f0b47036d393d4dfa (2026-04-10). Give its checkout with
HV15_REPO (default: the mirror /work/.mirror/Tencent-Hunyuan+HunyuanVideo-1.5/repo, read with `git show`). Its
only import this needs from the rest of the repository, `hyvideo.commons.parallel_states`, is used by the
multi-GPU tile decode alone and is stubbed (as is `loguru` when absent: imported, never used).

The same weights are also run through diffusers' port (`AutoencoderKLHunyuanVideo15`, diffusers 0.42.1) after
renaming the keys (`to_diffusers` below), and the script stops unless both agree (the untiled encode and decode,
max abs difference ≤ 1e-5): the fixture stands for both.

Versions: torch 2.15.0 (CPU), diffusers 0.42.1, einops 0.8.2, safetensors 0.8.0, Python 3.11.7.

Command (from the repository root; writes crates/framesmith-models/tests/fixtures/hunyuan_video15_vae/<case>/):
  /work/venv-ref/bin/python bench/reference/hunyuan_video15_vae.py

GPU modes (bench/run-hunyuan-video15-vae.sh; HV15_VAE_SOURCE names a copy of the official file when the mirror is
absent):
  --write-released PATH   random weights of the released VAE (official names, bf16), drawn on the GPU
  --bench PATH            the official encode (and decode of its latents) of a WIDTHxHEIGHTxFRAMES clip with the
                          official tiling (--tile, --overlap), bf16, printing `HV15_VAE_TORCH {json}` with the
                          seconds and torch.cuda.max_memory_allocated of each

Cases:
  video:  a 9-frame 64×80 clip, weights in the official release's key names (also ComfyUI's
          `hunyuanvideo15_vae_fp16.safetensors`): the encoder's moments untiled and spatially tiled (tile 64 px,
          overlap 0.25, the official `set_tile_sample_min_size`), the decoder's output untiled and tiled.
  image:  one 32×48 frame (the I2V start image), weights in diffusers' key names: moments and decoded frame.
Each case holds config.json (`kind` hunyuan_video15_vae, constructor arguments `init`, tiling, layout),
weights.safetensors, inputs.safetensors (`video`, `latents`) and expected.safetensors (`moments`,
`moments_tiled`, `decoded`, `decoded_tiled`; the tiled ones only where tiling applies)."""
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import save_file

import diffusers
from diffusers import AutoencoderKLHunyuanVideo15

COMMIT = "60783e704160023913bee78f0b47036d393d4dfa"
OFFICIAL_PATH = "hyvideo/models/autoencoders/hunyuanvideo_15_vae.py"
REPO = Path(os.environ.get("HV15_REPO", "/work/.mirror/Tencent-Hunyuan+HunyuanVideo-1.5/repo"))
OUT = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/hunyuan_video15_vae"

# The released VAE is (128, 256, 512, 1024, 1024), latent 32, 16× spatial, 4× temporal; the fixture keeps the
# five levels and both factors with narrow widths.
INIT = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 4,
    "block_out_channels": [4, 8, 8, 8, 8],
    "layers_per_block": 2,
    "ffactor_spatial": 16,
    "ffactor_temporal": 4,
    "sample_size": 64,
    "sample_tsize": 64,
    "scaling_factor": 1.03682,
    "downsample_match_channel": True,
    "upsample_match_channel": True,
}
TILE = {"sample_size": 64, "overlap": 0.25}

CASES = {
    "video": {"frames": 9, "height": 64, "width": 80, "layout": "official", "tiled": True, "seed": 11},
    "image": {"frames": 1, "height": 32, "width": 48, "layout": "diffusers", "tiled": False, "seed": 12},
}


def load_official():
    if os.environ.get("HV15_VAE_SOURCE"):
        source = Path(os.environ["HV15_VAE_SOURCE"]).read_text()
    else:
        source = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{COMMIT}:{OFFICIAL_PATH}"], check=True, capture_output=True, text=True
        ).stdout
    # `loguru` is imported and never used by the file; a stand-in spares the device a wheel.
    for name in ("hyvideo", "hyvideo.commons", "loguru"):
        if name != "loguru" or importlib.util.find_spec(name) is None:
            sys.modules.setdefault(name, types.ModuleType(name))
    stub = types.ModuleType("hyvideo.commons.parallel_states")
    stub.get_parallel_state = lambda: None
    sys.modules["hyvideo.commons.parallel_states"] = stub
    spec = importlib.util.spec_from_loader("hunyuanvideo_15_vae", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, OFFICIAL_PATH, "exec"), module.__dict__)
    return module


def randomise(model, seed):
    """Conv weights ~ N(0, 1/fan_in), biases ~ N(0, 0.05²), RMS gammas ~ 1 + N(0, 0.1²)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith(".gamma"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)


def to_diffusers(sd):
    """The official key names in diffusers' (`AutoencoderKLHunyuanVideo15`)."""
    out = {}
    for key, value in sd.items():
        k = key
        for side, blocks, blocks_to, sampler, sampler_to in (
            ("encoder", "down", "down_blocks", "downsample", "downsamplers.0"),
            ("decoder", "up", "up_blocks", "upsample", "upsamplers.0"),
        ):
            if k.startswith(f"{side}.{blocks}."):
                parts = k.split(".")
                parts[1] = blocks_to
                if parts[3] == "block":
                    parts[3] = "resnets"
                elif parts[3] == sampler:
                    parts[3] = sampler_to
                k = ".".join(parts)
            k = k.replace(f"{side}.mid.block_1.", f"{side}.mid_block.resnets.0.")
            k = k.replace(f"{side}.mid.block_2.", f"{side}.mid_block.resnets.1.")
            for a, b in (("norm", "norm"), ("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("proj_out", "proj_out")):
                k = k.replace(f"{side}.mid.attn_1.{a}.", f"{side}.mid_block.attentions.0.{b}.")
        out[k.replace(".nin_shortcut.", ".conv_shortcut.")] = value
    return out


def diffusers_model(sd):
    model = AutoencoderKLHunyuanVideo15(
        in_channels=INIT["in_channels"],
        out_channels=INIT["out_channels"],
        latent_channels=INIT["latent_channels"],
        block_out_channels=tuple(INIT["block_out_channels"]),
        layers_per_block=INIT["layers_per_block"],
        spatial_compression_ratio=INIT["ffactor_spatial"],
        temporal_compression_ratio=INIT["ffactor_temporal"],
    )
    model.load_state_dict(to_diffusers(sd), strict=True)
    return model.eval()


def run_case(official, name, case):
    model = official.AutoencoderKLConv3D(**INIT).eval()
    randomise(model, case["seed"])
    g = torch.Generator().manual_seed(case["seed"] + 100)
    f, h, w = case["frames"], case["height"], case["width"]
    video = torch.rand(1, 3, f, h, w, generator=g) * 2.0 - 1.0
    lf, lh, lw = (f - 1) // 4 + 1, h // 16, w // 16
    latents = torch.randn(1, INIT["latent_channels"], lf, lh, lw, generator=g)
    with torch.no_grad():
        moments = model.encoder(video)
        decoded = model.decoder(latents)
        expected = {"moments": moments, "decoded": decoded}
        if case["tiled"]:
            model.set_tile_sample_min_size(TILE["sample_size"], TILE["overlap"])
            model.enable_spatial_tiling()
            expected["moments_tiled"] = model.encode(video).latent_dist.parameters
            expected["decoded_tiled"] = model.decode(latents).sample
        sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
        ref = diffusers_model(sd)
        d_moments = ref.encoder(video)
        d_decoded = ref.decoder(latents)
    agree = max((d_moments - moments).abs().max().item(), (d_decoded - decoded).abs().max().item())
    if agree > 1e-5:
        raise SystemExit(f"{name}: diffusers and the official VAE disagree by {agree}")
    if case["layout"] == "diffusers":
        sd = to_diffusers(sd)
    folder = OUT / name
    folder.mkdir(parents=True, exist_ok=True)
    save_file(sd, folder / "weights.safetensors")
    save_file({"video": video, "latents": latents}, folder / "inputs.safetensors")
    save_file({k: v.contiguous() for k, v in expected.items()}, folder / "expected.safetensors")
    config = {
        "kind": "hunyuan_video15_vae",
        "source": f"github:Tencent-Hunyuan/HunyuanVideo-1.5@{COMMIT}:{OFFICIAL_PATH}",
        "class": "AutoencoderKLConv3D",
        "diffusers_agrees": {"version": diffusers.__version__, "max_abs": agree},
        "init": INIT,
        "tile": TILE if case["tiled"] else None,
        "layout": case["layout"],
        "call": {k: case[k] for k in ("frames", "height", "width")},
        "seed": case["seed"],
        "torch": torch.__version__,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shapes = {k: tuple(v.shape) for k, v in expected.items()}
    print(f"{name}: {shapes}, diffusers agrees to {agree:.2e} -> {folder}")


RELEASED = {**INIT, "latent_channels": 32, "block_out_channels": [128, 256, 512, 1024, 1024], "sample_size": 256}


def write_released(path):
    official = load_official()
    with torch.device("cuda"):
        model = official.AutoencoderKLConv3D(**RELEASED)
    randomise(model, 0)
    sd = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(sd, path)
    print(f"wrote {path}: {sum(v.numel() for v in sd.values())} parameters")


def bench(args):
    from safetensors.torch import load_file
    import time

    official = load_official()
    model = official.AutoencoderKLConv3D(**RELEASED)
    model.load_state_dict(load_file(args.bench), strict=True)
    model = model.to("cuda", torch.bfloat16).eval()
    model.set_tile_sample_min_size(args.tile, args.overlap)
    model.enable_spatial_tiling()
    video = torch.rand(1, 3, args.frames, args.height, args.width, device="cuda", dtype=torch.bfloat16) * 2 - 1
    out = {"frames": args.frames, "height": args.height, "width": args.width, "tile": args.tile}
    with torch.no_grad():
        for name, run in (("encode", lambda: model.encode(video).latent_dist.mode()), ("decode", None)):
            if name == "decode":
                run = lambda: model.decode(latents).sample  # noqa: E731
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            result = run()
            torch.cuda.synchronize()
            out[f"{name}_secs"] = round(time.perf_counter() - start, 3)
            out[f"{name}_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
            if name == "encode":
                latents = result
                out["latents"] = list(latents.shape)
    print("HV15_VAE_TORCH " + json.dumps(out), flush=True)


def main():
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--write-released")
    parser.add_argument("--bench")
    parser.add_argument("--frames", type=int, default=121)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=848)
    parser.add_argument("--tile", type=int, default=256)
    parser.add_argument("--overlap", type=float, default=0.125)
    args = parser.parse_args()
    if args.write_released:
        write_released(args.write_released)
        return 0
    if args.bench:
        bench(args)
        return 0
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    official = load_official()
    for name, case in CASES.items():
        run_case(official, name, case)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"{total} bytes in {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
