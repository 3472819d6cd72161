"""Parity fixtures for Framesmith's LTX-2 / LTX-2.3 text side, made by the official implementation with random
weights at small shapes: the prompt tokenised by ltx-core's `LTXGemmaTokenizer` (left padding to its max length, a
leading <bos>, no <eos>), Gemma 3 run by ltx-core's `LTXGemmaTextEncoder.encode` (transformers'
`Gemma3ForConditionalGeneration`, every hidden state), then ltx-core's `EmbeddingsProcessor.process_hidden_states`
(the feature extractor the checkpoint's config selects: V1 for LTX-2, V2 for LTX-2.3; the video connector
`Embeddings1DConnector` with its learnable registers, and the audio connector of an audio-video release, whose
output sound is sampled with), in float32 on the CPU with one thread.

Official code: github:Lightricks/LTX-2 (package ltx-core 1.2.0) at commit 400fd31054597515f47125691032c04b1c3ee24e
(`ltx_core.text_encoders.gemma`), and Hugging Face transformers 5.24.0 (`transformers.models.gemma3`).

Versions (the environment the committed fixtures were made in): torch 2.15.0 (CPU), transformers 5.24.0,
tokenizers 0.23.3, safetensors 0.8.0, numpy 2.4.6, einops 0.8.x, Python 3.11.

Command (from the repository root; writes crates/framesmith-models/tests/fixtures/ltx2_text/<case>/):
  git clone https://github.com/Lightricks/LTX-2 /tmp/LTX-2 && git -C /tmp/LTX-2 checkout 400fd310
  PYTHONPATH=/tmp/LTX-2/packages/ltx-core/src /work/venv-ref/bin/python bench/reference/ltx2_text.py

Cases (README.md beside the fixtures says what each holds):
  ltx2   LTX-2 (19B)'s text side: FeatureExtractorV1 (masked mean / range normalisation of every layer,
         `text_embedding_projection.aggregate_embed` without bias to Gemma's width), a 2-layer connector of
         Gemma's width; Gemma weights as the official google/gemma-3-12b-it folder stores them
         (`language_model.model.*`, config.json in the release's style).
  ltx23  LTX-2.3 (22B)'s: FeatureExtractorV2 (per-token RMS norm, rescaled, `video_aggregate_embed` with bias to
         the transformer's width), a 3-layer connector with gated attention and no feed-forward bias, RoPE max
         position 4096; Gemma weights as ComfyUI's single text-encoder file stores them (`model.*`).
"""
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, PreTrainedTokenizerFast

from ltx_core.text_encoders.gemma.embeddings_connector import (
    AudioEmbeddings1DConnectorConfigurator,
    Embeddings1DConnectorConfigurator,
)
from ltx_core.text_encoders.gemma.embeddings_processor import EmbeddingsProcessor
from ltx_core.text_encoders.gemma.encoders.base_encoder import LTXGemmaTextEncoder
from ltx_core.text_encoders.gemma.encoders.encoder_configurator import _create_feature_extractor
from ltx_core.text_encoders.gemma.tokenizer import LTXGemmaTokenizer, PaddingSide

COMMIT = "400fd31054597515f47125691032c04b1c3ee24e"
OUT = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/ltx2_text"

# Where the release keeps the audio connector.
AUDIO_CONNECTOR_PREFIX = "model.diffusion_model.audio_embeddings_connector."
# Gemma's special tokens at the ids the real tokenizer gives them.
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>"]
WORDS = (
    "a red fox runs through deep snow at dawn while mist rises over the frozen lake and "
    "camera pans slowly to follow it , . woman in blue coat walks city street night rain neon"
).split()
# A multiple of the connector's 128 registers (the release's 1024 is too).
MAX_LENGTH = 128
PROMPTS = [
    "  a red fox runs through deep snow  ",
    "woman in blue coat walks",
    # More words than MAX_LENGTH - 1: truncated.
    " ".join(WORDS[i % len(WORDS)] for i in range(7 * 23)),
    "neon",
]

