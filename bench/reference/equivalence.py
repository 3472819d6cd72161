"""Full-size equivalence of our training step with PyTorch's: reads what `framesmith-bench equivalence --out DIR`
wrote (the DiT's weights, the flow-matching sample, the LoRA factors, our loss and LoRA gradients), runs the same
LoRA step through `step.py`'s model written from the official architecture — once under bf16 autocast as
training runs it, once entirely in f32 as the yardstick — and compares.

"Within bf16 tolerance" is measured, not assumed: the f32 step is the reference, PyTorch's own bf16 step's
distance from it is the tolerance, and ours must be no further from it than twice that (per LoRA gradient tensor,
relative Frobenius norm, at the median tensor and at the worst one; the loss likewise). Prints one EQUIV json line
and exits 1 when ours is outside."""
import argparse
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import step as ref

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
          "I64": torch.int64, "U8": torch.uint8}
# Our LoRA module names (official paths) → the reference block's attributes.
MODULES = {"self_attn.q": "sq", "self_attn.k": "sk", "self_attn.v": "sv", "self_attn.o": "so",
           "cross_attn.q": "cq", "cross_attn.k": "ck", "cross_attn.v": "cv", "cross_attn.o": "co",
           "ffn.0": "ffn0", "ffn.2": "ffn2"}


