"""PyTorch reference for `framesmith-bench kernels`: the same element-wise ops of a Wan block in bf16, forward,
input gradient alone (autograd.grad on a kept graph) and forward+backward (gradient seeded with ones), with PyTorch's fused kernels where it has them
(F.rms_norm, F.layer_norm, F.gelu(approximate="tanh")) and the official Wan code's eager formulas elsewhere
(modulation and gated residual in f32, RoPE on adjacent pairs). `tflops` carries TB/s, as ours does."""
import argparse

import torch
import torch.nn.functional as F

from common import emit, time_cuda


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--ffn", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--tokens", type=int, default=32760)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    dev = torch.device("cuda")
    l, d, f, h = a.tokens, a.dim, a.ffn, a.heads
    hd = d // h
    w = (torch.randn(d, device=dev) * 0.1 + 1).to(torch.bfloat16)
    scale = torch.randn(1, 1, d, device=dev) * 0.5
    shift = torch.randn(1, 1, d, device=dev) * 0.5
    angles = torch.rand(1, l, 1, hd // 2, device=dev) * 20 - 10
    freqs = torch.polar(torch.ones_like(angles), angles)

    def rope(x):
        xc = torch.view_as_complex(x.float().reshape(1, l, h, hd // 2, 2))
        return torch.view_as_real(xc * freqs).flatten(3).to(x.dtype)

    ops = [
        ("rms_norm", (1, l, d), lambda x: F.rms_norm(x, (d,), w, a.eps)),
        ("layer_norm", (1, l, d), lambda x: F.layer_norm(x, (d,), eps=a.eps)),
        ("modulate", (1, l, d), lambda x: (x.float() * (1 + scale) + shift).to(x.dtype)),
        ("gated_residual", (1, l, d), lambda x: (x.float() + x.float() * scale).to(x.dtype)),
        ("gelu_tanh", (l, f), lambda x: F.gelu(x, approximate="tanh")),
        ("rope", (1, l, h, hd), rope),
    ]
    for name, shape, op in ops:
        x = torch.randn(*shape, device=dev, dtype=torch.bfloat16).requires_grad_()
        n = x.numel()
        label = "[" + ", ".join(str(s) for s in shape) + "]"
        bytes_fwd = 2.0 * 2.0 * n
        with torch.no_grad():
            ms, peak = time_cuda(lambda: op(x), a.warmup, a.iters)
        emit("kernels", name, "fwd", label, bytes_fwd, ms, peak)
        if name != "gated_residual":
            # The input gradient alone: autograd.grad over a graph built once and kept.
            y = op(x)
            dy = torch.randn(*shape, device=dev, dtype=torch.bfloat16)
            ms, peak = time_cuda(lambda: torch.autograd.grad(y, x, dy, retain_graph=True), a.warmup, a.iters)
            emit("kernels", name, "bwd", label, 1.5 * bytes_fwd, ms, peak)
            del y
        ones = torch.ones(*shape, device=dev, dtype=torch.bfloat16)

        def fwd_bwd():
            op(x).backward(ones)
            x.grad = None

        ms, peak = time_cuda(fwd_bwd, a.warmup, a.iters)
        emit("kernels", name, "fwd+bwd autograd", label, 2.5 * bytes_fwd, ms, peak)


if __name__ == "__main__":
    main()
