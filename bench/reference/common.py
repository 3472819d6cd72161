"""Shared helpers for the PyTorch references: event timing (median), peak memory, the BENCH line format that
framesmith-bench prints too (bench/reference/compare.py joins them), and what the *_step.py references share: their
step options, the LoRA linear they train, their cache reads, optimizer and step end, the timed training steps and the
step record."""
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from safetensors import safe_open


def time_cuda(fn, warmup, iters):
    """Median milliseconds of `fn` over `iters` event-timed calls after `warmup` untimed ones, and the peak
    memory allocated above the starting point (GiB)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    samples = []
    for _ in range(max(iters, 1)):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    return statistics.median(samples), peak


def emit(bench, case, pass_, shape, flops, ms, peak_gib, impl="torch"):
    rec = {
        "bench": bench,
        "case": case,
        "pass": pass_,
        "shape": shape,
        "implementation": impl,
        "ms": ms,
        "tflops": flops / (ms * 1e-3) / 1e12 if ms > 0 else 0.0,
        "peak_gib": peak_gib,
    }
    print("BENCH " + json.dumps(rec), flush=True)


def time_train_steps(step, losses, warmup, iters, cuda):
    """Runs the training step `step` (which appends its loss to `losses`) `warmup` untimed and `iters` timed times,
    the device synchronised around each (`cuda`), printing each step's time and loss; returns the timing and memory
    fields of a step record (wall-clock milliseconds, peak memory since the process started)."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times = []
    for i in range(warmup + iters):
        sync()
        start = time.perf_counter()
        step()
        sync()
        ms = (time.perf_counter() - start) * 1e3
        timed = i >= warmup
        if timed:
            times.append(ms)
        print(f"step {i + 1}: {ms:.1f} ms, loss {losses[-1].item():.4f}{'' if timed else ' (warm-up)'}", flush=True)
    gib = 2**30
    return {
        "warmup": warmup,
        "steps_timed": len(times),
        "ms_mean": statistics.mean(times) if times else 0.0,
        "ms_median": statistics.median(times) if times else 0.0,
        "ms_min": min(times) if times else 0.0,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / gib if cuda else 0.0,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / gib if cuda else 0.0,
    }


def report_train_step(marker, cuda, fields, timing, last, bench):
    """Prints the step record, `marker` and its JSON: the device (`cuda`: the GPU's name, else "cpu"), torch's
    version, the reference's own `fields`, `timing` from time_train_steps and the `last` fields (load time, last
    loss); then the BENCH line of its mean step, `bench` = (bench, case, pass, shape, flops)."""
    record = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        **fields,
        **timing,
        **last,
    }
    print(marker + " " + json.dumps(record), flush=True)
    name, case, pass_, shape, flops = bench
    emit(name, case, pass_, shape, flops, timing["ms_mean"], timing["peak_allocated_gib"])


class LoRALinear(torch.nn.Module):
    """`base(x) + (x A^T B^T) · alpha/rank`, A and B f32 and trainable, `base` frozen."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base
        self.down = torch.nn.Parameter(torch.empty(rank, base.in_features, device=base.weight.device))
        self.up = torch.nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))
        torch.nn.init.kaiming_uniform_(self.down, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(x, self.down.to(x.dtype)), self.up.to(x.dtype)) * self.scale


def add_step_args(p, rank, iters):
    """The training step's options every *_step.py reference takes (its LoRA `rank` and timed `iters` defaults)."""
    p.add_argument("--rank", type=int, default=rank)
    p.add_argument("--alpha", type=float, default=None, help="LoRA alpha (default: the rank)")
    p.add_argument("--sigma", type=float, default=0.75, help="the noise level of the step's sample")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=iters)
    p.add_argument("--no-checkpointing", action="store_true", help="keep every activation (no recompute)")


def wrap_block_linears(blocks, rank, alpha):
    """Wraps every linear inside `blocks` in a LoRALinear; returns the LoRA parameters."""
    params = []
    for block in blocks:
        for name, module in list(block.named_modules()):
            if not isinstance(module, torch.nn.Linear):
                continue
            parent = block
            *path, leaf = name.split(".")
            for p in path:
                parent = getattr(parent, p)
            wrapped = LoRALinear(module, rank, alpha)
            setattr(parent, leaf, wrapped)
            params += [wrapped.down, wrapped.up]
    return params


def cache_tensor(path, prefix, device):
    """The tensor of the cache file `path` whose key starts with `prefix` (`latents_` + a digit: the item's latents,
    not a control's), f32 on `device`; exits naming the file when there is none."""
    with safe_open(path, framework="pt", device="cpu") as f:
        keys = [k for k in f.keys() if k.startswith(prefix) and (prefix != "latents_" or k[8].isdigit())]
        if not keys:
            sys.exit(f"no {prefix}* tensor in {path}")
        return f.get_tensor(keys[0]).to(device, torch.float32)


def adamw(params, lr):
    """The references' optimizer: AdamW over the LoRA `params` at `lr` (betas 0.9 / 0.999, eps 1e-8, decay 0.01)."""
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def optimizer_step(loss, params, opt, losses):
    """The end of a training step: `loss`'s gradients, clipped to norm 1 over `params`, one step of `opt`, the
    gradients dropped and the loss kept in `losses`."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.detach())
