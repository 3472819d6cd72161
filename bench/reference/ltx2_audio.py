"""Parity fixtures for Framesmith's LTX-2 / LTX-2.3 audio VAE and vocoder, made by the official implementation:
ltx-core's `AudioProcessor` (waveform to log-mel through torchaudio's `MelSpectrogram`), `AudioEncoder`,
`AudioDecoder` and `Vocoder` / `VocoderWithBWE` (built by `AudioEncoderConfigurator`, `AudioDecoderConfigurator`
and `VocoderConfigurator` from a checkpoint's `config` metadata, as the official pipelines and trainer build them)
of github:Lightricks/LTX-2 (package ltx-core 1.2.0) at commit 400fd31054597515f47125691032c04b1c3ee24e, with
random weights at small shapes, run in float32 on the CPU with one thread.

Each case is stored as the released single file stores these parts: keys `audio_vae.encoder.*`,
`audio_vae.decoder.*`, the shared `audio_vae.per_channel_statistics.*` and `vocoder.*` (LTX-2.3:
`vocoder.vocoder.*`, `vocoder.bwe_generator.*`, `vocoder.mel_stft.*`), and the model config as the `config`
metadata entry (its `audio_vae` and `vocoder` sections). The calls are the official ones: `encode_audio` (a
waveform at the model's sample rate, so no resampling) and `decode_audio` (decoder, then vocoder).

Versions (the environment the committed fixtures were made in):
  - ltx-core from the commit above, on PYTHONPATH (`packages/ltx-core/src`), with einops 0.8.x.
  - torch 2.15.0 (CPU), torchaudio 2.11.0 (its pure-Python `MelSpectrogram`; the wheel is built for another CUDA,
    so its version check is passed by naming that CUDA while it is imported), safetensors 0.8.0, Python 3.11.7.

Command (from the repository root; writes crates/framesmith-models/tests/fixtures/ltx2/audio_<case>/):
  PYTHONPATH=/tmp/LTX-2/packages/ltx-core/src:/path/to/torchaudio /work/venv-ref/bin/python bench/reference/ltx2_audio.py

Device use (bench/run-ltx2-audio.sh): `--write-released PATH [VIDEO_VAE]` writes LTX-2's released audio VAE and
vocoder (`RELEASED_AUDIO_VAE`, `RELEASED_VOCODER`: ltx-core's configurator defaults, which are the 19B file's) with
random bf16 weights as the single file stores them (beside the tensors and config of VIDEO_VAE when given); `--bench PATH SECONDS` times the official encode and decode of a
random waveform with it on the GPU and prints one `LTX2_AUDIO_TORCH` JSON line.

Cases:
  - `ltx2`: LTX-2's switches: pixel norm, causal along the time axis (`height`), no attention, a `Vocoder` with
    `ResBlock1` blocks, leaky ReLU and tanh at the end.
  - `ltx23`: attention in the mid block and at one resolution of each path, and LTX-2.3's `VocoderWithBWE`: an
    `AMPBlock1` / SnakeBeta vocoder with the anti-aliased activations, clamped instead of tanh and without a final
    bias, then the bandwidth extension (causal STFT from stored bases, a mel filterbank, a second generator and the
    Hann-sinc resampled skip).
"""
import json
import math
import sys
import types
from pathlib import Path

import torch

_cuda = torch.version.cuda
torch.version.cuda = "13.0"
try:
    import torchaudio  # noqa: E402,F401
except ImportError:
    if "--write-released" not in sys.argv:
        raise
    # Writing weights builds the modules only; `AudioProcessor`, the one user of torchaudio, is not made.
    sys.modules["torchaudio"] = types.ModuleType("torchaudio")
torch.version.cuda = _cuda

from safetensors.torch import save_file  # noqa: E402

from ltx_core.model.audio_vae import (  # noqa: E402
    AudioDecoderConfigurator,
    AudioEncoderConfigurator,
    AudioProcessor,
    VocoderConfigurator,
    decode_audio,
    encode_audio,
)
from ltx_core.types import Audio  # noqa: E402

COMMIT = "400fd31054597515f47125691032c04b1c3ee24e"
OUT = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/ltx2"


