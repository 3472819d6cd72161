"""Parity fixture for Framesmith's SigLIP image encoder (`framesmith_models::siglip`), made by the official code:
github:Tencent-Hunyuan/HunyuanVideo-1.5 commit 60783e704160023913bee78f0b47036d393d4dfa,
`hyvideo/models/vision_encoder/__init__.py` (`VisionEncoder("siglip")`: transformers' `SiglipVisionModel` from the
folder's `image_encoder/`, `SiglipImageProcessor` from its `feature_extractor/`, `encode_images` on a uint8 RGB
array, `last_hidden_state` kept). That folder is FLUX.1-Redux-dev's layout, which the release's
`ckpts/vision_encoder/siglip` is; musubi-tuner (kohya-ss/musubi-tuner 30c658c, `hf_clip_vision_encode` of
`frame_pack/clip_vision.py`) runs the same two steps on each clip's first frame for its `siglip_*` caches.

The official code pins transformers 4.57.1, whose `SiglipImageProcessor` resizes with Pillow (bicubic, to the
model's square size), rescales by 1/255 and normalises with mean and std 0.5. transformers 5 renamed that class
`SiglipImageProcessorPil` (its `SiglipImageProcessor` resizes with torchvision instead); it is given to the official
module under the old name here, so the fixture is what users of the official code and musubi-tuner get. The
official module is read from the repository mirror with `git show` (MIRROR below) and run unchanged; the model's
weights are random at a small size (width 32, 2 layers of 4 heads, MLP 48, 30-pixel images in 7-pixel patches, so
16 tokens and the last 2 rows and columns unused, as 384-pixel images in 14-pixel patches leave 6; the pooling head
kept, as the released file has one), float32 on the CPU with one thread.

Versions: transformers 5.24.0; torch 2.15.0 (CPU); Pillow 13.0.0.

Command (from the repository root; writes crates/framesmith-models/tests/fixtures/siglip/):
  /work/venv-ref/bin/python bench/reference/siglip.py

Files: image_encoder/{config.json, model.safetensors} and feature_extractor/preprocessor_config.json (the folder as
FLUX.1-Redux-dev has it), config.json (kind `siglip_vision`, sources, the images' sizes), inputs.safetensors
(`image_{i}`: uint8 [H, W, 3] RGB images: one shrunk, one enlarged, one at the model's size) and expected.safetensors
(`pixel_values_{i}` [1, 3, 30, 30], the processor's output, and `last_hidden_state_{i}` [1, 16, 32])."""
import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import PIL
import torch
from safetensors.torch import save_file

import transformers
from transformers import SiglipImageProcessorPil, SiglipVisionConfig, SiglipVisionModel

MIRROR = "/work/.mirror/Tencent-Hunyuan+HunyuanVideo-1.5/repo"
COMMIT = "60783e704160023913bee78f0b47036d393d4dfa"
OUT = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/siglip"
SIZES = [(45, 37), (20, 15), (30, 30)]  # (width, height) of each image


def official(path):
    return subprocess.run(["git", "-C", MIRROR, "show", f"{COMMIT}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def official_vision_module():
    """`hyvideo/models/vision_encoder/__init__.py`, with `hyvideo.commons.PRECISION_TO_TYPE` (its only project
    import) provided and transformers 4.57's Pillow-based processor under its old name."""
    commons = types.ModuleType("hyvideo.commons")
    commons.PRECISION_TO_TYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    sys.modules["hyvideo"] = types.ModuleType("hyvideo")
    sys.modules["hyvideo.commons"] = commons
    module = types.ModuleType("vision_encoder")
    exec(compile(official("hyvideo/models/vision_encoder/__init__.py"), "vision_encoder", "exec"), module.__dict__)
    module.SiglipImageProcessor = SiglipImageProcessorPil
    return module


def write_release_folder():
    """A random tiny SigLIP saved as FLUX.1-Redux-dev lays it out; returns its tensors by file name."""
    config = SiglipVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                image_size=30, patch_size=7, layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh")
    model = SiglipVisionModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.3)
    model.save_pretrained(OUT / "image_encoder", safe_serialization=True)
    # transformers 5 saves the tower's names without `vision_model.`; the released file (saved by 4.46) and
    # ComfyUI's sigclip_vision_patch14_384.safetensors have it, and musubi-tuner loads such a file strictly.
    state = {f"vision_model.{k}": v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, OUT / "image_encoder/model.safetensors", metadata={"format": "pt"})
    processor = {
        "do_convert_rgb": None, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "image_processor_type": "SiglipImageProcessor",
        "processor_class": "SiglipProcessor", "resample": 3, "rescale_factor": 1 / 255,
        "size": {"height": 30, "width": 30},
    }
    (OUT / "feature_extractor").mkdir(parents=True, exist_ok=True)
    (OUT / "feature_extractor/preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    return state


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    state = write_release_folder()
    vision = official_vision_module()
    encoder = vision.VisionEncoder(vision_encoder_type="siglip", vision_encoder_precision="fp32",
                                   vision_encoder_path=str(OUT))
    loaded = encoder.model.state_dict()
    # transformers 5's SiglipVisionModel holds the tower itself (base_model_prefix `vision_model`).
    assert all(torch.equal(loaded[k.removeprefix("vision_model.")], v) for k, v in state.items()), \
        "the official loader did not read the file"
    assert type(encoder.processor) is SiglipImageProcessorPil, type(encoder.processor)
    rng = np.random.default_rng(3)
    inputs, expected = {}, {}
    for i, (w, h) in enumerate(SIZES):
        # Smooth gradients plus noise: resampling differences show, and no value sits only at 0 or 255.
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([xx * 255 / max(w - 1, 1), yy * 255 / max(h - 1, 1), (xx + yy) * 127 / max(w + h - 2, 1)], -1)
        image = np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8)
        pixels = encoder.processor.preprocess(images=image, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            out = encoder.encode_images(image)
        inputs[f"image_{i}"] = torch.from_numpy(image).contiguous()
        expected[f"pixel_values_{i}"] = pixels.float().contiguous()
        expected[f"last_hidden_state_{i}"] = out.last_hidden_state.float().contiguous()
    save_file(inputs, OUT / "inputs.safetensors")
    save_file(expected, OUT / "expected.safetensors")
    config = {
        "kind": "siglip_vision",
        "source": {"HunyuanVideo-1.5": COMMIT, "transformers": transformers.__version__, "torch": torch.__version__,
                   "pillow": PIL.__version__},
        "model": "image_encoder",
        "images": [{"width": w, "height": h} for w, h in SIZES],
    }
    (OUT / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print({k: list(v.shape) for k, v in expected.items()}, "->", OUT)


if __name__ == "__main__":
    sys.exit(main())
