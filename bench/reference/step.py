"""PyTorch reference for `framesmith-bench step`: one LoRA training step of a Wan 2.1 T2V DiT, written from the
architecture (patch embedding, sinusoidal time embedding and its 6-way modulation, text embedding, blocks of
modulated self-attention with q/k RMSNorm and 3D RoPE, cross-attention over the padded text, GELU-tanh FFN, the
modulated head), bf16 autocast over frozen bf16 base weights, the residual stream and modulation in f32,
per-block activation checkpointing (torch.utils.checkpoint, non-reentrant; `--checkpointing attention` keeps
each block's self-attention output and LSE through a selective-checkpointing policy, `off` keeps everything;
`--compile` runs each block through torch.compile, as musubi-tuner's `--compile` does), LoRA (f32 factors, alpha = rank, up
initialised to zero) on every block linear, flow-matching MSE loss in f32. Weights are random (the step's cost
does not depend on their values). Prints a BENCH line like ours: median step time and peak allocated memory
(weights included) over the timed steps.

`--kind lora,lokr,loha,dora` trains those kinds through PEFT instead (bench/reference/peft_kinds.py: PEFT's
LoraConfig, LoKrConfig, LoHaConfig, `use_dora`) on the same linears, one after another (a fresh model each),
each with its own BENCH line."""
import argparse
import csv
import functools
import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import peft_kinds
from common import emit, time_cuda

# Set by --kind: block linears become PEFT targets instead of carrying the hand-written LoRA.
PEFT_TARGETS = False

VARIANTS = {
    "t2v-1.3b": dict(dim=1536, ffn=8960, heads=12, layers=30),
    "t2v-14b": dict(dim=5120, ffn=13824, heads=40, layers=40),
}
FREQ_DIM, TEXT_DIM, TEXT_LEN, OUT_DIM, PATCH, EPS = 256, 4096, 512, 16, (1, 2, 2), 1e-6


def frozen(out_f, in_f, dev, std=None):
    std = 1 / math.sqrt(in_f) if std is None else std
    w = torch.randn(out_f, in_f, device=dev, dtype=torch.bfloat16) * std
    b = torch.randn(out_f, device=dev, dtype=torch.bfloat16) * 0.05
    return w, b


class LoraLinear(torch.nn.Module):
    """A frozen bf16 linear with a trainable LoRA pair: y = x Wᵀ + b + (x Aᵀ) Bᵀ · alpha / r."""

    def __init__(self, in_f, out_f, rank, dev):
        super().__init__()
        w, b = frozen(out_f, in_f, dev)
        self.peft_base = peft_kinds.frozen_linear(w, b) if PEFT_TARGETS else None
        if self.peft_base is not None:
            return
        self.register_buffer("weight", w)
        self.register_buffer("bias", b)
        bound = 1 / math.sqrt(in_f)
        self.down = torch.nn.Parameter(torch.empty(rank, in_f, device=dev).uniform_(-bound, bound))
        self.up = torch.nn.Parameter(torch.zeros(out_f, rank, device=dev))

    def forward(self, x):
        if self.peft_base is not None:
            return self.peft_base(x)
        return F.linear(x, self.weight, self.bias) + F.linear(F.linear(x, self.down), self.up)


def rms(x, w):
    return F.rms_norm(x.float(), (x.shape[-1],), eps=EPS).type_as(x) * w


