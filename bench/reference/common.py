"""Shared helpers for the PyTorch references: event timing (median), peak memory, and the BENCH line format
that framesmith-bench prints too (bench/reference/compare.py joins them)."""
import json
import statistics

import torch


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