GEMMA_TEXT = {
    "vocab_size": len(SPECIAL) + len(WORDS),
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    # Not head_dim: the query's scale is its own (12B has 256 for both).
    "query_pre_attn_scalar": 12,
    "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh",
    # Smaller than MAX_LENGTH, so the sliding layers' window shows.
    "sliding_window": 4,
    "sliding_window_pattern": 2,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "max_position_embeddings": 256,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "model_type": "gemma3_text",
}
VISION = {
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
    "model_type": "siglip_vision_model",
}

CASES = {
    "ltx2": {
        "transformer": {"num_attention_heads": 2, "attention_head_dim": 8, "connector_num_attention_heads": 2,
                        "connector_attention_head_dim": 8, "connector_num_layers": 2, "rope_type": "split",
                        "frequencies_precision": "float64", "caption_channels": 16},
        "gemma_prefix": "language_model.model.",
        "gemma_layout": "folder",
        "release": "LTX-2",
        "connector_prefix": "model.diffusion_model.video_embeddings_connector.",
        "seed": 11,
    },
    "ltx23": {
        "transformer": {"num_attention_heads": 3, "attention_head_dim": 8, "audio_num_attention_heads": 2,
                        "audio_attention_head_dim": 4, "connector_num_attention_heads": 3,
                        "connector_attention_head_dim": 8, "connector_num_layers": 3,
                        "connector_apply_gated_attention": True, "connector_ff_bias": False,
                        "connector_positional_embedding_max_pos": [4096], "audio_connector_num_attention_heads": 2,
                        "audio_connector_attention_head_dim": 4, "rope_type": "split",
                        "frequencies_precision": "float64", "apply_gated_attention": True,
                        "cross_attention_adaln": True, "caption_proj_before_connector": True,
                        "caption_projection_first_linear": False, "caption_proj_input_norm": False,
                        "caption_projection_second_linear": False},
        "gemma_prefix": "model.",
        "gemma_layout": "single_file",
        "release": "LTX-2.3",
        "connector_prefix": "model.diffusion_model.video_embeddings_connector.",
        "seed": 23,
    },
}


def tokenizer_json() -> Tokenizer:
    """A small word-level tokenizer with Gemma's special tokens and its `<bos> $A` post-processor."""
    vocab = {t: i for i, t in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIAL)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return tok


