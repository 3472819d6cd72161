"""Parity fixtures for Framesmith's Qwen2.5-VL text encoder (the language model of Qwen-Image and HunyuanVideo
1.5), made by the official implementation: transformers' `Qwen2_5_VLForConditionalGeneration` with random weights
at a small config, called through diffusers' `QwenImagePipeline._get_qwen_prompt_embeds` / `encode_prompt` (the
official Qwen-Image template, 34 template tokens dropped, `hidden_states[-1]`, masked split and zero re-padding),
in float32 on the CPU with one thread.

The tokenizer is a tiny Qwen2-style byte-level BPE built here (Qwen2's pre-tokenizer regex, byte-level alphabet,
the chat special tokens) whose merges make every word of the template and of the prompts one token, as Qwen's
real vocabulary does for them: so the template's system part and `<|im_start|>user\\n` are exactly 34 tokens, the
count the pipeline drops. Words outside the vocabulary fall back to byte tokens.

Versions (the environment the committed fixtures were made in):
  - transformers 5.24.0 from PyPI; its models/qwen2_5_vl/modeling_qwen2_5_vl.py has sha256
    a24f2f5b295ab3578167232bc912926e89afd08416fc17e301ed5beea0d8933b.
  - diffusers 0.42.1 from PyPI; QwenImagePipeline as in github:huggingface/diffusers commit
    58eb52c0803ea9af3abec60841c2a093bdf1f951 (src/diffusers/pipelines/qwenimage/pipeline_qwenimage.py).
  - tokenizers 0.23.3, torch 2.15.0 (CPU), safetensors 0.8.0, Python 3.11.

Command (from the repository root; writes crates/framesmith-models/tests/fixtures/qwen25vl/):
  /work/venv-ref/bin/pip install transformers==5.24.0
  /work/venv-ref/bin/python bench/reference/qwen25vl.py

Files: config.json (the text config, prompts, template, versions), tokenizer.json (the tiny tokenizer),
weights.safetensors (the model's `state_dict()` under transformers' names, `lm_head.weight` left out, the small
vision tower kept so loaders are seen to skip it), inputs.safetensors (`input_ids`, `attention_mask` as the
official tokenizer call gives them) and expected.safetensors:
  - hidden_last    `hidden_states[-1]` [B, L, H] (the final RMSNorm's output), every position
  - hidden_skip2   `hidden_states[-3]` (HunyuanVideo 1.5's selection: after layer N-2, no final norm)
  - prompt_embeds, prompt_mask        `_get_qwen_prompt_embeds` (template dropped, re-padded with zeros)
  - prompt_embeds_msl5, prompt_mask_msl5   `encode_prompt(..., max_sequence_length=5)` (its mask is None when all
    ones; stored as ones)
  - template_prefix_ids   the ids of the template up to the prompt (`{}`), 34 of them"""
import hashlib
import json
import types
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, Regex

import diffusers
import transformers
from diffusers import QwenImagePipeline
from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

OUT = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/qwen25vl"

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]

PROMPTS = [
    "A red fox sits on a mossy rock at dawn, text \"HELLO\" above.",
    "cat",
    "Zebra? Ünïcode wörds fall back to bytes",
]

TEXT = {
    "vocab_size": None,  # set from the tokenizer
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]},
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
VISION = {
    "depth": 1,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_heads": 2,
    "out_hidden_size": 64,
    "patch_size": 2,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "fullatt_block_indexes": [0],
    "window_size": 8,
}