def audio_vae(ch, z, attn, mid_attn, n_fft):
    return {
        "model": {
            "params": {
                "sampling_rate": 16000,
                "ddconfig": {
                    "ch": ch,
                    "out_ch": 2,
                    "ch_mult": [1, 2, 2],
                    "num_res_blocks": 1,
                    "attn_resolutions": attn,
                    "resolution": 64,
                    "z_channels": z,
                    "double_z": True,
                    "in_channels": 2,
                    "norm_type": "pixel",
                    "causality_axis": "height",
                    "mid_block_add_attention": mid_attn,
                    "mel_bins": 64,
                },
            }
        },
        "preprocessing": {"stft": {"filter_length": n_fft, "hop_length": 160, "causal": True}, "mel": {"n_mel_channels": 64}},
    }


CASES = {
    "ltx2": {
        "seed": 41,
        "samples": 5120,
        "latent_frames": 6,
        "audio_vae": audio_vae(16, 1, [], False, 512),
        "vocoder": {
            "resblock_kernel_sizes": [3, 5],
            "upsample_rates": [2, 3],
            "upsample_kernel_sizes": [4, 7],
            "resblock_dilation_sizes": [[1, 3, 5], [1, 2, 3]],
            "upsample_initial_channel": 16,
            "resblock": "1",
            "stereo": True,
            "output_sampling_rate": 600,
        },
    },
    "ltx23": {
        "seed": 43,
        "samples": 4000,
        "latent_frames": 5,
        "audio_vae": audio_vae(16, 1, [32], True, 1024),
        "vocoder": {
            "vocoder": {
                "resblock_kernel_sizes": [3, 5],
                "upsample_rates": [2, 2],
                "upsample_kernel_sizes": [4, 4],
                "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]],
                "upsample_initial_channel": 16,
                "resblock": "AMP1",
                "stereo": True,
                "activation": "snakebeta",
                "use_tanh_at_final": False,
                "use_bias_at_final": False,
            },
            "bwe": {
                "resblock_kernel_sizes": [3],
                "upsample_rates": [3, 4],
                "upsample_kernel_sizes": [7, 8],
                "resblock_dilation_sizes": [[1, 3, 5]],
                "upsample_initial_channel": 8,
                "resblock": "AMP1",
                "stereo": True,
                "activation": "snakebeta",
                "use_tanh_at_final": False,
                "use_bias_at_final": False,
                "input_sampling_rate": 400,
                "output_sampling_rate": 1200,
                "hop_length": 4,
                "n_fft": 16,
                "num_mels": 64,
            },
        },
    },
}

# ltx-core's configurator defaults: the sections of the LTX-2 19B single file.
RELEASED_AUDIO_VAE = {
    "model": {
        "params": {
            "sampling_rate": 16000,
            "ddconfig": {
                "ch": 128,
                "out_ch": 2,
                "ch_mult": [1, 2, 4],
                "num_res_blocks": 2,
                "attn_resolutions": [],
                "resolution": 256,
                "z_channels": 8,
                "double_z": True,
                "in_channels": 2,
                "norm_type": "pixel",
                "causality_axis": "height",
                "mid_block_add_attention": False,
                "mel_bins": 64,
            },
        }
    },
    "preprocessing": {"stft": {"filter_length": 1024, "hop_length": 160, "causal": True}, "mel": {"n_mel_channels": 64}},
}
RELEASED_VOCODER = {
    "resblock_kernel_sizes": [3, 7, 11],
    "upsample_rates": [6, 5, 2, 2, 2],
    "upsample_kernel_sizes": [16, 15, 8, 4, 4],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "upsample_initial_channel": 1024,
    "resblock": "1",
    "stereo": True,
    "output_sampling_rate": 24000,
}


