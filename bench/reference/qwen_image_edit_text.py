"""Parity fixtures for Framesmith's Qwen2.5-VL vision tower, image processor and Qwen-Image-Edit prompt encoding,
made by the official implementation: transformers' `Qwen2_5_VLForConditionalGeneration` (vision tower and language
model, random weights at a tiny config), transformers' `Qwen2VLProcessor` with `Qwen2VLImageProcessorPil`, called
through diffusers' `QwenImageEditPipeline._get_qwen_prompt_embeds` and `QwenImageEditPlusPipeline.
_get_qwen_prompt_embeds` (Qwen-Image-Edit-2509), with the images first resized as the pipelines' `__call__` does
(`calculate_dimensions` to a target area, `VaeImageProcessor.resize`: PIL Lanczos). float32 on the CPU, one thread.

M-RoPE: the pipelines call the text encoder without `mm_token_type_ids`. transformers 4.x derived the image tokens'
3-D positions from `input_ids` itself; transformers 5 needs `mm_token_type_ids` for that and, without it, silently
gives every token 1-D positions. Qwen-Image-Edit was trained with the 3-D positions (ComfyUI computes them too), so
the text encoder here is wrapped to pass `mm_token_type_ids = (input_ids == image_token_id)`, which restores
transformers 4's behaviour; the script prints how far the unwrapped call lands from it.

Weights are random, rounded to float16 values and stored as F16 (the model runs in float32 on those values), to
keep the fixture small. The tokenizer is built as in `qwen25vl.py` (byte-level BPE, Qwen2's pre-tokenizer, a merge
per template word), from the Edit template's words.

Versions (the environment the committed fixtures were made in):
  - transformers 5.24.0 from PyPI (models/qwen2_5_vl/modeling_qwen2_5_vl.py, vision_utils.py,
    models/qwen2_vl/image_processing_pil_qwen2_vl.py; sha256 of each in config.json).
  - diffusers 0.42.1 from PyPI (pipelines/qwenimage/pipeline_qwenimage_edit.py and pipeline_qwenimage_edit_plus.py;
    sha256 in config.json).
  - Pillow 13.0.0, tokenizers 0.23.3, torch 2.15.0 (CPU), safetensors 0.8.0, Python 3.11; no torchvision (so the
    processor is the PIL one, as `Qwen2VLProcessor.from_pretrained` picks without torchvision).

Command (from the repository root; writes crates/framesmith-models/tests/fixtures/qwen25vl_edit/):
  /work/venv-ref/bin/python bench/reference/qwen_image_edit_text.py

Files: config.json (configs, prompts, cases, versions), tokenizer.json, weights.safetensors (the model's
`state_dict()` under transformers 5 names, F16, `lm_head` left out), inputs.safetensors (the images, u8 [h, w, 3]),
expected.safetensors:
  - small_pixel_values, small_grid     the processor's output for `image_small` (default sizes)
  - wide_resized, wide_grid            `image_wide` after the processor's bicubic resize (u8 [h, w, 3])
  - wide_vision                        the vision tower's merged output for `image_wide`
  - {case}_embeds, {case}_mask, {case}_ids, {case}_positions   per case: the pipeline's prompt embeds and mask, the
    processor's input ids and the 3-D positions (get_rope_index)
"""
import hashlib
import json
import math
import sys
import types
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, Regex

import diffusers
import transformers
from diffusers.image_processor import VaeImageProcessor
from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as edit_mod
from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus_mod
from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen25vl import QWEN2_SPLIT, TEXT, byte_alphabet  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/qwen25vl_edit"
SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
    "<|video_pad|>",
]
PROMPTS = ["Make the fox blue and add the text \"HELLO\"", "Put the cat from Picture 2 on the rock in Picture 1"]
VISION = {
    "depth": 4,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_heads": 2,
    "out_hidden_size": 64,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "fullatt_block_indexes": [2],
    "window_size": 56,
    "tokens_per_second": 2,
}
# Qwen-Image-Edit's processor/preprocessor_config.json (that of Qwen2.5-VL-7B-Instruct).
MIN_PIXELS, MAX_PIXELS = 3136, 12845056
# The Edit case's processor keeps at most this many pixels, so that the ~1024² image the pipeline hands it is
# shrunk (smart_resize's other branch) and the fixture stays small.
EDIT_MAX_PIXELS = 28 * 28 * 20


def build_tokenizer(words_text):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    vocab = {c: i for i, c in enumerate(byte_alphabet())}
    merges = []
    for piece, _ in pre.pre_tokenize_str(words_text):
        current = piece[0]
        for ch in piece[1:]:
            merged = current + ch
            if merged not in vocab:
                merges.append((current, ch))
                vocab[merged] = len(vocab)
            current = merged
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok


