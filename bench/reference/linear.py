"""PyTorch reference for `framesmith-bench linear`: a frozen bf16 Linear (no bias) forward plus input gradient
(the weight does not require grad, so autograd computes dx only), and the same with an FP8 e4m3fn weight with
block-64 f32 scales dequantised to bf16 in eager PyTorch inside the step."""
import argparse

import torch
import torch.nn.functional as F

from common import emit, time_cuda


def dequant(w8, scale):
    n, k = w8.shape
    return (w8.to(torch.float32).view(n, k // 64, 64) * scale[..., None]).to(torch.bfloat16).view(n, k)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--ffn", type=int, required=True)
    p.add_argument("--tokens", type=int, default=32760)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    dev = torch.device("cuda")
    m = a.tokens
    for layer, n, k in [("qkvo", a.dim, a.dim), ("ffn_up", a.ffn, a.dim), ("ffn_down", a.dim, a.ffn)]:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16).requires_grad_()
        dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        w = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
        w8 = (torch.randn(n, k, device=dev) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
        scale = torch.rand(n, k // 64, device=dev) * 1e-3 + 1e-4
        shape = f"m={m} n={n} k={k}"
        flops = 4.0 * m * n * k

        def step_bf16():
            F.linear(x, w).backward(dy)
            x.grad = None

        def step_fp8():
            F.linear(x, dequant(w8, scale)).backward(dy)
            x.grad = None

        ms, peak = time_cuda(step_bf16, a.warmup, a.iters)
        emit("linear", f"{layer} bf16", "fwd+dgrad", shape, flops, ms, peak)
        ms, peak = time_cuda(step_fp8, a.warmup, a.iters)
        emit("linear", f"{layer} fp8", "fwd+dgrad", shape, flops, ms, peak)
        with torch.no_grad():
            ms, peak = time_cuda(lambda: dequant(w8, scale), a.warmup, a.iters)
        emit("linear", f"{layer} dequant", "dequant", shape, 0.0, ms, peak)


if __name__ == "__main__":
    main()