def byte_alphabet():
    """GPT-2's byte-to-unicode table, as byte-level BPE spells bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def build_tokenizer(template, first_merges=()):
    """A Qwen2-style byte-level BPE whose merges spell each pre-token of `words_text` as one token; `first_merges`
    (pairs of byte-level strings) come before them."""
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    vocab = {c: i for i, c in enumerate(byte_alphabet())}
    merges = []
    for left, right in first_merges:
        merges.append((left, right))
        vocab[left + right] = len(vocab)
    words_text = template.replace("{}", " ").replace("<|im_start|>", "\n").replace("<|im_end|>", "\n")
    words_text += " " + " ".join(PROMPTS[:2])
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


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)

    fake = types.SimpleNamespace()  # given the attributes QwenImagePipeline.__init__ sets
    template = (
        "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
        "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    )
    tok = build_tokenizer(template)
    tok_path = OUT / "tokenizer.json"
    tok.save(str(tok_path))
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tok_path), pad_token="<|endoftext|>")
    assert tokenizer.padding_side == "right"

    text = dict(
        TEXT,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    config = Qwen2_5_VLConfig(text_config=text, vision_config=VISION)
    config._attn_implementation = "eager"
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    with torch.no_grad():
        # Non-trivial norms and biases (the defaults are ones and zeros).
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight") or name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.2 + (1.0 if name.endswith("weight") else 0.0))

    fake.tokenizer = tokenizer
    fake.text_encoder = model
    fake.tokenizer_max_length = 1024
    fake.prompt_template_encode = template
    fake.prompt_template_encode_start_idx = 34
    fake._execution_device = torch.device("cpu")
    fake._extract_masked_hidden = types.MethodType(QwenImagePipeline._extract_masked_hidden, fake)
    fake._get_qwen_prompt_embeds = types.MethodType(QwenImagePipeline._get_qwen_prompt_embeds, fake)
    # The pipeline itself reads the template from the instance; check it is the one written above.
    src = Path(diffusers.__file__).parent / "pipelines/qwenimage/pipeline_qwenimage.py"
    assert json.dumps(template)[1:-1] in src.read_text(), "template differs from the pipeline's"

    prefix_ids = tokenizer(template.split("{}")[0])["input_ids"]
    assert len(prefix_ids) == 34, len(prefix_ids)

    with torch.no_grad():
        embeds, mask = fake._get_qwen_prompt_embeds(PROMPTS, torch.device("cpu"), torch.float32)
        embeds5, mask5 = QwenImagePipeline.encode_prompt(fake, PROMPTS, max_sequence_length=5)
        txt = [template.format(p) for p in PROMPTS]
        toks = tokenizer(txt, max_length=1024 + 34, padding=True, truncation=True, return_tensors="pt")
        out = model(input_ids=toks.input_ids, attention_mask=toks.attention_mask, output_hidden_states=True)
    if mask5 is None:
        # encode_prompt returns None for an all-ones mask; Framesmith always returns the mask.
        mask5 = torch.ones(embeds5.shape[:2], dtype=torch.int64)
    expected = {
        "hidden_last": out.hidden_states[-1].contiguous(),
        "hidden_skip2": out.hidden_states[-3].contiguous(),
        "prompt_embeds": embeds.contiguous(),
        "prompt_mask": mask.to(torch.int64).contiguous(),
        "prompt_embeds_msl5": embeds5.contiguous(),
        "prompt_mask_msl5": mask5.to(torch.int64).contiguous(),
        "template_prefix_ids": torch.tensor(prefix_ids, dtype=torch.int64),
    }
    inputs = {"input_ids": toks.input_ids.contiguous(), "attention_mask": toks.attention_mask.contiguous()}
    weights = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(weights, OUT / "weights.safetensors")
    save_file(inputs, OUT / "inputs.safetensors")
    save_file(expected, OUT / "expected.safetensors")

    modelling = Path(transformers.__file__).parent / "models/qwen2_5_vl/modeling_qwen2_5_vl.py"
    meta = {
        "kind": "qwen25vl_text_encoder",
        "source": {
            "transformers": transformers.__version__,
            "modeling_qwen2_5_vl.py sha256": hashlib.sha256(modelling.read_bytes()).hexdigest(),
            "diffusers": diffusers.__version__,
            "pipeline_qwenimage.py sha256": hashlib.sha256(src.read_bytes()).hexdigest(),
            "torch": torch.__version__,
        },
        "text_config": {k: v for k, v in text.items()},
        "prompts": PROMPTS,
        "template": template,
        "drop_idx": 34,
        "tokenizer_max_length": 1024,
    }
    (OUT / "config.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    print("embeds", tuple(embeds.shape), "mask", mask.tolist())
    print("ids", toks.input_ids.shape, toks.attention_mask.sum(1).tolist())


if __name__ == "__main__":
    main()
