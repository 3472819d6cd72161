"""Which product fusions could pay in the Wan2.1-14B block (issue 17), measured with PyTorch before building them:
at 32,760 tokens, (1) q, k, v as three [5120 -> 5120] products against one product over the stacked weight
[15360, 5120], forward and input gradient (three products accumulated against one with k = 15360); (2) `ffn.0`
followed by a separate tanh-GELU against cuBLASLt's GELU epilogue (`torch._addmm_activation`), and the GELU
backward as a separate pass. bf16, times with CUDA events, median of the runs. Prints one line per case."""
import argparse

import torch
import torch.nn.functional as F

from fp8_gemm import timed  # the same event timing (median of the runs after three warm-ups)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=32760)
    p.add_argument("--dim", type=int, default=5120)
    p.add_argument("--ffn", type=int, default=13824)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    m, d, f = a.tokens, a.dim, a.ffn
    x = torch.randn(m, d, device=dev, dtype=bf)
    w = [torch.randn(d, d, device=dev, dtype=bf) / d**0.5 for _ in range(3)]
    wcat = torch.cat(w, 0)
    out3 = torch.empty(m, 3 * d, device=dev, dtype=bf)
    outs = [torch.empty(m, d, device=dev, dtype=bf) for _ in range(3)]

    def sep_fwd():
        for wi, oi in zip(w, outs):
            torch.mm(x, wi.t(), out=oi)

    def cat_fwd():
        torch.mm(x, wcat.t(), out=out3)

    g = [torch.randn(m, d, device=dev, dtype=bf) for _ in range(3)]
    gcat = torch.cat(g, 1)
    dx = torch.empty(m, d, device=dev, dtype=bf)

    def sep_bwd():
        torch.mm(g[0], w[0], out=dx)
        dx.addmm_(g[1], w[1])
        dx.addmm_(g[2], w[2])

    def cat_bwd():
        torch.mm(gcat, wcat, out=dx)

    r = {k: timed(v, a.iters) for k, v in
         {"qkv forward, three products": sep_fwd, "qkv forward, one stacked product": cat_fwd,
          "qkv input gradient, three accumulated": sep_bwd, "qkv input gradient, one product k=3d": cat_bwd}.items()}
    err = (torch.cat([x @ wi.t() for wi in w], 1).float() - x @ wcat.t()).abs().max().item()
    w1 = torch.randn(f, d, device=dev, dtype=bf) / d**0.5
    b1 = torch.randn(f, device=dev, dtype=bf) * 0.01
    h = torch.empty(m, f, device=dev, dtype=bf)

    def ffn_sep():
        torch.addmm(b1, x, w1.t(), out=h)
        F.gelu(h, approximate="tanh")

    def ffn_epi():
        torch._addmm_activation(b1, x, w1.t(), use_gelu=True)

    def ffn_plain():
        torch.addmm(b1, x, w1.t(), out=h)

    gh = torch.randn(m, f, device=dev, dtype=bf)

    def gelu_bwd():
        torch.ops.aten.gelu_backward(gh, h, approximate="tanh")

    r.update({k: timed(v, a.iters) for k, v in
              {"ffn.0 + bias alone": ffn_plain, "ffn.0 + bias, then GELU": ffn_sep,
               "ffn.0 + bias + GELU epilogue": ffn_epi, "GELU backward pass": gelu_bwd}.items()})
    ref = F.gelu((x.float() @ w1.float().t() + b1.float()), approximate="tanh")
    e_sep = ((F.gelu(torch.addmm(b1, x, w1.t()), approximate="tanh").float() - ref).norm() / ref.norm()).item()
    e_epi = ((torch._addmm_activation(b1, x, w1.t(), use_gelu=True).float() - ref).norm() / ref.norm()).item()
    print(torch.cuda.get_device_name(), torch.__version__)
    for k, v in r.items():
        print(f"{k:45s} {v:8.3f} ms")
    print(f"stacked vs separate forward: max abs difference {err:.3e}")
    print(f"GELU vs f32 (relative Frobenius): separate {e_sep:.3e}, epilogue {e_epi:.3e}")


if __name__ == "__main__":
    main()