def randomise(module: torch.nn.Module, gen: torch.Generator) -> None:
    """Every parameter drawn again: matrices N(0, 1/fan_in), vectors (norm weights, biases) N(0, 0.3²), the
    embedding N(0, 1)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim >= 2 and "embed_tokens" not in name and "learnable_registers" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif "learnable_registers" in name:
                p.copy_(torch.rand(p.shape, generator=gen) * 2 - 1)
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def make_case(name: str, case: dict) -> None:
    out = OUT / name
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(case["seed"])
    torch.manual_seed(case["seed"])

    tok = tokenizer_json()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                     pad_token="<pad>", unk_token="<unk>")
    ltx_tok = LTXGemmaTokenizer(hf_tok, MAX_LENGTH, padding_side=PaddingSide.LEFT)

    config_json = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                   "text_config": GEMMA_TEXT, "vision_config": VISION, "mm_tokens_per_image": 4,
                   "boi_token_index": 3, "eoi_token_index": 3, "image_token_index": 3}
    config = Gemma3Config(**{k: v for k, v in config_json.items() if k != "architectures"})
    config.text_config._attn_implementation = "eager"
    model = Gemma3ForConditionalGeneration(config).eval()
    randomise(model, gen)
    encoder = LTXGemmaTextEncoder(model=model, tokenizer=ltx_tok, dtype=torch.float32)

    metadata = {"config": {"transformer": case["transformer"]}}
    processor = EmbeddingsProcessor(
        feature_extractor=_create_feature_extractor(case["transformer"], config.text_config),
        video_connector=Embeddings1DConnectorConfigurator.from_metadata(metadata),
        # The release is audio-video: the audio connector runs too (the audio stream reads its output).
        audio_connector=AudioEmbeddings1DConnectorConfigurator.from_metadata(metadata),
    ).float().eval()
    randomise(processor, gen)

    with torch.no_grad():
        encoded = encoder.encode(PROMPTS)
        expected = {}
        for i, (hidden, mask) in enumerate(encoded):
            ids = torch.tensor([[t for t, _ in ltx_tok.tokenize_with_weights(PROMPTS[i])["gemma"]]])
            expected[f"p{i}.ids"] = ids.to(torch.int64)
            expected[f"p{i}.mask"] = mask.to(torch.int64)
            for layer in range(len(hidden)):
                expected[f"p{i}.hidden.{layer}"] = hidden[layer][0].contiguous()
            video, audio = processor.feature_extractor(hidden, mask, "left")
            expected[f"p{i}.features"] = video[0].contiguous()
            expected[f"p{i}.audio_features"] = audio[0].clone().contiguous()
            result = processor.process_hidden_states(hidden, mask, "left")
            expected[f"p{i}.video_encoding"] = result.video_encoding[0].contiguous()
            expected[f"p{i}.audio_encoding"] = result.audio_encoding[0].contiguous()
            expected[f"p{i}.attention_mask"] = result.attention_mask[0].to(torch.int64).contiguous()

    # Gemma's language model under the case's prefix (the vision tower and lm_head are not read): a Hugging Face
    # folder (config.json + shard), or one file with the config in its `gemma_config` metadata and the tokenizer
    # in a `tokenizer_json` tensor, as ltx-core packs its single-file text encoders.
    gemma = {}
    for key, value in model.state_dict().items():
        if key.startswith("model.language_model."):
            gemma[case["gemma_prefix"] + key.removeprefix("model.language_model.")] = value.contiguous()
    if case["gemma_layout"] == "folder":
        (out / "gemma").mkdir(exist_ok=True)
        save_file(gemma, out / "gemma" / "model-00001-of-00001.safetensors")
        (out / "gemma" / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
        tok.save(str(out / "gemma" / "tokenizer.json"))
    else:
        gemma["tokenizer_json"] = torch.frombuffer(bytearray(tok.to_str().encode()), dtype=torch.uint8)
        save_file(gemma, out / "gemma_3_12B_it.safetensors", metadata={"gemma_config": json.dumps(config_json)})

    # The LTX-2 checkpoint's text parts under the release's names, with its config metadata.
    ltx = {}
    for key, value in processor.state_dict().items():
        if key.startswith("feature_extractor."):
            ltx["text_embedding_projection." + key.removeprefix("feature_extractor.")] = value.contiguous()
        elif key.startswith("video_connector."):
            ltx[case["connector_prefix"] + key.removeprefix("video_connector.")] = value.contiguous()
        elif key.startswith("audio_connector."):
            ltx[AUDIO_CONNECTOR_PREFIX + key.removeprefix("audio_connector.")] = value.contiguous()
    save_file(ltx, out / "ltx_text.safetensors",
              metadata={"config": json.dumps({"transformer": case["transformer"]})})
    inputs = {"ids": torch.cat([expected.pop(f"p{i}.ids") for i in range(len(PROMPTS))]),
              "mask": torch.cat([expected.pop(f"p{i}.mask") for i in range(len(PROMPTS))])}
    save_file(inputs, out / "inputs.safetensors")
    save_file(expected, out / "expected.safetensors")
    (out / "config.json").write_text(json.dumps({
        "kind": "ltx2_text", "commit": COMMIT, "release": case["release"], "gemma_layout": case["gemma_layout"],
        "prompts": PROMPTS, "max_length": MAX_LENGTH, "hidden_states": GEMMA_TEXT["num_hidden_layers"] + 1,
        "seed": case["seed"],
    }, indent=2) + "\n")
    print(name, {k: list(v.shape) for k, v in {**inputs, **expected}.items() if not k[1:2].isdigit() or k.startswith("p0.")})


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name, case in CASES.items():
        make_case(name, case)


if __name__ == "__main__":
    main()