def image(width, height, seed):
    """A gradient with noise (u8 RGB), so that resampling both smooths and clamps."""
    g = torch.Generator().manual_seed(seed)
    y = torch.linspace(0, 1, height)[:, None, None]
    x = torch.linspace(0, 1, width)[None, :, None]
    base = 255 * (0.5 * x + 0.3 * y + 0.2 * torch.tensor([0.2, 0.6, 1.0]))
    noise = torch.randint(-60, 61, (height, width, 3), generator=g)
    arr = (base + noise).clamp(0, 255).to(torch.uint8)
    return Image.fromarray(arr.numpy(), "RGB"), arr


class MropeEncoder:
    """The text encoder as the pipelines call it, passing `mm_token_type_ids` (see the module docstring)."""

    def __init__(self, model, image_token_id, with_types=True):
        self.model, self.image_token_id, self.with_types = model, image_token_id, with_types
        self.dtype = torch.float32
        self.seen = []

    def __call__(self, **kw):
        if self.with_types:
            kw["mm_token_type_ids"] = (kw["input_ids"] == self.image_token_id).int()
            pos, _ = self.model.model.get_rope_index(
                kw["input_ids"], kw["mm_token_type_ids"], image_grid_thw=kw["image_grid_thw"],
                attention_mask=kw["attention_mask"])
            self.seen.append((kw["input_ids"], pos))
        self.model.model.rope_deltas = None
        return self.model(**kw)


