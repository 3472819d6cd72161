"""Parity fixture for Framesmith's HunyuanVideo 1.5 prompt encoding (Qwen2.5-VL), made by the official code:
diffusers' `HunyuanVideo15Pipeline._get_mllm_prompt_embeds` (the video system message in Qwen2.5-VL's chat template
with the assistant turn opened, padded to `tokenizer_max_length + crop_start`, `hidden_states[-3]`, the first
`crop_start` = 108 tokens and their mask columns dropped) over the tiny random Qwen2.5-VL of `qwen25vl.py`, in
float32 on the CPU with one thread.

The tiny tokenizer is `qwen25vl.py`'s byte-level BPE with merges for every word of this system message and for a
run of 8 spaces, as Qwen's vocabulary has them, and a text-only copy of Qwen2.5-VL's chat template: the template's
part up to and including `<|im_start|>user\\n` is then 108 tokens, as with the real tokenizer (checked here with
the official repository's own rule, `calculate_crop_start` of github:Tencent-Hunyuan/HunyuanVideo-1.5 commit
60783e704160023913bee78f0b47036d393d4dfa, hyvideo/models/text_encoders/__init__.py). `tokenizer_max_length` is
cut from 1000 to 24 to keep the fixture small (one prompt is longer and is truncated).

Versions: diffusers 0.42.1 (PyPI), pipelines/hunyuan_video1_5/pipeline_hunyuan_video1_5.py sha256
c21bb74e2afe820cca20d5cc815b9c1c2f42bb9694b8208fa165b2af841a8248; transformers 5.24.0; torch 2.15.0 (CPU).

Command (from the repository root; writes crates/framesmith-models/tests/fixtures/hunyuan_video15_text/):
  /work/venv-ref/bin/python bench/reference/hunyuan_video15_text.py

Files: config.json (text config, prompts, system message, crop start, max length, versions), tokenizer.json,
weights.safetensors (the language model's `state_dict()` under transformers' names; `lm_head.weight` and the
vision tower left out) and expected.safetensors:
`prompt_embeds` [B, 24, H] and `prompt_mask` [B, 24] as the pipeline returns them (states of pad tokens included),
`input_ids` [B, 132] as its tokenizer call gives them."""
import hashlib
import inspect
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

import diffusers
import transformers
from diffusers.pipelines.hunyuan_video1_5 import pipeline_hunyuan_video1_5 as hy15
from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwen25vl  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/hunyuan_video15_text"
CROP_START = 108
MAX_LENGTH = 24
PROMPTS = [
    "A red fox sits on a mossy rock at dawn, text \"HELLO\" above.",
    "",
    "cat",
    "Zebra? Ünïcode wörds fall back to bytes, and this prompt runs on past the cut of the fixture",
]
# Qwen2.5-VL's chat template, its text-only branches.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def crop_start_by_official_rule(tokenizer, system):
    """`calculate_crop_start` of the official repository: the position after `<|im_start|>user\\n` in the
    template applied to "a photo of a cat"."""
    chat = hy15.format_text_input(["a photo of a cat"], system)
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    ids = ids[0]
    marker = tokenizer("<|im_start|>user\n", add_special_tokens=False)["input_ids"]
    for i in range(len(ids) - len(marker) + 1):
        if ids[i:i + len(marker)] == marker:
            return i + len(marker)
    raise AssertionError("marker not found")


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    system = inspect.signature(hy15.HunyuanVideo15Pipeline._get_mllm_prompt_embeds).parameters["system_message"].default
    qwen25vl.PROMPTS[:] = PROMPTS[:1]
    words = "<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    # Qwen's vocabulary spells a run of 8 spaces as one token: so do these merges.
    tok = qwen25vl.build_tokenizer(words, [("Ġ", "Ġ"), ("ĠĠ", "ĠĠ"), ("ĠĠĠĠ", "ĠĠĠĠ")])
    tok_path = OUT / "tokenizer.json"
    tok.save(str(tok_path))
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tok_path), pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    found = crop_start_by_official_rule(tokenizer, system)
    assert found == CROP_START, found

    text = dict(qwen25vl.TEXT, vocab_size=len(tokenizer),
                bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
                eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    config = Qwen2_5_VLConfig(text_config=text, vision_config=qwen25vl.VISION)
    config._attn_implementation = "eager"
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.2 + (1.0 if name.endswith("weight") else 0.0))
        embeds, mask = hy15.HunyuanVideo15Pipeline._get_mllm_prompt_embeds(
            model, tokenizer, PROMPTS, torch.device("cpu"), tokenizer_max_length=MAX_LENGTH,
            num_hidden_layers_to_skip=2, system_message=system, crop_start=CROP_START)
        ids = tokenizer.apply_chat_template(hy15.format_text_input(PROMPTS, system), add_generation_prompt=True,
                                            tokenize=True, return_dict=True, padding="max_length",
                                            max_length=MAX_LENGTH + CROP_START, truncation=True,
                                            return_tensors="pt")["input_ids"]
    kept = {k: v.contiguous() for k, v in model.state_dict().items()
            if k != "lm_head.weight" and not k.startswith("model.visual.")}
    save_file(kept, OUT / "weights.safetensors")
    save_file({"prompt_embeds": embeds.contiguous(), "prompt_mask": mask.to(torch.int64).contiguous(),
               "input_ids": ids.to(torch.int64).contiguous()}, OUT / "expected.safetensors")
    src = Path(hy15.__file__)
    meta = {
        "kind": "hunyuan_video15_text_encoder",
        "source": {
            "diffusers": diffusers.__version__,
            "pipeline_hunyuan_video1_5.py sha256": hashlib.sha256(src.read_bytes()).hexdigest(),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "text_config": text,
        "prompts": PROMPTS,
        "system_message": system,
        "crop_start": CROP_START,
        "tokenizer_max_length": MAX_LENGTH,
    }
    (OUT / "config.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    print("embeds", tuple(embeds.shape), "mask sums", mask.sum(1).tolist())


if __name__ == "__main__":
    main()
