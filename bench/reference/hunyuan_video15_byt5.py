"""Parity fixture for Framesmith's HunyuanVideo 1.5 glyph (byT5) encoder, made by the official code:
github:Tencent-Hunyuan/HunyuanVideo-1.5 commit 60783e704160023913bee78f0b47036d393d4dfa,
`hyvideo/models/text_encoders/byT5/__init__.py` (`add_special_token`: Glyph-SDXL-v2's colour and font tokens added
to the byT5 tokenizer and the encoder's embedding resized to them; the encoder is
`T5ForConditionalGeneration(...).get_encoder()`), `.../byT5/format_prompt.py` (`MultilingualPromptFormat`) and, from
`hyvideo/pipelines/hunyuan_video_pipeline.py`, `_extract_glyph_texts`, `get_byt5_text_tokens` and the steps of
`_process_single_byt5_prompt` (the quoted spans formatted `Text "…". `, tokenized to 256 with the end token and
padding, the encoder run with the mask). The official files are read from the repository mirror with `git show`
(MIRROR below); the encoder's weights are random at a small size, float32 on the CPU with one thread.

Glyph-SDXL-v2's `color_idx.json` (138 colours) and `multilingual_10-lang_idx.json` (988 fonts: 512 en, 143 cn, 211 jp,
122 kr, each numbered from 0 in that order) are not in the official repository; they are written here with those
names and counts, which are the ones of the copy musubi-tuner embeds (kohya-ss/musubi-tuner 30c658c,
`hunyuan_video_1_5_text_encoder.py`). Only the token count and order matter: the fixture's vocabulary is
384 + 138 + 988 = 1510, as in the released `byt5_model.pt`.

Versions: transformers 5.24.0; torch 2.15.0 (CPU).

Command (from the repository root; writes crates/framesmith-models/tests/fixtures/hunyuan_video15_byt5/):
  /work/venv-ref/bin/python bench/reference/hunyuan_video15_byt5.py

Files: config.json (kind, the T5 config, prompts, the official glyph texts, max length), byt5_model.pt (the
encoder's `state_dict()` as the official checkpoint stores it: T5Stack names, `embed_tokens.weight`, `block.N.*`,
`final_layer_norm.weight`), weights.safetensors (the same under ComfyUI's names: `shared.weight`, `encoder.*`),
inputs.safetensors (`input_ids`, `attention_mask` [P, 256] of the prompts that quote something) and
expected.safetensors (`hidden` [P, 256, d], the encoder's output on them, pad positions included)."""
import ast
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch
from safetensors.torch import save_file

import transformers
from transformers import ByT5Tokenizer, T5Config, T5ForConditionalGeneration

MIRROR = "/work/.mirror/Tencent-Hunyuan+HunyuanVideo-1.5/repo"
COMMIT = "60783e704160023913bee78f0b47036d393d4dfa"
OUT = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/hunyuan_video15_byt5"
MAX_LENGTH = 256
FONTS = [("en", 512), ("cn", 143), ("jp", 211), ("kr", 122)]
COLORS = 138
PROMPTS = [
    'A neon sign reading "OPEN 24/7" flickers above a door, and “café” is painted on the window.',
    "A quiet forest at dawn, nothing written anywhere.",
    'Repeated "A" and "A" and "B", an unclosed "quote\nacross lines", and an empty "".',
    'Special strings "x <color-3> y <en-font-511> z <kr-font-121> <pad> </s> <unk> <extra_id_7> <color-999>".',
    'Ünïcode “日本語のテキスト” and a long one "' + "abcdefghij" * 30 + '" after it.',
]