def randomise(module, seed):
    """Every parameter from a seeded normal: matrices ~ N(0, 1/fan_in), biases ~ N(0, 0.05²), the snake
    activations' log-scale alpha and beta ~ N(0, 0.2²). Buffers (the anti-aliasing filters, the STFT bases) keep
    their values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            elif name.endswith(".alpha") or name.endswith(".beta"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)


def statistics(channels, seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "std-of-means": 0.5 + torch.rand(channels, generator=g),
        "mean-of-means": 0.2 * torch.randn(channels, generator=g),
    }


def fill_mel_stft(mel_stft, seed):
    """A causal-Hann DFT basis (real rows, then imaginary) and a random non-negative mel filterbank, in place of
    the release's stored buffers."""
    basis = mel_stft.stft_fn.forward_basis
    n_fft = basis.shape[-1]
    n_freqs = n_fft // 2 + 1
    n = torch.arange(n_fft, dtype=torch.float64)
    k = torch.arange(n_freqs, dtype=torch.float64).unsqueeze(1)
    window = torch.hann_window(n_fft, dtype=torch.float64)
    angle = 2 * math.pi * k * n / n_fft
    rows = torch.cat([torch.cos(angle), -torch.sin(angle)]) * window
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        basis.copy_(rows.unsqueeze(1).float())
        mel_stft.stft_fn.inverse_basis.copy_(rows.unsqueeze(1).float())
        mel_stft.mel_basis.copy_(torch.rand(mel_stft.mel_basis.shape, generator=g) * 0.2)


def build(metadata, seed):
    encoder = AudioEncoderConfigurator.from_metadata(metadata).eval()
    decoder = AudioDecoderConfigurator.from_metadata(metadata).eval()
    vocoder = VocoderConfigurator.from_metadata(metadata).eval()
    randomise(encoder, seed)
    randomise(decoder, seed + 1)
    randomise(vocoder, seed + 2)
    if hasattr(vocoder, "mel_stft"):
        fill_mel_stft(vocoder.mel_stft, seed + 5)
    stats = statistics(encoder.ch, seed + 3)
    for module in (encoder, decoder):
        for k, v in stats.items():
            module.per_channel_statistics.get_buffer(k).copy_(v)
    return encoder, decoder, vocoder, stats


def state_dict(encoder, decoder, vocoder, stats):
    sd = {f"audio_vae.encoder.{k}": v for k, v in encoder.state_dict().items() if not k.startswith("per_channel")}
    sd.update({f"audio_vae.decoder.{k}": v for k, v in decoder.state_dict().items() if not k.startswith("per_channel")})
    sd.update({f"audio_vae.per_channel_statistics.{k}": v for k, v in stats.items()})
    sd.update({f"vocoder.{k}": v for k, v in vocoder.state_dict().items()})
    return {k: v.detach().contiguous().clone() for k, v in sd.items()}


def run_case(name, case):
    torch.manual_seed(0)
    metadata = {"config": {"audio_vae": case["audio_vae"], "vocoder": case["vocoder"]}}
    encoder, decoder, vocoder, stats = build(metadata, case["seed"])
    g = torch.Generator().manual_seed(case["seed"] + 4)
    t = torch.arange(case["samples"], dtype=torch.float32) / 16000.0
    tone = torch.stack([torch.sin(2 * math.pi * 440.0 * t), torch.sin(2 * math.pi * 1234.0 * t)])
    waveform = (0.5 * tone + 0.1 * torch.randn(2, case["samples"], generator=g)).unsqueeze(0)
    c = encoder.z_channels
    f = encoder.mel_bins // 2 ** (encoder.num_resolutions - 1)
    latents = torch.randn(1, c, case["latent_frames"], f, generator=g)
    inputs = {"waveform": waveform, "latents": latents}
    expected = {}
    with torch.no_grad():
        processor = AudioProcessor(
            target_sample_rate=encoder.sample_rate,
            mel_bins=encoder.mel_bins,
            mel_hop_length=encoder.mel_hop_length,
            n_fft=encoder.n_fft,
        )
        audio = Audio(waveform=waveform, sampling_rate=16000)
        expected["mel"] = processor.waveform_to_mel(audio)
        expected["encoded"] = encode_audio(audio, encoder, processor)
        expected["decoded_mel"] = decoder(latents)
        expected["waveform"] = decode_audio(latents, decoder, vocoder).waveform

    folder = OUT / f"audio_{name}"
    folder.mkdir(parents=True, exist_ok=True)
    sd = state_dict(encoder, decoder, vocoder, stats)
    save_file(sd, folder / "weights.safetensors", metadata={"config": json.dumps(metadata["config"])})
    save_file({k: v.contiguous() for k, v in inputs.items()}, folder / "inputs.safetensors")
    save_file({k: v.contiguous() for k, v in expected.items()}, folder / "expected.safetensors")
    config = {
        "kind": "ltx2_audio",
        "source": f"github:Lightricks/LTX-2@{COMMIT}:packages/ltx-core/src/ltx_core/model/audio_vae",
        "classes": ["AudioProcessor", "AudioEncoder", "AudioDecoder", type(vocoder).__name__],
        "audio_vae": case["audio_vae"],
        "vocoder": case["vocoder"],
        "seed": case["seed"],
        "torch": torch.__version__,
        "output_sampling_rate": vocoder.output_sampling_rate,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    sizes = {k: tuple(v.shape) for k, v in expected.items()}
    print(f"{name}: {sizes}", file=sys.stderr)


def write_released(path, merge=None):
    """LTX-2's released audio VAE and vocoder with random weights (bf16), as the single file stores them; with
    `merge`, beside that file's tensors and `config` sections (a video VAE written by ltx2_vae.py), as the
    checkpoint holds both."""
    config = {"audio_vae": RELEASED_AUDIO_VAE, "vocoder": RELEASED_VOCODER}
    encoder, decoder, vocoder, stats = build({"config": config}, 1)
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in state_dict(encoder, decoder, vocoder, stats).items()}
    if merge is not None:
        from safetensors import safe_open

        with safe_open(merge, "pt") as f:
            config = {**json.loads(f.metadata()["config"]), **config}
            sd.update({k: f.get_tensor(k) for k in f.keys()})
    save_file(sd, path, metadata={"config": json.dumps(config)})
    print(f"wrote {path}: {sum(v.numel() for v in sd.values()) / 1e6:.1f} M parameters", file=sys.stderr)


