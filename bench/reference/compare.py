"""Joins the BENCH lines of framesmith-bench and the PyTorch references (any number of log files) and prints
one row per case: our time, the reference's, and the ratio reference/ours (> 1: ours is faster)."""
import json
import sys


def load(paths):
    recs = []
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.startswith("BENCH "):
                    recs.append(json.loads(line[6:]))
    return recs


def main():
    recs = load(sys.argv[1:])
    ours = [r for r in recs if r["implementation"] == "framesmith"]
    refs = [r for r in recs if r["implementation"] != "framesmith"]
    print(f"{'case':<30} {'pass':<10} {'shape':<40} {'ref':<13} {'ours ms':>9} {'ref ms':>9} {'ref/ours':>8} "
          f"{'ours TF':>8} {'ref TF':>8} {'GiB ours':>8} {'GiB ref':>8}")
    for r in refs:
        # Our case may carry a variant suffix (the step's "t2v-1.3b bf16 manual"), the reference's one after a
        # comma (", ckpt attention, compiled"): one row per pair of variants.
        base = r["case"].split(",")[0]
        for o in ours:
            same = (o["bench"], o["pass"], o["shape"]) == (r["bench"], r["pass"], r["shape"])
            if not same or not (o["case"] == base or o["case"].startswith(base + " ")):
                continue
            ratio = r["ms"] / o["ms"] if o["ms"] > 0 else float("nan")
            og = "-" if o.get("peak_gib") is None else f"{o['peak_gib']:.2f}"
            print(f"{o['case']:<30} {r['pass']:<10} {r['shape']:<40} {r['case'][len(base):] or 'eager':<13} {o['ms']:>9.3f} "
                  f"{r['ms']:>9.3f} {ratio:>8.3f} {o['tflops']:>8.1f} {r['tflops']:>8.1f} {og:>8} "
                  f"{r['peak_gib']:>8.2f}")
    # FP8 linear against bf16 linear, within each implementation (target: <= 1.15).
    for impl in sorted({r["implementation"] for r in recs}):
        by_case = {(r["case"], r["shape"]): r for r in recs if r["implementation"] == impl and r["bench"] == "linear"}
        for (case, shape), r in sorted(by_case.items()):
            if case.endswith(" bf16"):
                layer = case[: -len(" bf16")]
                for variant in ("fp8", "fp8 x2"):
                    f = by_case.get((f"{layer} {variant}", shape))
                    if f:
                        print(f"{impl:<11} {layer:<9} {variant:<7} / bf16 = {f['ms'] / r['ms']:.3f}  ({shape})")


if __name__ == "__main__":
    main()