def fake_pipeline(cls, processor, encoder):
    fake = types.SimpleNamespace()
    fake.processor = processor
    fake.text_encoder = encoder
    fake._execution_device = torch.device("cpu")
    fake._extract_masked_hidden = types.MethodType(cls._extract_masked_hidden, fake)
    # The template and drop count the pipeline's __init__ sets.
    init_src = Path(sys.modules[cls.__module__].__file__).read_text()
    start = init_src.index('self.prompt_template_encode = "') + len('self.prompt_template_encode = ')
    fake.prompt_template_encode = json.loads(init_src[start:init_src.index("\n", start)])
    fake.prompt_template_encode_start_idx = 64
    assert "self.prompt_template_encode_start_idx = 64" in init_src
    return fake


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)

    edit_template = fake_pipeline(edit_mod.QwenImageEditPipeline, None, None).prompt_template_encode
    words = edit_template.replace("{}", " ")
    for special in SPECIALS:
        words = words.replace(special, "\n")
    tok = build_tokenizer(words + " Picture 1: " + " ".join(PROMPTS))
    tok_path = OUT / "tokenizer.json"
    tok.save(str(tok_path))
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tok_path), pad_token="<|endoftext|>")
    ids = {s: tokenizer.convert_tokens_to_ids(s) for s in SPECIALS}

    text = dict(TEXT, vocab_size=len(tokenizer), bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|endoftext|>"])
    config = Qwen2_5_VLConfig(
        text_config=text, vision_config=VISION, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"])
    config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("ln_q.weight") or name.endswith("norm1.weight") \
                    or name.endswith("norm2.weight") or name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.2 + (1.0 if name.endswith("weight") else 0.0))
            elif name.startswith("model.visual."):
                p.copy_(torch.randn_like(p) * 0.08)
            p.copy_(p.half().float())
    rope_theta = config.vision_config.rope_parameters["rope_theta"]

    # Without torchvision the video-processor class lookup fails inside the type check; the check only validates
    # argument classes, so it is skipped (the processor's behaviour is untouched).
    Qwen2VLProcessor.check_argument_for_proper_class = lambda self, name, arg: None
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS),
                                 tokenizer=tokenizer)
    edit_processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=EDIT_MAX_PIXELS),
        tokenizer=tokenizer)

    img_small, arr_small = image(45, 61, 1)
    img_wide, arr_wide = image(150, 100, 2)
    img_fox, arr_fox = image(64, 48, 3)
    expected, inputs = {}, {"image_small": arr_small, "image_wide": arr_wide, "image_fox": arr_fox}

    with torch.no_grad():
        out = processor.image_processor(images=img_small, return_tensors="pt")
        expected["small_pixel_values"] = out["pixel_values"]
        expected["small_grid"] = out["image_grid_thw"]
        out = processor.image_processor(images=img_wide, return_tensors="pt")
        (_, gh, gw) = out["image_grid_thw"][0].tolist()
        resized = img_wide.resize((gw * 14, gh * 14), resample=Image.BICUBIC)
        expected["wide_resized"] = torch.from_numpy(np.asarray(resized).copy())
        expected["wide_grid"] = out["image_grid_thw"]
        vis = model.model.visual(out["pixel_values"], grid_thw=out["image_grid_thw"])
        expected["wide_vision"] = vis.pooler_output

        vae_proc = VaeImageProcessor(vae_scale_factor=16)
        cases = {}
        # Qwen-Image-Edit: one image resized to ~1024² (multiples of 32) with Lanczos, as __call__ does.
        enc = MropeEncoder(model, ids["<|image_pad|>"])
        fake = fake_pipeline(edit_mod.QwenImageEditPipeline, edit_processor, enc)
        w, h, _ = edit_mod.calculate_dimensions(1024 * 1024, img_fox.size[0] / img_fox.size[1])
        prompt_image = vae_proc.resize(img_fox, h, w)
        cases["edit"] = (edit_mod.QwenImageEditPipeline, fake, enc, PROMPTS[0], prompt_image, ["image_fox"])
        # Qwen-Image-Edit-2509: each image resized to ~384² with Lanczos; one image, then two.
        for name, imgs, keys, prompt in [
            ("plus1", [img_fox], ["image_fox"], PROMPTS[0]),
            ("plus2", [img_fox, img_wide], ["image_fox", "image_wide"], PROMPTS[1]),
        ]:
            enc = MropeEncoder(model, ids["<|image_pad|>"])
            fake = fake_pipeline(plus_mod.QwenImageEditPlusPipeline, processor, enc)
            cond = []
            for img in imgs:
                cw, ch = plus_mod.calculate_dimensions(plus_mod.CONDITION_IMAGE_SIZE, img.size[0] / img.size[1])
                cond.append(vae_proc.resize(img, ch, cw))
            cases[name] = (plus_mod.QwenImageEditPlusPipeline, fake, enc, prompt, cond, keys)

        meta_cases = {}
        for name, (cls, fake, enc, prompt, img, keys) in cases.items():
            embeds, mask = cls._get_qwen_prompt_embeds(fake, prompt, img, torch.device("cpu"), torch.float32)
            (seen_ids, positions), = enc.seen
            expected[f"{name}_embeds"] = embeds
            expected[f"{name}_mask"] = mask.to(torch.int64)
            expected[f"{name}_ids"] = seen_ids
            expected[f"{name}_positions"] = positions
            meta_cases[name] = {"pipeline": cls.__name__, "prompt": prompt, "images": keys,
                                "max_pixels": EDIT_MAX_PIXELS if name == "edit" else MAX_PIXELS}
            plain = MropeEncoder(model, ids["<|image_pad|>"], with_types=False)
            fake.text_encoder = plain
            embeds_1d, _ = cls._get_qwen_prompt_embeds(fake, prompt, img, torch.device("cpu"), torch.float32)
            rel = ((embeds_1d - embeds).norm() / embeds.norm()).item()
            print(f"{name}: embeds {tuple(embeds.shape)}, grid-less (1-D positions) call differs by rel {rel:.3e}")

    expected = {k: v.contiguous() for k, v in expected.items()}
    inputs = {k: v.contiguous() for k, v in inputs.items()}
    weights = {k: v.half().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(weights, OUT / "weights.safetensors")
    save_file(inputs, OUT / "inputs.safetensors")
    save_file(expected, OUT / "expected.safetensors")

    tf = Path(transformers.__file__).parent
    df = Path(diffusers.__file__).parent / "pipelines/qwenimage"
    meta = {
        "kind": "qwen25vl_edit_text_encoder",
        "source": {
            "transformers": transformers.__version__,
            "diffusers": diffusers.__version__,
            "torch": torch.__version__,
            "sha256": {
                "modeling_qwen2_5_vl.py": sha(tf / "models/qwen2_5_vl/modeling_qwen2_5_vl.py"),
                "vision_utils.py": sha(tf / "vision_utils.py"),
                "image_processing_pil_qwen2_vl.py": sha(tf / "models/qwen2_vl/image_processing_pil_qwen2_vl.py"),
                "pipeline_qwenimage_edit.py": sha(df / "pipeline_qwenimage_edit.py"),
                "pipeline_qwenimage_edit_plus.py": sha(df / "pipeline_qwenimage_edit_plus.py"),
            },
        },
        "text_config": text,
        "vision_config": dict(VISION, rope_theta=rope_theta),
        "image_token_id": ids["<|image_pad|>"],
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "cases": meta_cases,
    }
    (OUT / "config.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    print({k: tuple(v.shape) for k, v in expected.items()})
    print("template prefix tokens:", len(tokenizer(edit_template.split("{}")[0])["input_ids"]))


if __name__ == "__main__":
    main()
