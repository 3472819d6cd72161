"""What FP8 tensor-core matrix products could give the 14B step's forward and recompute (issue 17), measured with
PyTorch's `torch._scaled_mm` before building them: at each Wan2.1-14B block linear's shape (32,760 tokens), the
time of the bf16 product, of the FP8 e4m3 product with per-tensor scales and with per-row/per-column scales
(where this PyTorch and GPU support them), and of quantising the activation (amax, scale, cast); and the error of
each against an f32 product of the same bf16 inputs. Activations are LayerNorm-ed normal rows with a few large
channels, as a modulated block input has; weights N(0, 1/sqrt(in)). Prints one line per shape and a per-step
estimate (forward + recompute of the 40 blocks)."""
import argparse
import statistics

import torch
import torch.nn.functional as F

E4M3 = torch.float8_e4m3fn
MAX = torch.finfo(E4M3).max


def timed(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def quant_tensor(x):
    scale = (x.abs().amax().float() / MAX).clamp(min=1e-12)
    return (x.float() / scale).to(E4M3), scale


def quant_rows(x):
    scale = (x.abs().amax(dim=1, keepdim=True).float() / MAX).clamp(min=1e-12)
    return (x.float() / scale).to(E4M3), scale


def rel(a, b):
    return ((a.float() - b).norm() / b.norm()).item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=32760)
    p.add_argument("--layers", type=int, default=40)
    a = p.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    d, ffn, m = 5120, 13824, a.tokens
    # (name, in, out, uses per block in the forward): q, k, v, o of self-attention, q and o of cross-attention,
    # the FFN's two products.
    shapes = [("attn q/k/v/o, cross q/o", d, d, 6), ("ffn.0", d, ffn, 1), ("ffn.2", ffn, d, 1)]
    total = {"bf16": 0.0, "fp8 tensor": 0.0, "fp8 rowwise": 0.0, "quantise x": 0.0}
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for name, k, n, uses in shapes:
        x = F.layer_norm(torch.randn(m, k, device=dev), (k,))
        x[:, :8] *= 20  # a few large channels
        x = x.to(torch.bfloat16)
        w = (torch.randn(n, k, device=dev) / k**0.5).to(torch.bfloat16)
        ref = x.float() @ w.float().t()
        t_bf16 = timed(lambda: x @ w.t())
        e_bf16 = rel(x @ w.t(), ref)
        xq, xs = quant_tensor(x)
        wq, ws = quant_tensor(w)
        mm = lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)  # noqa: E731
        t_fp8 = timed(mm)
        e_fp8 = rel(mm(), ref)
        t_q = timed(lambda: quant_tensor(x))
        line = (f"{name:<26} m={m} k={k} n={n}: bf16 {t_bf16:.3f} ms (err {e_bf16:.1e}), fp8 per-tensor "
                f"{t_fp8:.3f} ms (err {e_fp8:.1e}), quantise x {t_q:.3f} ms")
        total["bf16"] += uses * t_bf16
        total["fp8 tensor"] += uses * t_fp8
        total["quantise x"] += uses * t_q
        try:
            xr, xrs = quant_rows(x)
            wr, wrs = quant_rows(w)
            mr = lambda: torch._scaled_mm(xr, wr.t(), scale_a=xrs, scale_b=wrs.t(),  # noqa: E731
                                          out_dtype=torch.bfloat16)
            t_r = timed(mr)
            line += f", fp8 rowwise {t_r:.3f} ms (err {rel(mr(), ref):.1e})"
            total["fp8 rowwise"] += uses * t_r
        except Exception as exc:  # not every build supports row-wise scales
            line += f", fp8 rowwise unsupported ({type(exc).__name__})"
        print(line, flush=True)
    f = 2 * a.layers  # forward and recompute
    print(f"per step (forward + recompute, {a.layers} blocks): bf16 {f * total['bf16'] / 1e3:.3f} s, fp8 per-tensor "
          f"{f * total['fp8 tensor'] / 1e3:.3f} s + quantising {f * total['quantise x'] / 1e3:.3f} s, fp8 rowwise "
          f"{f * total['fp8 rowwise'] / 1e3:.3f} s", flush=True)


if __name__ == "__main__":
    main()