def rope_tables(grid, head_dim, dev):
    """cos / sin [L, 1, head_dim/2] of Wan's 3D RoPE: the pairs split 22/21/21 (head dim 128) over frames,
    height and width, theta 10000 per axis."""
    f, h, w = grid
    parts = [head_dim - 4 * (head_dim // 6), 2 * (head_dim // 6), 2 * (head_dim // 6)]
    angles = []
    for n, (size, axis) in enumerate(zip(parts, (f, h, w))):
        inv = 1.0 / (10000 ** (torch.arange(0, size, 2, device=dev, dtype=torch.float64) / size))
        a = torch.outer(torch.arange(axis, device=dev, dtype=torch.float64), inv)
        shape = [f, h, w, a.shape[1]]
        view = [1, 1, 1, a.shape[1]]
        view[n] = axis
        angles.append(a.view(*view).expand(*shape))
    ang = torch.cat(angles, dim=-1).reshape(f * h * w, 1, head_dim // 2)
    return ang.cos().float(), ang.sin().float()


def rope(x, cos, sin):
    """Rotates adjacent pairs of x [b, l, h, d] (computed in f32, returned in x's dtype)."""
    b, l, h, d = x.shape
    p = x.float().reshape(b, l, h, d // 2, 2)
    re, im = p[..., 0], p[..., 1]
    out = torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1)
    return out.reshape(b, l, h, d).type_as(x)


# The attention operators SDPA dispatches to; a selective-checkpointing policy saves their outputs (the attention
# output and its LSE) when they are self-attention (queries and keys of one length).
ATTENTION_OPS = {
    op
    for op in (
        getattr(torch.ops.aten, name, None)
        for name in (
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_efficient_attention",
        )
    )
    if op is not None
}


def keep_self_attention(ctx, op, *args, **kwargs):
    packet = getattr(op, "overloadpacket", op)
    if packet in ATTENTION_OPS and args[0].shape[-2] == args[1].shape[-2]:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class Checkpointed(torch.nn.Module):
    """A block run under torch.utils.checkpoint: all recomputed ("blocks") or the self-attention kept
    ("attention")."""

    def __init__(self, block, mode):
        super().__init__()
        self.block = block
        self.context_fn = (
            functools.partial(create_selective_checkpoint_contexts, keep_self_attention)
            if mode == "attention"
            else None
        )

    def forward(self, *inputs):
        if self.context_fn is None:
            return checkpoint(self.block, *inputs, use_reentrant=False)
        return checkpoint(self.block, *inputs, use_reentrant=False, context_fn=self.context_fn)


class Block(torch.nn.Module):
    def __init__(self, dim, ffn, heads, rank, dev):
        super().__init__()
        lin = lambda i, o: LoraLinear(i, o, rank, dev)  # noqa: E731
        self.heads = heads
        self.sq, self.sk, self.sv, self.so = (lin(dim, dim) for _ in range(4))
        self.cq, self.ck, self.cv, self.co = (lin(dim, dim) for _ in range(4))
        self.ffn0, self.ffn2 = lin(dim, ffn), lin(ffn, dim)
        ones = lambda: (1 + 0.1 * torch.randn(dim, device=dev)).to(torch.bfloat16)  # noqa: E731
        for name in ("s_norm_q", "s_norm_k", "c_norm_q", "c_norm_k"):
            self.register_buffer(name, ones())
        self.register_buffer("norm3_w", 1 + 0.1 * torch.randn(dim, device=dev))
        self.register_buffer("norm3_b", 0.05 * torch.randn(dim, device=dev))
        self.register_buffer("modulation", 0.1 * torch.randn(1, 6, dim, device=dev))

    def split(self, x):
        b, l, c = x.shape
        return x.view(b, l, self.heads, c // self.heads)

    def attend(self, q, k, v):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return o.transpose(1, 2).flatten(2)

    def forward(self, x, e0, ctx, cos, sin):
        dim = x.shape[-1]
        with torch.autocast("cuda", enabled=False):
            e = (self.modulation + e0).chunk(6, dim=1)
        y = (F.layer_norm(x, (dim,), eps=EPS).float() * (1 + e[1]) + e[0])
        q = self.split(rms(self.sq(y), self.s_norm_q))
        k = self.split(rms(self.sk(y), self.s_norm_k))
        v = self.split(self.sv(y))
        y = self.so(self.attend(rope(q, cos, sin), rope(k, cos, sin), v))
        x = x + y.float() * e[2]
        y = F.layer_norm(x, (dim,), self.norm3_w, self.norm3_b, EPS)
        q = self.split(rms(self.cq(y), self.c_norm_q))
        k = self.split(rms(self.ck(ctx), self.c_norm_k))
        v = self.split(self.cv(ctx))
        x = x + self.co(self.attend(q, k, v)).float()
        y = F.layer_norm(x, (dim,), eps=EPS).float() * (1 + e[4]) + e[3]
        y = self.ffn2(F.gelu(self.ffn0(y), approximate="tanh"))
        return x + y.float() * e[5]


class Wan(torch.nn.Module):
    def __init__(self, v, rank, dev):
        super().__init__()
        dim = v["dim"]
        self.dim = dim
        self.patch_w = (torch.randn(dim, OUT_DIM, *PATCH, device=dev) / math.sqrt(OUT_DIM * 4)).to(torch.bfloat16)
        self.patch_b = torch.zeros(dim, device=dev, dtype=torch.bfloat16)
        self.text = [frozen(dim, TEXT_DIM, dev), frozen(dim, dim, dev)]
        self.time = [
            [t.float() for t in frozen(dim, FREQ_DIM, dev)],
            [t.float() for t in frozen(dim, dim, dev)],
            [t.float() for t in frozen(6 * dim, dim, dev)],
        ]
        self.blocks = torch.nn.ModuleList(Block(dim, v["ffn"], v["heads"], rank, dev) for _ in range(v["layers"]))
        self.runs = list(self.blocks)
        self.head_mod = 0.1 * torch.randn(1, 2, dim, device=dev)
        self.head = frozen(OUT_DIM * 4, dim, dev)

    def forward(self, latent, t, context):
        c, f, h, w = latent.shape
        grid = (f, h // 2, w // 2)
        x = F.conv3d(latent[None].to(self.patch_w.dtype), self.patch_w, self.patch_b, stride=PATCH)
        x = x.flatten(2).transpose(1, 2).float()
        with torch.autocast("cuda", enabled=False):
            half = FREQ_DIM // 2
            freqs = torch.pow(10000.0, -torch.arange(half, device=x.device, dtype=torch.float64) / half)
            arg = torch.outer(t.double(), freqs)
            sin_emb = torch.cat([arg.cos(), arg.sin()], dim=1).float()
            e = F.linear(F.silu(F.linear(sin_emb, *self.time[0])), *self.time[1])
            e0 = F.linear(F.silu(e), *self.time[2]).unflatten(1, (6, self.dim))
        ctx = torch.zeros(1, TEXT_LEN, TEXT_DIM, device=x.device, dtype=self.text[0][0].dtype)
        ctx[0, : context.shape[0]] = context
        ctx = F.linear(F.gelu(F.linear(ctx, *self.text[0]), approximate="tanh"), *self.text[1])
        cos, sin = rope_tables(grid, self.dim // self.blocks[0].heads, x.device)
        for run in self.runs:
            x = run(x, e0, ctx, cos, sin)
        with torch.autocast("cuda", enabled=False):
            shift, scale = (self.head_mod + e.unsqueeze(1)).chunk(2, dim=1)
            y = F.layer_norm(x, (self.dim,), eps=EPS) * (1 + scale) + shift
        y = F.linear(y, *self.head).float()
        y = y.view(f, grid[1], grid[2], 1, 2, 2, OUT_DIM)
        return torch.einsum("fhwpqrc->cfphqwr", y).reshape(OUT_DIM, f, h, w)


def write_kernel_profile(fn, path):
    """Runs `fn` once under torch.profiler and writes each GPU kernel's name and duration (ns) as the CSV that
    `ncu --csv --page raw --metrics gpu__time_duration.sum` writes, so ncu_summary.py classifies both alike."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [
        e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("Memcpy")
        and not e.name.startswith("Memset")
    ]
    with open(path, "w", newline="") as out:
        w = csv.writer(out, quoting=csv.QUOTE_ALL)
        w.writerow(["ID", "Kernel Name", "gpu__time_duration.sum"])
        for i, e in enumerate(kernels):
            w.writerow([i, e.name, int(round(e.time_range.elapsed_us() * 1e3))])
    print(f"profile: {len(kernels)} kernels, {sum(e.time_range.elapsed_us() for e in kernels) / 1e3:.1f} ms -> {path}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variant", default="t2v-1.3b", choices=sorted(VARIANTS))
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--text-tokens", type=int, default=512)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--checkpointing", default="blocks", choices=["blocks", "attention", "off"])
    p.add_argument("--compile", action="store_true", help="each block through torch.compile (default mode)")
    p.add_argument("--profile", metavar="CSV", help="after the timed steps, one more step under torch.profiler; "
                   "its kernels written to CSV in the layout bench/reference/ncu_summary.py reads")
    p.add_argument("--kind", help="comma-separated adapter kinds trained through PEFT, one after another "
                   "(lora, lokr, loha, dora); without it, the hand-written LoRA")
    a = p.parse_args()
    global PEFT_TARGETS
    PEFT_TARGETS = a.kind is not None
    for kind in a.kind.split(",") if a.kind else [None]:
        run_kind(a, kind)
        torch.cuda.empty_cache()


def run_kind(a, kind):
    """One model with `kind`'s adapters (None: the hand-written LoRA): the timed steps and the BENCH line."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    v = VARIANTS[a.variant]
    model = Wan(v, a.rank, dev)
    if kind is not None:
        peft_kinds.inject(model, kind, a.rank, float(a.rank))
    runs = [b if a.checkpointing == "off" else Checkpointed(b, a.checkpointing) for b in model.blocks]
    if a.compile:
        # One graph for every block (same code, parameters as inputs); the limit only guards against fallbacks.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        runs = [torch.compile(r) for r in runs]
    model.runs = runs
    f, h, w = (a.frames - 1) // 4 + 1, a.height // 8, a.width // 8
    tokens = f * (h // 2) * (w // 2)
    sigma = 0.75
    x0, noise = torch.randn(OUT_DIM, f, h, w, device=dev), torch.randn(OUT_DIM, f, h, w, device=dev)
    xt, target = (1 - sigma) * x0 + sigma * noise, noise - x0
    t = torch.tensor([1000 * sigma], device=dev)
    context = torch.randn(min(a.text_tokens, TEXT_LEN), TEXT_DIM, device=dev, dtype=torch.bfloat16)
    params = [q for q in model.parameters() if q.requires_grad]
    losses = []

    def step():
        for q in params:
            q.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(xt, t, context)
        loss = F.mse_loss(out.float(), target)
        loss.backward()
        losses.append(loss.detach())

    ms, peak_rel = time_cuda(step, a.warmup, a.iters)
    if a.profile:
        write_kernel_profile(step, a.profile)
    peak = peak_rel + torch.cuda.memory_allocated() / 2**30
    d, fd, L, c = v["dim"], v["ffn"], tokens, TEXT_LEN
    fwd = v["layers"] * (2 * L * (6 * d * d + 2 * d * fd) + 4 * c * d * d + 4 * L * L * d + 4 * L * c * d)
    print(f"{kind or 'lora'}: loss {losses[-1].item():.4f}, {sum(q.numel() for q in params)} LoRA parameters, "
          f"median {ms:.1f} ms/step, peak {peak:.2f} GiB", flush=True)
    shape = f"b=1 {a.frames}x{a.height}x{a.width} tokens={tokens} text={TEXT_LEN} r={a.rank}"
    how = {"blocks": "", "attention": ", ckpt attention", "off": ", no ckpt"}[a.checkpointing]
    how += ", compiled" if a.compile else ""
    emit("step", f"{a.variant} bf16{how}", f"{kind or 'lora'} step", shape, 4.0 * fwd, ms, peak)


if __name__ == "__main__":
    main()
