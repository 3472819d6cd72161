#!/usr/bin/env python3
"""Reads the kernel timeline that kernel_trace.c writes (start_ns, end_ns, stream, name) and says where a run's GPU
time goes at the run's own clocks: the window from the first attention kernel to the last kernel (one step when
the program ran one step after its set-up), or with --step K the K-th training step alone (from the end of the
optimizer's kernels of step K-1 to the end of step K's; the optimizer's kernels are those --marker matches), kernel
time by class (the classes of bench/reference/ncu_summary.py), the kernels that take the most time, the idle time
between kernels, and after which kernels the GPU waited longest. A trace with driver-call rows (stream "api",
kernel_trace.c's KERNEL_TRACE_API_US) also lists, for each idle gap of a millisecond or more, the host's slow
driver calls within it (what the host was doing while the GPU waited).

Usage: kernel_gaps.py TRACE.csv [--top N] [--step K] [--marker REGEX]"""
import argparse
import collections
import csv
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from ncu_summary import classify, short  # noqa: E402

BUCKETS = [(5e3, "< 5 us"), (20e3, "5-20 us"), (100e3, "20-100 us"), (1e6, "0.1-1 ms"), (float("inf"), ">= 1 ms")]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--step", type=int, help="the K-th training step alone (1 = the first)")
    p.add_argument("--marker", default=r"adamw|adam_|multi_tensor_apply", help="the optimizer's kernels")
    a = p.parse_args()
    rows, api, lead = [], [], None
    with open(a.trace, newline="") as f:
        for r in csv.DictReader(f):
            (api if r["stream"] == "api" else rows).append((int(r["start_ns"]), int(r["end_ns"]), r["name"]))
    rows.sort()
    api.sort()
    first = next((i for i, r in enumerate(rows) if classify(r[2]).startswith("attention")), None)
    if first is None:
        print(f"{a.trace}: no attention kernel", file=sys.stderr)
        return 1
    if a.step:
        ends = optimizer_ends(rows, re.compile(a.marker, re.IGNORECASE))
        if len(ends) < a.step:
            print(f"{a.trace}: {len(ends)} optimizer steps found, not {a.step}", file=sys.stderr)
            return 1
        start = ends[a.step - 2] + 1 if a.step > 1 else first
        if a.step > 1:
            # The idle time between the last step's optimizer and this step's first kernel (outside the window).
            before = rows[start - 1]
            lead = (rows[start][0] - before[1], before[2], rows[start][2], before[1])
        rows = rows[start : ends[a.step - 1] + 1]
    else:
        rows = rows[first:]
    t0, t1 = rows[0][0], max(r[1] for r in rows)
    wall = t1 - t0
    by_class = collections.Counter()
    gaps = []  # (idle ns, kernel before, kernel after, idle from)
    busy_until, prev = t0, rows[0][2]
    for start, end, name in rows:
        by_class[classify(name)] += end - start
        if start > busy_until:
            gaps.append((start - busy_until, prev, name, busy_until))
        busy_until = max(busy_until, end)
        prev = name
    idle = sum(g for g, *_ in gaps)
    kernels = sum(by_class.values())
    where = f"of step {a.step}" if a.step else "from the first attention kernel"
    print(f"window {wall / 1e6:.1f} ms {where}: {len(rows)} kernels, "
          f"kernel time {kernels / 1e6:.1f} ms, GPU idle {idle / 1e6:.1f} ms ({idle / wall:.1%}) in {len(gaps)} gaps")
    print()
    print(f"{'class':<40} {'ms':>9} {'share':>6}")
    for label, ns in by_class.most_common():
        print(f"{label:<40} {ns / 1e6:9.1f} {ns / kernels:6.1%}")
    print()
    per_kernel, calls = collections.Counter(), collections.Counter()
    for start, end, name in rows:
        per_kernel[short(name)] += end - start
        calls[short(name)] += 1
    print(f"{'kernel':<90} {'ms':>8} {'calls':>7} {'us/call':>8}")
    for name, ns in per_kernel.most_common(a.top):
        print(f"{name:<90} {ns / 1e6:8.1f} {calls[name]:7d} {ns / 1e3 / calls[name]:8.1f}")
    print()
    print(f"{'gap':<12} {'count':>7} {'ms':>9}")
    lower = 0.0
    for limit, label in BUCKETS:
        sel = [g for g, *_ in gaps if lower <= g < limit]
        print(f"{label:<12} {len(sel):7d} {sum(sel) / 1e6:9.2f}")
        lower = limit
    print()
    after = collections.Counter()
    count = collections.Counter()
    for g, before, *_ in gaps:
        after[short(before)] += g
        count[short(before)] += 1
    print(f"{'idle after kernel':<90} {'ms':>8} {'gaps':>6}")
    for name, ns in after.most_common(a.top):
        print(f"{name:<90} {ns / 1e6:8.2f} {count[name]:6d}")
    print()
    print(f"{'longest gaps: before -> after':<120} {'us':>8}")
    for g, before, nxt, _ in sorted(gaps, reverse=True)[: a.top]:
        print(f"{(short(before)[:58] + ' -> ' + short(nxt)[:58]):<120} {g / 1e3:8.1f}")
    if lead:
        print()
        print(f"idle before the step's first kernel (after {short(lead[1])[:50]}): {lead[0] / 1e3:.1f} us")
    if api:
        print_host_calls(gaps + ([lead] if lead else []), api)
    return 0


def print_host_calls(gaps, api, least_ns=1_000_000):
    """The driver calls (rows of stream "api") that overlap each idle gap of `least_ns` or more, in time order."""
    print()
    print("driver calls within idle gaps of 1 ms or more (ms into the gap, ms the call took)")
    for g, before, nxt, begin in sorted(gaps, key=lambda x: x[3]):
        if g < least_ns:
            continue
        end = begin + g
        print(f"{short(before)[:50]} -> {short(nxt)[:50]}: {g / 1e6:.2f} ms idle")
        for start, stop, name in api:
            if stop > begin and start < end:
                print(f"    {(start - begin) / 1e6:8.2f} {(stop - start) / 1e6:8.2f}  {name}")


def optimizer_ends(rows, marker, slack=64):
    """The index of the last optimizer kernel of each training step: runs of kernels that `marker` matches, with
    at most `slack` other kernels between two of them (the optimizer's own reductions and casts)."""
    ends, last = [], None
    for i, (_, _, name) in enumerate(rows):
        if not marker.search(name):
            continue
        if last is not None and i - last > slack:
            ends.append(last)
        last = i
    if last is not None:
        ends.append(last)
    return ends


if __name__ == "__main__":
    sys.exit(main())
