"""Independent NumPy reference for Wan's CLIP image encoder (the visual tower of open-clip
xlm-roberta-large-vit-huge-14 as `wan/modules/clip.py` runs it), at a tiny size.

Written from the architecture, not from the official code: bicubic resize with PyTorch's semantics
(`F.interpolate(mode='bicubic', align_corners=False)`: cubic convolution A = -0.75, source index
scale * (i + 0.5) - 0.5 left unclamped, taps clamped to the border, no antialias), [-1, 1] -> [0, 1],
normalisation with the OpenAI CLIP mean/std, a bias-free patch convolution, class token, learned
positions, `pre_norm` LayerNorm, then every block but the last (`use_31_block=True`): pre-norm
attention (fused qkv, softmax(q k^T / sqrt(d)) v, proj) and a pre-norm exact-erf GELU MLP.

Writes `tests/fixtures/clip_tiny/{weights,io}.safetensors` with NumPy and the standard library only.
Run from the repository root: `python3 tests/reference/clip_tiny.py`.
"""

import json
import math
import os
import struct

import numpy as np

# Tiny config (ClipVisionConfig::tiny in crates/framesmith-models/src/wan/clip.rs).
IMAGE = 28
PATCH = 7
DIM = 32
HEADS = 4
MLP = 64
LAYERS = 3
EPS = 1e-5
MEAN = np.array([0.48145466, 0.4578275, 0.40821073])
STD = np.array([0.26862954, 0.26130258, 0.27577711])

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "clip_tiny")


def cubic_weights(t, a=-0.75):
    """Weights of taps at offsets -1, 0, 1, 2 for fractional position t in [0, 1)."""

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.array([far(t + 1), near(t), near(1 - t), far(2 - t)])


def resize_axis(x, axis, out):
    n = x.shape[axis]
    scale = n / out
    x = np.moveaxis(x, axis, 0)
    res = np.zeros((out,) + x.shape[1:])
    for i in range(out):
        real = scale * (i + 0.5) - 0.5
        base = math.floor(real)
        w = cubic_weights(real - base)
        for k in range(4):
            src = min(max(base - 1 + k, 0), n - 1)
            res[i] += w[k] * x[src]
    return np.moveaxis(res, 0, axis)


def bicubic(img, size):
    """img [C, H, W] -> [C, size, size]."""
    return resize_axis(resize_axis(img, 1, size), 2, size)


def layer_norm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + EPS) * w + b


def gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def linear(x, p, name):
    return x @ p[name + ".weight"].T + p[name + ".bias"]


def block(x, p, pre):
    s = x.shape[0]
    d = DIM // HEADS
    h = layer_norm(x, p[pre + "norm1.weight"], p[pre + "norm1.bias"])
    qkv = linear(h, p, pre + "attn.to_qkv").reshape(s, 3, HEADS, d)
    q, k, v = (qkv[:, i].transpose(1, 0, 2) for i in range(3))  # [heads, s, d]
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    attn = scores / scores.sum(-1, keepdims=True)
    o = (attn @ v).transpose(1, 0, 2).reshape(s, DIM)
    x = x + linear(o, p, pre + "attn.proj")
    h = layer_norm(x, p[pre + "norm2.weight"], p[pre + "norm2.bias"])
    return x + linear(gelu(linear(h, p, pre + "mlp.0")), p, pre + "mlp.2")


def visual(pixels, p):
    """pixels [3, IMAGE, IMAGE] normalised -> features [tokens, DIM] after LAYERS - 1 blocks."""
    g = IMAGE // PATCH
    patches = pixels.reshape(3, g, PATCH, g, PATCH).transpose(1, 3, 0, 2, 4).reshape(g * g, -1)
    tokens = patches @ p["visual.patch_embedding.weight"].reshape(DIM, -1).T
    x = np.concatenate([p["visual.cls_embedding"][0], tokens], 0) + p["visual.pos_embedding"][0]
    x = layer_norm(x, p["visual.pre_norm.weight"], p["visual.pre_norm.bias"])
    for i in range(LAYERS - 1):
        x = block(x, p, f"visual.transformer.{i}.")
    return x


def random_weights(rng):
    p = {}

    def mat(name, shape):
        fan_in = int(np.prod(shape[1:]))
        p[name] = rng.normal(0, 1 / math.sqrt(fan_in), shape)

    def norm(name, n):
        p[name + ".weight"] = 1 + rng.normal(0, 0.1, n)
        p[name + ".bias"] = rng.normal(0, 0.05, n)

    mat("visual.patch_embedding.weight", (DIM, 3, PATCH, PATCH))
    p["visual.cls_embedding"] = rng.normal(0, 1 / math.sqrt(DIM), (1, 1, DIM))
    p["visual.pos_embedding"] = rng.normal(0, 1 / math.sqrt(DIM), (1, (IMAGE // PATCH) ** 2 + 1, DIM))
    norm("visual.pre_norm", DIM)
    for i in range(LAYERS):
        pre = f"visual.transformer.{i}."
        norm(pre + "norm1", DIM)
        norm(pre + "norm2", DIM)
        for name, (o, n) in {"attn.to_qkv": (3 * DIM, DIM), "attn.proj": (DIM, DIM), "mlp.0": (MLP, DIM),
                             "mlp.2": (DIM, MLP)}.items():
            mat(pre + name + ".weight", (o, n))
            p[pre + name + ".bias"] = rng.normal(0, 0.05, o)
    norm("visual.post_norm", DIM)
    p["visual.head"] = rng.normal(0, 0.1, (DIM, 16))
    # The text tower and logit scale share the official file; the loader must skip them.
    p["textual.token_embedding.weight"] = rng.normal(0, 1, (8, 16))
    p["log_scale"] = np.array(math.log(1 / 0.07))
    return {k: v.astype(np.float32) for k, v in p.items()}


def save_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def main():
    rng = np.random.default_rng(20250805)
    weights = random_weights(rng)
    # A non-square image in [-1, 1]: 33 -> 28 columns (down) and 19 -> 28 rows (up).
    image = rng.uniform(-1, 1, (3, 19, 33)).astype(np.float32)
    pixels = bicubic(image.astype(np.float64), IMAGE) * 0.5 + 0.5
    pixels = (pixels - MEAN[:, None, None]) / STD[:, None, None]
    p64 = {k: v.astype(np.float64) for k, v in weights.items()}
    features = visual(pixels, p64)
    os.makedirs(OUT, exist_ok=True)
    save_safetensors(os.path.join(OUT, "weights.safetensors"), weights)
    save_safetensors(os.path.join(OUT, "io.safetensors"), {
        "image": image,
        "pixels": pixels[None].astype(np.float32),
        "features": features[None].astype(np.float32),
    })
    print("features", features.shape, "abs mean", np.abs(features).mean())


if __name__ == "__main__":
    main()
