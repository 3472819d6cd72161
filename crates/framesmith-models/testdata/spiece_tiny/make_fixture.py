"""Regenerates the SentencePiece fixture of the umT5 tokenizer tests (`spiece.rs` tests): a tiny Unigram model
trained like T5's (<pad> 0, </s> 1, <unk> 2, byte fallback) and the ids `SentencePieceProcessor` gives for tricky
prompts, `</s>` appended as T5 does.

Not run by the tests: they read the files this writes. Run it by hand with `pip install sentencepiece` and
commit `tiny_unigram.model` and `expected_ids.json`:

    python3 make_fixture.py

The normalisation table is SentencePiece's own `nmt_nfkc`, restricted to the blocks prompts use (Latin,
punctuation, letterlike and enclosed forms, CJK symbols, ligatures, full-width forms, mathematical letters) and to
accented Latin letters written with combining marks: the full table is 240 KB, too large for a test fixture, and
a subset still compiles to a non-empty `precompiled_charsmap` in the same format.
"""

import json
import os
import tempfile
import unicodedata

import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "tiny_unigram.model")
EXPECTED = os.path.join(HERE, "expected_ids.json")

# The training text: several scripts, so the model has real pieces for each and falls back to bytes elsewhere.
CORPUS = """\
a red cat walks on the left of the frame while the camera pans slowly to the right
the blue square moves across a green background in bright daylight
a close-up photo of a dog running through tall grass, cinematic lighting
the sunset over the ocean, waves crashing on the rocks, golden hour
a woman in a red dress dances in the rain on a busy street at night
two children play football in the park, slow motion, shallow depth of field
un chat roux se promène dans un café parisien, naïve et élégant
le garçon mange une crème brûlée à côté de la fenêtre
ein großer Hund läuft über die grüne Wiese, schöne Aussicht
die Straße ist nass und die Lichter spiegeln sich im Wasser
el niño corre por la playa con su perro, atardecer en España
una señora mayor lee un libro en el jardín
a gata dorme no sofá da sala, luz suave da manhã
Привет, мир! Кошка сидит на окне и смотрит на улицу
Ελληνικά γράμματα και θάλασσα
東京の街を歩く猫、夕焼けの空
北京欢迎你，色调艳丽，过曝，静态
一只小狗在草地上奔跑
카메라가 천천히 움직인다
numbers like 1234567890 and 3.14 appear in captions
quotes "like this" and 'like that', commas, periods. and dashes - too
"""

# Prompts that exercise the normaliser, whitespace rules, scripts and byte fallback.
CASES = [
    "",
    "a red cat walks on the left",
    "   leading spaces",
    "trailing spaces   ",
    "several     spaces   inside",
    " ",
    "tabs\tand\nnewlines\r\nmixed",
    "ＦＵＬＬ－ＷＩＤＴＨ　ｔｅｘｔ！",
    "\u3000\u3000ideographic spaces\u3000",
    "\ufb01ne \ufb02owers o\ufb00",
    "① ② ③ ㎏ ™ ½ Ⅻ",
    "x² + y³ = z⁴",
    "café naïve résumé Ångström",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301",
    "東京の猫と北京の狗",
    "카메라 움직임",
    "emoji 🦀🎬 and 👍🏽",
    "rare 𓀀 ꙮ ᚠ",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐁𝐨𝐥𝐝",
    "Привет, мир! Ünïcödé",
    "Ελληνικά και العربية",
    "“curly quotes” and ‘single’ — dashes…",
    "zero\u200bwidth and\u00a0no-break",
    "control\u0007char\u007f",
    "\u2581meta symbol",
    "ALL CAPS and MiXeD case",
    "numbers 1234567890 3.14",
    "色调艳丽，过曝，静态，细节模糊不清",
]

RANGES = [
    (0x0000, 0x024F),
    (0x02B0, 0x036F),
    (0x2000, 0x2BFF),
    (0x3000, 0x33FF),
    (0xFB00, 0xFB4F),
    (0xFE30, 0xFE6F),
    (0xFF00, 0xFFEF),
    (0x1D400, 0x1D7FF),
]


def hexes(text):
    return " ".join(f"{ord(c):X}" for c in text)


def rules():
    """`nmt_nfkc` for single characters of RANGES and for Latin letters with one combining mark."""
    nmt = spm.SentencePieceNormalizer(
        rule_name="nmt_nfkc", add_dummy_prefix=False, remove_extra_whitespaces=False, escape_whitespaces=False
    )
    sources = [chr(cp) for lo, hi in RANGES for cp in range(lo, hi + 1) if not 0xD800 <= cp <= 0xDFFF]
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    sources += [base + chr(mark) for base in letters for mark in range(0x0300, 0x0328)]
    lines = []
    for source in sources:
        if source == "\0":
            continue
        target = nmt.normalize(source)
        if target != source and unicodedata.category(source[0]) != "Cs":
            lines.append(f"{hexes(source)}\t{hexes(target)}")
    return lines


def main():
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            for _ in range(20):
                f.write(CORPUS)
        tsv = os.path.join(tmp, "rules.tsv")
        with open(tsv, "w", encoding="utf-8") as f:
            f.write("\n".join(rules()) + "\n")
        spm.SentencePieceTrainer.train(
            input=corpus,
            model_prefix=os.path.join(tmp, "tiny"),
            model_type="unigram",
            vocab_size=500,
            byte_fallback=True,
            character_coverage=1.0,
            normalization_rule_tsv=tsv,
            pad_id=0,
            eos_id=1,
            unk_id=2,
            bos_id=-1,
            num_threads=1,
            seed_sentencepiece_size=5000,
        )
        with open(os.path.join(tmp, "tiny.model"), "rb") as f:
            model = f.read()
    with open(MODEL, "wb") as f:
        f.write(model)
    sp = spm.SentencePieceProcessor(model_proto=model)
    expected = [{"text": text, "ids": sp.encode(text) + [sp.eos_id()]} for text in CASES]
    with open(EXPECTED, "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(model)} bytes of model, {len(expected)} cases")


if __name__ == "__main__":
    main()
