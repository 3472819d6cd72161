"""Parity fixtures for Framesmith's LTX-2 / LTX-2.3 video VAE, made by the official implementation: ltx-core's
`VideoEncoder` and `ConvVideoDecoder` (built by `VideoEncoderConfigurator` / `VideoDecoderConfigurator` from a
checkpoint's `config` metadata, as the official pipelines and trainer build them) of github:Lightricks/LTX-2
(package ltx-core 1.2.0) at commit 400fd31054597515f47125691032c04b1c3ee24e, with random weights at small shapes,
run in float32 on the CPU with one thread.

Each case is stored as the released single file stores its VAE: keys under `vae.` (`vae.encoder.*`,
`vae.decoder.*`, the shared `vae.per_channel_statistics.*`) and the model config as the `config` metadata entry
(its `vae` section). The calls are the official ones: `VideoEncoder.forward` (pixels in [-1, 1] to latents
normalised by the per-channel statistics), `VideoEncoder.tiled_encode`, `ConvVideoDecoder.forward` and
`ConvVideoDecoder.tiled_decode` (its chunks joined), with `TileSizeConfig` layouts.

Versions (the environment the committed fixtures were made in):
  - ltx-core from the commit above, on PYTHONPATH (`packages/ltx-core/src`), with einops 0.8.x.
  - torch 2.15.0 (CPU), safetensors 0.8.0, numpy 2.4.6, Python 3.11.7.

Command (from the repository root; writes crates/framesmith-models/tests/fixtures/ltx2/vae_<case>/):
  git clone https://github.com/Lightricks/LTX-2 /tmp/LTX-2 && git -C /tmp/LTX-2 checkout 400fd310
  PYTHONPATH=/tmp/LTX-2/packages/ltx-core/src /work/venv-ref/bin/python bench/reference/ltx2_vae.py

Device use (bench/run-ltx2-vae.sh): `--write-released PATH` writes a VAE of LTX-2.3's released architecture
(`RELEASED`, the `vae` section of the 22B checkpoint's `config` metadata: 128 latent channels, 32x / 8x) with
random bf16 weights, stored as the single file stores it; `--bench PATH` times the official encode and tiled
decode of a random clip with it on the GPU (bf16) and prints one `LTX2_VAE_TORCH` JSON line with the milliseconds
and the peak memory.

Cases:
  - `ltx2`: LTX-2's switches: `*_res` encoder blocks, residual `compress_all` decoder blocks, no timestep
    conditioning, symmetric (non-causal) decoder, zero padding in the encoder and the decoder's default reflect
    padding. Tiled encode and decode along time and height (width untiled), and a one-frame image.
  - `ltx23`: a timestep-conditioned decoder (`time_embedder` per `res_x`, `last_time_embedder`,
    `timestep_scale_multiplier`, the decode noise at the official 0.025 and decode timestep 0.05; the noise the
    official call draws is drawn again from the same generator state and stored as an input), plain
    `compress_space` / `compress_time` upsamplers, a `res_x_y` (width-changing) block, reflect padding on both
    sides and a causal decoder.
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from ltx_core.model.video_vae import TileSizeConfig, DimensionSizeConfig
from ltx_core.model.video_vae.model_configurator import VideoDecoderConfigurator, VideoEncoderConfigurator

COMMIT = "400fd31054597515f47125691032c04b1c3ee24e"
OUT = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/ltx2"

CASES = {
    "ltx2": {
        "seed": 21,
        "vae": {
            "_class_name": "CausalVideoAutoencoder",
            "dims": 3,
            "in_channels": 3,
            "out_channels": 3,
            "latent_channels": 4,
            "patch_size": 2,
            "norm_layer": "pixel_norm",
            "latent_log_var": "uniform",
            "encoder_spatial_padding_mode": "zeros",
            "causal_decoder": False,
            "timestep_conditioning": False,
            "decoder_base_channels": 4,
            "encoder_blocks": [
                ["res_x", {"num_layers": 1}],
                ["compress_space_res", {"multiplier": 2}],
                ["res_x", {"num_layers": 1}],
                ["compress_time_res", {"multiplier": 2}],
                ["compress_all_res", {"multiplier": 1}],
                ["res_x", {"num_layers": 1}],
            ],
            "decoder_blocks": [
                ["res_x", {"num_layers": 1, "inject_noise": False}],
                ["compress_all", {"residual": True, "multiplier": 2}],
                ["res_x", {"num_layers": 1, "inject_noise": False}],
                ["compress_all", {"residual": True, "multiplier": 2}],
                ["res_x", {"num_layers": 1, "inject_noise": False}],
            ],
        },
        # frames 4k + 1, height and width multiples of 8 (the case's factors: time 4, space 8).
        "video": (25, 96, 16),
        "encode_tiles": {"frames": (24, 16), "height": (80, 64)},
        "decode_tiles": {"frames": (16, 8), "height": (48, 16)},
        "image": (1, 24, 16),
    },
    "ltx23": {
        "seed": 23,
        "vae": {
            "_class_name": "CausalVideoAutoencoder",
            "dims": 3,
            "in_channels": 3,
            "out_channels": 3,
            "latent_channels": 4,
            "patch_size": 2,
            "norm_layer": "pixel_norm",
            "latent_log_var": "uniform",
            "spatial_padding_mode": "reflect",
            "causal_decoder": True,
            "timestep_conditioning": True,
            "decoder_base_channels": 4,
            "encoder_blocks": [
                ["res_x", {"num_layers": 1}],
                ["compress_all_res", {"multiplier": 2}],
                ["res_x_y", {"multiplier": 2}],
                ["compress_time_res", {"multiplier": 1}],
                ["res_x", {"num_layers": 2}],
            ],
            "decoder_blocks": [
                ["res_x", {"num_layers": 1}],
                ["compress_space", {"multiplier": 2}],
                ["compress_time", {"multiplier": 1}],
                ["res_x_y", {"multiplier": 2}],
                ["compress_time", {"multiplier": 1}],
                ["res_x", {"num_layers": 2}],
            ],
        },
        "video": (9, 16, 24),
    },
}


# The `vae` section of LTX-2.3 (22B)'s `config` metadata: its encoder, and a decoder of plain upsamplers, no
# timestep conditioning, zero padding on both sides.
RELEASED = {
    "_class_name": "CausalVideoAutoencoder",
    "dims": 3,
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 128,
    "encoder_blocks": [
        ["res_x", {"num_layers": 4}],
        ["compress_space_res", {"multiplier": 2}],
        ["res_x", {"num_layers": 6}],
        ["compress_time_res", {"multiplier": 2}],
        ["res_x", {"num_layers": 4}],
        ["compress_all_res", {"multiplier": 2}],
        ["res_x", {"num_layers": 2}],
        ["compress_all_res", {"multiplier": 1}],
        ["res_x", {"num_layers": 2}],
    ],
    "decoder_blocks": [
        ["res_x", {"num_layers": 4}],
        ["compress_space", {"multiplier": 2}],
        ["res_x", {"num_layers": 6}],
        ["compress_time", {"multiplier": 2}],
        ["res_x", {"num_layers": 4}],
        ["compress_all", {"multiplier": 1}],
        ["res_x", {"num_layers": 2}],
        ["compress_all", {"multiplier": 2}],
        ["res_x", {"num_layers": 2}],
    ],
    "scaling_factor": 1.0,
    "norm_layer": "pixel_norm",
    "patch_size": 4,
    "latent_log_var": "uniform",
    "use_quant_conv": False,
    "causal_decoder": False,
    "timestep_conditioning": False,
    "normalize_latent_channels": False,
    "encoder_base_channels": 128,
    "decoder_base_channels": 128,
    "spatial_padding_mode": "zeros",
}


def randomise(module, seed):
    """Every parameter and buffer from a seeded normal: matrices ~ N(0, 1/fan_in), biases ~ N(0, 0.05²),
    scale-shift tables and noise scales ~ N(0, 0.1²), RMS gains ~ 1 + N(0, 0.1²), the per-channel statistics a
    std in [0.5, 1.5] and a mean ~ N(0, 0.2²); `timestep_scale_multiplier` keeps its 1000."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if name.endswith("timestep_scale_multiplier"):
                continue
            if name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            elif "scale_shift_table" in name or "per_channel_scale" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("gamma") or (p.dim() == 1 and "norm" in name):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)


