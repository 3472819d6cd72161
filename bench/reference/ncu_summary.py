#!/usr/bin/env python3
"""Summarises an Nsight Compute CSV (`ncu --csv --page raw --print-units base --metrics gpu__time_duration.sum`)
per step: kernel time by class (matrix products, attention, copies and casts, normalisation, element-wise, ...)
and the kernels that take the most time, with their launch counts.

Usage: ncu_summary.py KERNELS.csv [--steps N]   (N: how many training steps the profile holds; times are divided
by it)."""
import argparse
import collections
import csv
import re
import sys

CLASSES = [
    # (class, pattern on the kernel name), first match wins
    ("attention (cuDNN / flash / SDPA)", r"cudnn|flash|fmha|sdpa|attention|attn"),
    ("matrix products (cuBLAS / CUTLASS)", r"gemm|nvjet|cutlass|xmma|sm90_|sm80_|cublas|splitK|ampere_|hopper"),
    ("FP8 quantise (activations, FP8 products)", r"fp8_quantize"),
    ("FP8 dequantise", r"fp8|dequant"),
    ("copies, casts, concatenation", r"copy|cast|cat|transpose|index|gather|scatter|fill|memset|contig"),
    ("norms (LayerNorm / RMSNorm)", r"_ln_|layer_?norm|rms"),
    ("RoPE", r"rope|rotary"),
    ("modulation / gated residual", r"modulate|gated|mod_param|scaled_"),
    ("GELU / activations", r"gelu|silu|tanh"),
    ("reductions", r"reduce|sum|mean|max|softmax"),
    ("optimizer", r"adam|optim|foreach|multi_tensor"),
]


def classify(name: str) -> str:
    low = name.lower()
    for label, pattern in CLASSES:
        if re.search(pattern, low):
            return label
    return "other element-wise"


def short(name: str) -> str:
    name = re.sub(r"\(.*", "", name)  # drop argument lists
    return name if len(name) <= 90 else name[:87] + "..."


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("csv")
    p.add_argument("--steps", type=float, default=1.0)
    a = p.parse_args()
    lines = open(a.csv, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print(f"{a.csv}: no ncu CSV header found", file=sys.stderr)
        return 1
    rows = csv.DictReader(lines[start:])
    by_class, by_name, counts = collections.Counter(), collections.Counter(), collections.Counter()
    total, kernels = 0.0, 0
    for r in rows:
        if not (r.get("ID") or "").isdigit():
            continue
        value = r.get("gpu__time_duration.sum")
        if value is None and r.get("Metric Name") in ("gpu__time_duration.sum", "Duration"):
            value = r.get("Metric Value")  # the long ("details") layout: one row per metric
        try:
            ns = float((value or "").replace(",", ""))
        except ValueError:
            continue
        name = r.get("Kernel Name") or r.get("Function Name") or "?"
        by_class[classify(name)] += ns
        by_name[short(name)] += ns
        counts[short(name)] += 1
        total += ns
        kernels += 1
    s = a.steps
    print(f"kernel time per step: {total / s / 1e6:.1f} ms over {kernels / s:.0f} launches "
          f"({kernels} kernels in {s:g} steps)")
    print()
    print(f"{'class':<40} {'ms/step':>9} {'share':>6}")
    for label, ns in by_class.most_common():
        print(f"{label:<40} {ns / s / 1e6:9.1f} {ns / total:6.1%}")
    print()
    print(f"{'kernel':<90} {'ms/step':>8} {'calls':>7} {'us/call':>8}")
    for name, ns in by_name.most_common(40):
        print(f"{name:<90} {ns / s / 1e6:8.1f} {counts[name] / s:7.0f} {ns / counts[name] / 1e3:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