def official(path):
    return subprocess.run(["git", "-C", MIRROR, "show", f"{COMMIT}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def load_module(name, source):
    module = types.ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)
    return module


def pipeline_functions():
    """`_extract_glyph_texts` and `get_byt5_text_tokens` from the official pipeline file, compiled alone."""
    source = official("hyvideo/pipelines/hunyuan_video_pipeline.py")
    tree = ast.parse(source)
    wanted = {"_extract_glyph_texts", "get_byt5_text_tokens"}
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            node.decorator_list = []
            namespace = {"re": __import__("re")}
            exec(compile(ast.Module([node], []), "pipeline", "exec"), namespace)
            found[node.name] = namespace[node.name]
    assert set(found) == wanted, found.keys()
    return found


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    byt5 = load_module("byt5", official("hyvideo/models/text_encoders/byT5/__init__.py"))
    fmt = load_module("format_prompt", official("hyvideo/models/text_encoders/byT5/format_prompt.py"))
    fns = pipeline_functions()
    assets = Path(tempfile.mkdtemp())
    fonts = {f"{lang}-font{i}": i for lang, n in FONTS for i in range(n)}
    colors = {f"colour{i}": i for i in range(COLORS)}
    (assets / "font.json").write_text(json.dumps(fonts))
    (assets / "color.json").write_text(json.dumps(colors))

    init = dict(vocab_size=384, d_model=32, d_kv=8, num_heads=4, d_ff=48, num_layers=2, num_decoder_layers=1,
                feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
                relative_attention_max_distance=128, layer_norm_epsilon=1e-6, dropout_rate=0.0,
                tie_word_embeddings=False, is_encoder_decoder=True, pad_token_id=0, eos_token_id=1)
    encoder = T5ForConditionalGeneration(T5Config(**init)).get_encoder().eval()
    tokenizer = ByT5Tokenizer()
    byt5.add_special_token(tokenizer, encoder, add_color=True, add_font=True, color_ann_path=str(assets / "color.json"),
                           font_ann_path=str(assets / "font.json"), multilingual=True)
    with torch.no_grad():
        for p in encoder.parameters():
            p.normal_(0.0, 0.5)
    vocab = encoder.embed_tokens.weight.shape[0]
    assert vocab == 384 + COLORS + sum(n for _, n in FONTS) == 1510, vocab
    prompt_format = fmt.MultilingualPromptFormat(font_path=str(assets / "font.json"),
                                                 color_path=str(assets / "color.json"))

    glyph_texts, ids, masks, hidden = [], [], [], []
    for prompt in PROMPTS:
        texts = fns["_extract_glyph_texts"](None, prompt)
        if not texts:
            glyph_texts.append(None)
            continue
        styles = [{"color": None, "font-family": None} for _ in texts]
        formatted = prompt_format.format_prompt(texts, styles)
        glyph_texts.append(formatted)
        text_ids, text_mask = fns["get_byt5_text_tokens"](tokenizer, MAX_LENGTH, formatted)
        with torch.no_grad():
            out = encoder(text_ids, attention_mask=text_mask.float())[0]
        ids.append(text_ids)
        masks.append(text_mask)
        hidden.append(out)

    state = {k: v.contiguous() for k, v in encoder.state_dict().items()}
    torch.save(state, OUT / "byt5_model.pt")
    comfy = {("shared.weight" if k == "embed_tokens.weight" else f"encoder.{k}"): v for k, v in state.items()}
    save_file(comfy, OUT / "weights.safetensors")
    save_file({"input_ids": torch.cat(ids), "attention_mask": torch.cat(masks)}, OUT / "inputs.safetensors")
    save_file({"hidden": torch.cat(hidden)}, OUT / "expected.safetensors")
    config = {
        "kind": "hunyuan_video15_byt5",
        "source": {"HunyuanVideo-1.5": COMMIT, "transformers": transformers.__version__, "torch": torch.__version__},
        "t5_config": {k: init[k] for k in ("d_model", "d_kv", "num_heads", "d_ff", "num_layers",
                                           "relative_attention_num_buckets", "relative_attention_max_distance",
                                           "layer_norm_epsilon", "feed_forward_proj")} | {"vocab_size": vocab},
        "max_length": MAX_LENGTH,
        "prompts": PROMPTS,
        "glyph_texts": glyph_texts,
    }
    (OUT / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(glyph_texts, ensure_ascii=False, indent=1))
    print("lengths", [int(m.sum()) for m in masks], "vocab", vocab, "->", OUT)


if __name__ == "__main__":
    sys.exit(main())
