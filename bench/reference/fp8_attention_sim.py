#!/usr/bin/env python3
"""What FP8 attention's numerics should cost, emulated in float32 on the CPU: the recipe of framesmith's FP8
attention on Hopper (kernels/fp8_attention.cu) applied to one attention forward and backward, against a bf16
emulation of cuDNN's bf16 kernel and against float32. Prints the same measures as `framesmith-bench
attention-fp8` (max |a - b| / max |b| and mean |a - b| / mean |b| of O, dQ, dK, dV), so the device check's numbers
can be read against what the recipe itself predicts at a small size.

    fp8_attention_sim.py [--tokens 1024] [--heads 2] [--qk-gain 1] [--seed 0]

Recipe: q, k, v, o and dO in e4m3fn with scale 448 / amax of the tensor; the softmax probabilities at scale 448;
O (e4m3fn) with v's scale; dP (the scaled softmax gradient), dQ, dK, dV at 448 / (2 * amax), the amax a
calibration pass measured (the delayed history's first value). Products accumulate in float32.
"""

import argparse

import torch

E4M3 = torch.float8_e4m3fn


def fp8(x, scale):
    """x rounded through e4m3fn at `scale` (saturating at +-448), back in float32."""
    return (x * scale).clamp(-448.0, 448.0).to(E4M3).to(torch.float32) / scale


def current(x):
    amax = x.abs().max().item()
    return 448.0 / amax if amax > 0 else 1.0


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def reference(q, k, v, d_o, scale, round_p=lambda p: p):
    s = q @ k.transpose(-1, -2) * scale
    p = torch.softmax(s, dim=-1)
    o = round_p(p) @ v
    dp = d_o @ v.transpose(-1, -2)
    d = (d_o * o).sum(-1, keepdim=True)
    ds = p * (dp - d) * scale
    return o, ds @ k, ds.transpose(-1, -2) @ q, round_p(p).transpose(-1, -2) @ d_o


def fp8_attention(q, k, v, d_o, scale):
    q8, k8, v8 = fp8(q, current(q)), fp8(k, current(k)), fp8(v, current(v))
    s = q8 @ k8.transpose(-1, -2) * scale
    p = torch.softmax(s, dim=-1)
    p8 = fp8(p, 448.0)
    o = p8 @ v8
    o8 = fp8(o, current(v))
    do8 = fp8(d_o, current(d_o))
    o8b = fp8(o8, current(o8))
    dp = do8 @ v8.transpose(-1, -2)
    d = (do8 * o8b).sum(-1, keepdim=True)
    ds = p * (dp - d) * scale
    ds8 = fp8(ds, 448.0 / (2 * ds.abs().max().item()))
    dq, dk, dv = ds8 @ k8, ds8.transpose(-1, -2) @ q8, p8.transpose(-1, -2) @ do8
    delayed = lambda x: fp8(x, 448.0 / (2 * x.abs().max().item()))
    return o8, delayed(dq), delayed(dk), delayed(dv)


def deviation(a, b):
    diff = (a - b).abs()
    return (diff.max() / b.abs().max()).item(), (diff.mean() / b.abs().mean()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--qk-gain", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    shape = (args.heads, args.tokens, args.head_dim)
    q, k = (bf16(torch.randn(shape) * args.qk_gain) for _ in range(2))
    v, d_o = bf16(torch.randn(shape)), bf16(torch.randn(shape))
    scale = args.head_dim ** -0.5
    exact = reference(q, k, v, d_o, scale)
    b16 = [bf16(t) for t in reference(q, k, v, d_o, scale, round_p=bf16)]
    f8 = fp8_attention(q, k, v, d_o, scale)
    print(f"tokens {args.tokens}, heads {args.heads}, head dim {args.head_dim}, q/k gain {args.qk_gain}")
    print(f"{'tensor':<6} {'fp8 vs bf16 max':>16} {'mean':>10} {'fp8 vs f32 max':>16} {'mean':>10} "
          f"{'bf16 vs f32 max':>16} {'mean':>10}")
    for name, a, b, e in zip(("O", "dQ", "dK", "dV"), f8, b16, exact):
        cols = [*deviation(a, b), *deviation(a, e), *deviation(b, e)]
        print(f"{name:<6} {cols[0]:>16.3e} {cols[1]:>10.3e} {cols[2]:>16.3e} {cols[3]:>10.3e} "
              f"{cols[4]:>16.3e} {cols[5]:>10.3e}")


if __name__ == "__main__":
    main()