def statistics(channels, seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "std-of-means": 0.5 + torch.rand(channels, generator=g),
        "mean-of-means": 0.2 * torch.randn(channels, generator=g),
    }


def tiles(spec):
    axes = {k: DimensionSizeConfig(tile_size=v[0], overlap=v[1]) for k, v in spec.items()}
    return TileSizeConfig(**axes)


def run_case(name, case):
    torch.manual_seed(0)
    vae_cfg = case["vae"]
    metadata = {"config": {"vae": vae_cfg}}
    encoder = VideoEncoderConfigurator.from_metadata(metadata).eval()
    decoder = VideoDecoderConfigurator.from_metadata(metadata).eval()
    randomise(encoder, case["seed"])
    randomise(decoder, case["seed"] + 1)
    stats = statistics(vae_cfg["latent_channels"], case["seed"] + 2)
    for module in (encoder, decoder):
        for k, v in stats.items():
            module.per_channel_statistics.get_buffer(k).copy_(v)

    ft = encoder.video_scale_factors.time
    fs = encoder.video_scale_factors.height
    g = torch.Generator().manual_seed(case["seed"] + 3)
    f, h, w = case["video"]
    video = torch.rand(1, 3, f, h, w, generator=g) * 2.0 - 1.0
    latent_shape = (1, vae_cfg["latent_channels"], (f - 1) // ft + 1, h // fs, w // fs)
    latents = torch.randn(latent_shape, generator=g)
    inputs = {"video": video, "latents": latents}
    expected = {}
    with torch.no_grad():
        expected["encoded"] = encoder(video)
        if decoder.timestep_conditioning:
            seed = case["seed"] + 4
            # The noise `ConvVideoDecoder.forward` draws first from the generator, drawn again from its state.
            inputs["decode_noise"] = torch.randn(latents.size(), generator=torch.Generator().manual_seed(seed))
            expected["decoded"] = decoder(latents, generator=torch.Generator().manual_seed(seed))
        else:
            expected["decoded"] = decoder(latents)
        if "encode_tiles" in case:
            expected["encoded_tiled"] = encoder.tiled_encode(video, tiles(case["encode_tiles"]))
        if "decode_tiles" in case:
            chunks = list(decoder.tiled_decode(latents, tiles(case["decode_tiles"])))
            expected["decoded_tiled"] = torch.cat(chunks, dim=2)
        if "image" in case:
            fi, hi, wi = case["image"]
            image = video[:, :, :fi, :hi, :wi].contiguous()
            inputs["image"] = image
            expected["image_encoded"] = encoder(image)
            image_latents = latents[:, :, :1, : hi // fs, : wi // fs].contiguous()
            inputs["image_latents"] = image_latents
            expected["image_decoded"] = decoder(image_latents)

    sd = {f"vae.encoder.{k}": v for k, v in encoder.state_dict().items() if not k.startswith("per_channel")}
    sd.update({f"vae.decoder.{k}": v for k, v in decoder.state_dict().items() if not k.startswith("per_channel")})
    sd.update({f"vae.per_channel_statistics.{k}": v for k, v in stats.items()})
    sd = {k: v.detach().contiguous().clone() for k, v in sd.items()}

    folder = OUT / f"vae_{name}"
    folder.mkdir(parents=True, exist_ok=True)
    save_file(sd, folder / "weights.safetensors", metadata={"config": json.dumps(metadata["config"])})
    save_file({k: v.contiguous() for k, v in inputs.items()}, folder / "inputs.safetensors")
    save_file({k: v.contiguous() for k, v in expected.items()}, folder / "expected.safetensors")
    config = {
        "kind": "ltx2_vae",
        "source": f"github:Lightricks/LTX-2@{COMMIT}:packages/ltx-core/src/ltx_core/model/video_vae",
        "classes": ["VideoEncoder", "ConvVideoDecoder"],
        "vae": vae_cfg,
        "call": {"video": list(case["video"])},
        "seed": case["seed"],
        "torch": torch.__version__,
    }
    if decoder.timestep_conditioning:
        config["decode"] = {"noise_scale": decoder.decode_noise_scale, "timestep": decoder.decode_timestep}
    for key in ("encode_tiles", "decode_tiles"):
        if key in case:
            config[key] = {axis: {"tile_size": v[0], "overlap": v[1]} for axis, v in case[key].items()}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for a, b in (("encoded", "encoded_tiled"), ("decoded", "decoded_tiled")):
        if b in expected:
            print(f"{name}: {b} differs from {a} by {(expected[a] - expected[b]).abs().max().item():.3g}", file=sys.stderr)
    sizes = {k: tuple(v.shape) for k, v in expected.items()}
    print(f"{name}: {sizes}", file=sys.stderr)


def write_released(path):
    """A VAE of the released architecture with random weights (bf16), as the single file stores it."""
    metadata = {"config": {"vae": RELEASED}}
    encoder = VideoEncoderConfigurator.from_metadata(metadata)
    decoder = VideoDecoderConfigurator.from_metadata(metadata)
    randomise(encoder, 1)
    randomise(decoder, 2)
    sd = {f"vae.encoder.{k}": v for k, v in encoder.state_dict().items() if not k.startswith("per_channel")}
    sd.update({f"vae.decoder.{k}": v for k, v in decoder.state_dict().items() if not k.startswith("per_channel")})
    sd.update({f"vae.per_channel_statistics.{k}": v for k, v in statistics(128, 3).items()})
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()}
    save_file(sd, path, metadata={"config": json.dumps(metadata["config"])})
    print(f"wrote {path}: {sum(v.numel() for v in sd.values()) / 1e6:.1f} M parameters", file=sys.stderr)


def bench(path, frames, height, width):
    """The official encode (whole clip) and tiled decode (`TileSizeConfig.default()`) on the GPU in bf16."""
    import time

    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        metadata = {"config": json.loads(f.metadata()["config"])}
        sd = {k: f.get_tensor(k) for k in f.keys()}
    encoder = VideoEncoderConfigurator.from_metadata(metadata)
    decoder = VideoDecoderConfigurator.from_metadata(metadata)
    for module, side in ((encoder, "encoder"), (decoder, "decoder")):
        own = {k.removeprefix(f"vae.{side}."): v for k, v in sd.items() if k.startswith(f"vae.{side}.")}
        own.update({k.removeprefix("vae."): v for k, v in sd.items() if k.startswith("vae.per_channel")})
        module.load_state_dict(own)
        module.to("cuda", torch.bfloat16).eval()
    video = torch.rand(1, 3, frames, height, width, device="cuda", dtype=torch.bfloat16) * 2 - 1
    out = {"frames": frames, "height": height, "width": width}
    with torch.inference_mode():
        for name, fn in (
            ("encode", lambda: encoder(video)),
            ("decode_tiled", lambda: torch.cat(list(decoder.tiled_decode(latents, TileSizeConfig.default())), 2)),
        ):
            if name == "decode_tiled":
                latents = encoder(video)
            fn()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out[f"{name}_ms"] = round((time.perf_counter() - start) * 1000, 1)
            out[f"{name}_peak_gib"] = round((torch.cuda.max_memory_allocated() - base) / 2**30, 2)
    print("LTX2_VAE_TORCH " + json.dumps(out))


def main():
    torch.set_num_threads(1)
    if len(sys.argv) > 2 and sys.argv[1] == "--write-released":
        write_released(sys.argv[2])
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--bench":
        frames, height, width = (int(v) for v in (sys.argv[3:6] if len(sys.argv) >= 6 else (121, 512, 768)))
        torch.set_num_threads(8)
        bench(sys.argv[2], frames, height, width)
        return
    for name, case in CASES.items():
        run_case(name, case)


if __name__ == "__main__":
    main()
