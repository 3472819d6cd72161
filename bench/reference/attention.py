"""PyTorch reference for `framesmith-bench attention`: scaled_dot_product_attention (PyTorch's default backend
choice, cuDNN's fused attention on the H200 test machine) on the same shapes and memory layout ([b, l, h, d]
tensors viewed as [b, h, l, d]), forward and forward+backward, bf16, scale 1/sqrt(d)."""
import argparse

import torch
import torch.nn.functional as F

from common import emit, time_cuda


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--tokens", type=int, default=32760)
    p.add_argument("--text-tokens", type=int, default=512)
    p.add_argument("--text-len", type=int, default=120)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--backend", default="default", choices=["default", "flash", "cudnn", "efficient"])
    a = p.parse_args()
    dev = torch.device("cuda")
    b, h, d, l = a.batch, a.heads, a.head_dim, a.tokens
    backends = {
        "flash": torch.nn.attention.SDPBackend.FLASH_ATTENTION,
        "cudnn": torch.nn.attention.SDPBackend.CUDNN_ATTENTION,
        "efficient": torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION,
    }
    impl = "torch" if a.backend == "default" else f"torch-{a.backend}"
    cases = [("self", l, None), ("cross", a.text_tokens, None)]
    if a.text_len:
        cases.append(("cross padded", a.text_tokens, min(a.text_len, a.text_tokens)))
    for case, lk, valid in cases:
        def leaf(n):
            return torch.randn(b, n, h, d, device=dev, dtype=torch.bfloat16).requires_grad_()

        q, k, v = leaf(l), leaf(lk), leaf(lk)
        d_o = torch.randn(b, l, h, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
        mask = None
        if valid is not None:
            mask = torch.zeros(b, 1, 1, lk, device=dev, dtype=torch.bool)
            mask[..., :valid] = True

        def fwd():
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  attn_mask=mask)

        def fwd_bwd():
            fwd().backward(d_o)
            q.grad = k.grad = v.grad = None

        ctx = torch.nn.attention.sdpa_kernel(backends[a.backend]) if a.backend != "default" else None
        shape = f"b={b} h={h} lq={l} lk={lk} d={d}"
        flops = 4.0 * b * h * l * lk * d
        try:
            if ctx:
                ctx.__enter__()
            with torch.no_grad():
                ms, peak = time_cuda(fwd, a.warmup, a.iters)
            emit("attention", case, "fwd", shape, flops, ms, peak, impl)
            ms, peak = time_cuda(fwd_bwd, a.warmup, a.iters)
            emit("attention", case, "fwd+bwd", shape, 3.5 * flops, ms, peak, impl)
        except RuntimeError as e:
            print(f"# {impl} {case}: {str(e).splitlines()[0]}", flush=True)
        finally:
            if ctx:
                ctx.__exit__(None, None, None)


if __name__ == "__main__":
    main()