def bench(path, seconds):
    """The official encode and decode (+ vocoder) of a random stereo waveform of `seconds` on the GPU in bf16."""
    import time

    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        metadata = {"config": json.loads(f.metadata()["config"])}
        sd = {k: f.get_tensor(k) for k in f.keys()}
    encoder = AudioEncoderConfigurator.from_metadata(metadata)
    decoder = AudioDecoderConfigurator.from_metadata(metadata)
    vocoder = VocoderConfigurator.from_metadata(metadata)
    stats = {k.split(".")[-1]: v for k, v in sd.items() if k.startswith("audio_vae.per_channel_statistics.")}
    for prefix, module in (("audio_vae.encoder.", encoder), ("audio_vae.decoder.", decoder)):
        part = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
        part.update({f"per_channel_statistics.{k}": v for k, v in stats.items()})
        module.load_state_dict(part)
    vocoder.load_state_dict({k[len("vocoder."):]: v for k, v in sd.items() if k.startswith("vocoder.")})
    dev = torch.device("cuda")
    encoder, decoder, vocoder = (m.to(dev, torch.bfloat16).eval() for m in (encoder, decoder, vocoder))
    g = torch.Generator().manual_seed(0)
    waveform = (0.3 * torch.randn(1, 2, int(seconds * 16000), generator=g)).to(dev)
    audio = Audio(waveform=waveform, sampling_rate=16000)
    out = {}
    with torch.no_grad():
        for label, fn in (
            ("encode", lambda: encode_audio(audio, encoder)),
            ("decode", lambda: decode_audio(latents, decoder, vocoder)),
        ):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            result = fn()
            torch.cuda.synchronize()
            out[f"{label}_ms"] = (time.perf_counter() - t0) * 1000.0
            out[f"{label}_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            if label == "encode":
                latents = result
                out["latent_shape"] = list(result.shape)
            else:
                out["samples"] = int(result.waveform.shape[-1])
    print("LTX2_AUDIO_TORCH " + json.dumps(out))


def main():
    torch.set_num_threads(1)
    if len(sys.argv) >= 3 and sys.argv[1] == "--write-released":
        write_released(sys.argv[2], sys.argv[3] if len(sys.argv) >= 4 else None)
        return
    if len(sys.argv) >= 4 and sys.argv[1] == "--bench":
        bench(sys.argv[2], float(sys.argv[3]))
        return
    for name, case in CASES.items():
        run_case(name, case)


if __name__ == "__main__":
    main()