def load(path):
    """A safetensors file as {name: CPU tensor} (read here: the machine may not have the safetensors package)."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = bytearray(f.read())
    raw = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        out[name] = raw[start:end].clone().view(DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def assign(model, weights, dev):
    """The file's values into the reference model: matrices and biases in the model's dtype, norms, modulation
    and the time embedding in f32 as the official code keeps them."""
    def put(t, name, dtype=None):
        return weights[name].to(dev, dtype or t.dtype)

    model.patch_w = put(model.patch_w, "patch_embedding.weight")
    model.patch_b = put(model.patch_b, "patch_embedding.bias")
    model.text = [(put(w, f"text_embedding.{i}.weight"), put(b, f"text_embedding.{i}.bias"))
                  for (w, b), i in zip(model.text, (0, 2))]
    model.time = [(put(w, f"{n}.weight"), put(b, f"{n}.bias"))
                  for (w, b), n in zip(model.time, ("time_embedding.0", "time_embedding.2", "time_projection.1"))]
    model.head = (put(model.head[0], "head.head.weight"), put(model.head[1], "head.head.bias"))
    model.head_mod = put(model.head_mod, "head.modulation")
    for i, blk in enumerate(model.blocks):
        p = f"blocks.{i}."
        for name, attr in MODULES.items():
            lin = getattr(blk, attr)
            lin.weight = put(lin.weight, p + name + ".weight")
            lin.bias = put(lin.bias, p + name + ".bias")
        for attn, pre in (("self_attn", "s"), ("cross_attn", "c")):
            for qk in ("q", "k"):
                setattr(blk, f"{pre}_norm_{qk}", put(getattr(blk, f"{pre}_norm_{qk}"), f"{p}{attn}.norm_{qk}.weight"))
        blk.norm3_w = put(blk.norm3_w, p + "norm3.weight")
        blk.norm3_b = put(blk.norm3_b, p + "norm3.bias")
        blk.modulation = put(blk.modulation, p + "modulation")


def set_lora(model, factors, dev):
    for i, blk in enumerate(model.blocks):
        for name, attr in MODULES.items():
            lin = getattr(blk, attr)
            with torch.no_grad():
                lin.down.copy_(factors[f"blocks.{i}.{name}.down"].to(dev))
                lin.up.copy_(factors[f"blocks.{i}.{name}.up"].to(dev))


def lora_grads(model):
    out = {}
    for i, blk in enumerate(model.blocks):
        for name, attr in MODULES.items():
            lin = getattr(blk, attr)
            out[f"blocks.{i}.{name}.down"] = lin.down.grad.float().cpu()
            out[f"blocks.{i}.{name}.up"] = lin.up.grad.float().cpu()
    return out


def run(variant, rank, weights, factors, sample, dev, f32):
    """One checkpointed LoRA step; (loss, {name: gradient})."""
    torch.manual_seed(0)
    model = ref.Wan(variant, rank, dev)
    model.runs = [ref.Checkpointed(b, "blocks") for b in model.blocks]
    if f32:
        model.patch_w, model.patch_b = model.patch_w.float(), model.patch_b.float()
        model.text = [(w.float(), b.float()) for w, b in model.text]
        model.head = tuple(t.float() for t in model.head)
        for blk in model.blocks:
            for name, buf in list(blk.named_buffers(recurse=True)):
                owner = blk
                *path, leaf = name.split(".")
                for part in path:
                    owner = getattr(owner, part)
                owner.register_buffer(leaf, buf.float())
    assign(model, weights, dev)
    set_lora(model, factors, dev)
    xt, target = sample["xt"].to(dev), sample["target"].to(dev)
    t, context = sample["timestep"].to(dev), sample["context"].to(dev)
    if f32:
        # No TF32 anywhere, and the memory-efficient kernel (f32 capable; the math backend would materialise the
        # whole score matrix).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            out = model(xt, t, context.float())
            loss = F.mse_loss(out.float(), target)
            loss.backward()
    else:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(xt, t, context.to(torch.bfloat16))
        loss = F.mse_loss(out.float(), target)
        loss.backward()
    grads = lora_grads(model)
    del model
    torch.cuda.empty_cache()
    return loss.item(), grads


def rel(a, b):
    """‖a − b‖ / ‖b‖ (Frobenius)."""
    nb = b.double().norm().item()
    d = (a.double() - b.double()).norm().item()
    return d / nb if nb > 0 else d


def summary(errs):
    vals = sorted(errs.values())
    worst = max(errs, key=errs.get)
    return {"median": vals[len(vals) // 2], "max": vals[-1], "worst": worst}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir", help="what `framesmith-bench equivalence --out` wrote")
    p.add_argument("--variant", default="t2v-1.3b", choices=sorted(ref.VARIANTS))
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--factor", type=float, default=2.0,
                   help="ours may be this many times further from the f32 step than PyTorch's bf16 step")
    a = p.parse_args()
    dev = torch.device("cuda")
    weights = load(f"{a.dir}/weights.safetensors")
    factors = load(f"{a.dir}/lora.safetensors")
    sample = load(f"{a.dir}/sample.safetensors")
    ours = load(f"{a.dir}/grads.safetensors")
    ours_loss = ours.pop("loss").item()
    variant = ref.VARIANTS[a.variant]
    bf16_loss, bf16 = run(variant, a.rank, weights, factors, sample, dev, f32=False)
    f32_loss, f32 = run(variant, a.rank, weights, factors, sample, dev, f32=True)
    if set(ours) != set(f32):
        missing = sorted(set(f32) ^ set(ours))[:5]
        sys.exit(f"the gradient files name different tensors: {missing} …")
    ours_vs_f32 = {k: rel(ours[k], f32[k]) for k in f32}
    torch_vs_f32 = {k: rel(bf16[k], f32[k]) for k in f32}
    ours_vs_torch = {k: rel(ours[k], bf16[k]) for k in f32}
    res = {
        "tensors": len(f32),
        "loss": {"ours": ours_loss, "torch_bf16": bf16_loss, "torch_f32": f32_loss,
                 "ours_rel_f32": abs(ours_loss - f32_loss) / abs(f32_loss),
                 "torch_bf16_rel_f32": abs(bf16_loss - f32_loss) / abs(f32_loss)},
        "grads_ours_vs_f32": summary(ours_vs_f32),
        "grads_torch_bf16_vs_f32": summary(torch_vs_f32),
        "grads_ours_vs_torch_bf16": summary(ours_vs_torch),
    }
    tol_loss = max(a.factor * res["loss"]["torch_bf16_rel_f32"], 1e-4)
    ok = (res["loss"]["ours_rel_f32"] <= tol_loss
          and res["grads_ours_vs_f32"]["median"] <= a.factor * res["grads_torch_bf16_vs_f32"]["median"]
          and res["grads_ours_vs_f32"]["max"] <= a.factor * res["grads_torch_bf16_vs_f32"]["max"]
          and all(math.isfinite(v) for v in ours_vs_f32.values()))
    res["pass"] = ok
    print("EQUIV " + json.dumps(res), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
