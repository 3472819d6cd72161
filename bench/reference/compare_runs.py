#!/usr/bin/env python3
"""Compares training runs of the same project: their per-step losses (from `framesmith train`'s log) and the
LoRAs they saved, as the weight deltas the LoRAs make (delta W = up @ down * alpha / rank per module).

    compare_runs.py REF_LOG REF_LORA NAME=LOG=LORA [NAME=LOG=LORA ...]

For each other run against the reference: the mean and largest |loss - ref loss| / ref loss over the steps both
logged, the spread of the reference's own losses (their standard deviation over the steps, what a timestep and
noise draw moves the loss by), and per module the cosine similarity of the deltas and ||dW - dW_ref|| / ||dW_ref||
(median and worst module). The cosines are computed from the low-rank factors (r x r products on the GPU when
there is one), never forming a [out, in] delta. Prints a JSON line per run, prefixed with COMPARE.
"""

import json
import re
import statistics
import struct
import sys

import torch

DTYPES = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F64": torch.float64,
}


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        buf = bytearray(data[start:end])
        t = torch.frombuffer(buf, dtype=DTYPES[info["dtype"]]) if buf else torch.zeros(0)
        out[name] = t.reshape(info["shape"]).to(torch.float64)
    return out


def modules(tensors):
    """{module: (down [r, in], up [out, r], scale)} for kohya-style keys (`.lora_down.weight`, `.lora_up.weight`,
    `.alpha`)."""
    found = {}
    for name, t in tensors.items():
        m = re.match(r"(.*)\.lora_(down|up)\.weight$", name)
        if m:
            found.setdefault(m.group(1), {})[m.group(2)] = t
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out = {}
    for mod, parts in found.items():
        down, up = parts["down"].to(dev), parts["up"].to(dev)
        rank = down.shape[0]
        alpha = tensors.get(f"{mod}.alpha")
        scale = (float(alpha.reshape(-1)[0]) / rank) if alpha is not None else 1.0
        out[mod] = (down.reshape(rank, -1), up.reshape(up.shape[0], rank), scale)
    return out


def inner(a, b):
    """<up_a down_a, up_b down_b>_F = sum((up_aT up_b) * (down_a down_bT))."""
    (da, ua, sa), (db, ub, sb) = a, b
    return float(((ua.T @ ub) * (da @ db.T)).sum()) * sa * sb


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"step (\d+)/\d+\s+loss ([0-9.eE+-]+|nan|inf)", line.strip())
            if m:
                out[int(m.group(1))] = float(m.group(2))
    return out


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    ref_loss = losses(sys.argv[1])
    ref = modules(read_safetensors(sys.argv[2]))
    ref_norm = {k: inner(v, v) ** 0.5 for k, v in ref.items()}
    spread = statistics.pstdev(ref_loss.values()) if len(ref_loss) > 1 else 0.0
    for spec in sys.argv[3:]:
        name, log, lora = spec.split("=", 2)
        run_loss = losses(log)
        steps = sorted(set(ref_loss) & set(run_loss))
        rel = [abs(run_loss[s] - ref_loss[s]) / abs(ref_loss[s]) for s in steps if ref_loss[s] != 0]
        run = modules(read_safetensors(lora))
        if set(run) != set(ref):
            sys.exit(f"{name}: its LoRA's modules differ from the reference's")
        cos, diff = [], []
        for mod, (r, n) in ((m, (ref[m], ref_norm[m])) for m in ref):
            o = run[mod]
            on = inner(o, o) ** 0.5
            cross = inner(r, o)
            cos.append((cross / (n * on)) if n > 0 and on > 0 else float("nan"))
            d2 = max(n * n + on * on - 2 * cross, 0.0)
            diff.append((d2 ** 0.5 / n) if n > 0 else float("nan"))
        worst = min(range(len(cos)), key=lambda i: cos[i])
        names = list(ref)
        print("COMPARE " + json.dumps({
            "run": name,
            "steps": len(steps),
            "loss_rel_mean": statistics.fmean(rel) if rel else None,
            "loss_rel_max": max(rel) if rel else None,
            "ref_loss_mean": statistics.fmean(ref_loss[s] for s in steps) if steps else None,
            "run_loss_mean": statistics.fmean(run_loss[s] for s in steps) if steps else None,
            "ref_loss_spread": spread,
            "modules": len(cos),
            "cos_median": statistics.median(cos),
            "cos_min": cos[worst],
            "cos_min_module": names[worst],
            "delta_rel_median": statistics.median(diff),
            "delta_rel_max": max(diff),
        }))


if __name__ == "__main__":
    main()
