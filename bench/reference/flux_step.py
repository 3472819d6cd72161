"""PyTorch reference for FLUX.1 [dev] LoRA training: a training step of the FLUX.1 DiT written here from the
official architecture (black-forest-labs/flux: `model.py`'s Flux forward, `modules/layers.py`'s embedders,
modulation, double- and single-stream blocks and last layer, `math.py`'s RoPE and attention), with the weights
read from a DiT file in the official `flux1-dev.safetensors` layout (ComfyUI's `model.diffusion_model.` prefix
and FP8 `float8_e4m3fn` weights, with or without `scale_weight`, are read too: FP8 weights are dequantised to
bf16). bf16 autocast over frozen bf16 base weights, SDPA attention, per-block activation checkpointing
(torch.utils.checkpoint, non-reentrant) over every double- and single-stream block, LoRA (f32 factors, down
Kaiming-uniform, up zero) on the linears Framesmith's FLUX.1 trainer adapts by default (double blocks: img/txt
attn.qkv, attn.proj, mlp.0, mlp.2; single blocks: linear1, linear2), flow-matching MSE loss in f32 with guidance
1.0, AdamW (and gradient clipping at 1.0) on the LoRA parameters.

`--kind lora,lokr,loha,dora` trains those kinds through PEFT instead (bench/reference/peft_kinds.py: PEFT's
LoraConfig, LoKrConfig, LoHaConfig, `use_dora`) on the same targets, one after another on the weights loaded once,
each with its own `FLUX_STEP` line (its `kind` field set) and its own peak memory.

Prints each step's time, then `FLUX_STEP {json}` (mean and median ms of the timed steps after the warm-up,
torch.cuda.max_memory_allocated and max_memory_reserved over the whole run, weights included) and a `BENCH` line
in the format of bench/reference/common.py.

`--check-fixture DIR` instead runs the forward (per-block checkpointing on) and backward in f32 on the inputs of a
fixture made by the official code (`flux_dit` of shared/fixtures/flux) and compares the packing, RoPE table,
conditioning vector, output and input gradients with the official ones (rel ≤ 1e-4), or exits 1: a check that this
reference is the official architecture. Needs only PyTorch (no safetensors or einops package)."""
import argparse
import json
import math
import struct
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import peft_kinds

# Set by --kind: adapted linears become PEFT targets instead of carrying the hand-written LoRA.
PEFT_TARGETS = False

from common import adamw, optimizer_step, report_train_step, time_train_steps

PREFIXES = ("model.diffusion_model.", "diffusion_model.")
DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "U8": torch.uint8,
    "F8_E4M3": torch.float8_e4m3fn,
}
TIMESTEP_DIM = 256
LORA_DOUBLE = ("img_attn.qkv", "img_attn.proj", "img_mlp.0", "img_mlp.2",
               "txt_attn.qkv", "txt_attn.proj", "txt_mlp.0", "txt_mlp.2")
LORA_SINGLE = ("linear1", "linear2")


def read_safetensors(path, device):
    """Every tensor of a safetensors file (json header + torch.frombuffer), moved to `device` one by one."""
    out = {}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] not in DTYPES:
                raise SystemExit(f"{path}: tensor {name} has dtype {info['dtype']}, which this reader does not know")
            start, end = info["data_offsets"]
            dtype = DTYPES[info["dtype"]]
            if end == start:
                out[name] = torch.empty(info["shape"], dtype=dtype, device=device)
                continue
            buf = bytearray(end - start)
            f.seek(base + start)
            f.readinto(buf)
            t = torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(info["shape"])
            out[name] = t.to(device)
    return out


def official_state(path, device, dtype):
    """The DiT's tensors under the official names in `dtype`: prefix stripped, FP8 weights times their scale."""
    raw = read_safetensors(path, device)
    named = {}
    for name, t in raw.items():
        if name == "scaled_fp8":
            continue
        for p in PREFIXES:
            if name.startswith(p):
                name = name[len(p):]
                break
        named[name] = t
    state = {}
    for name, t in named.items():
        if name.endswith(".scale_weight") or name.endswith(".weight_scale"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            module = name[: -len(".weight")] if name.endswith(".weight") else name
            scale = named.get(module + ".scale_weight", named.get(module + ".weight_scale"))
            t = t.float()
            if scale is not None:
                scale = scale.float()
                t = t * (scale.reshape(-1, *([1] * (t.dim() - 1))) if scale.numel() > 1 else scale.reshape(()))
        state[name] = t.to(dtype)
    return state


def config_of(sd, axes_dim=None):
    """FluxParams from the shapes (the official constructor's names)."""
    if "double_blocks.0.img_attn.qkv.weight" not in sd:
        raise SystemExit("not a FLUX.1 DiT: no double_blocks.0.img_attn.qkv.weight")
    count = lambda p: len({k[len(p):].split(".")[0] for k in sd if k.startswith(p)})  # noqa: E731
    hidden = sd["img_in.weight"].shape[0]
    head_dim = sd["double_blocks.0.img_attn.norm.query_norm.scale"].shape[0]
    if axes_dim is None:
        hw = 2 * (7 * head_dim // 32)
        axes_dim = [head_dim - 2 * hw, hw, hw]
    return dict(
        in_channels=sd["img_in.weight"].shape[1],
        out_channels=sd["final_layer.linear.weight"].shape[0],
        vec_in_dim=sd["vector_in.in_layer.weight"].shape[1],
        context_in_dim=sd["txt_in.weight"].shape[1],
        hidden_size=hidden,
        mlp_hidden=sd["double_blocks.0.img_mlp.0.weight"].shape[0],
        num_heads=hidden // head_dim,
        depth=count("double_blocks."),
        depth_single_blocks=count("single_blocks."),
        axes_dim=list(axes_dim),
        theta=10000,
        guidance_embed="guidance_in.in_layer.weight" in sd,
    )


class Linear(torch.nn.Module):
    """A frozen linear (weights as stored) with an optional trainable LoRA pair: x Wᵀ + b + (x Aᵀ) Bᵀ · alpha / r."""

    def __init__(self, sd, name, rank=0, alpha=0.0):
        super().__init__()
        weight, bias = sd.pop(name + ".weight"), sd.pop(name + ".bias", None)
        self.peft_base = None
        if rank and PEFT_TARGETS:
            self.peft_base = peft_kinds.frozen_linear(weight, bias)
            rank = 0
        else:
            self.register_buffer("weight", weight)
            self.register_buffer("bias", bias)
        self.rank = rank
        if rank:
            out_f, in_f = self.weight.shape
            bound = 1 / math.sqrt(in_f)
            dev = self.weight.device
            self.lora_down = torch.nn.Parameter(torch.empty(rank, in_f, device=dev).uniform_(-bound, bound))
            self.lora_up = torch.nn.Parameter(torch.zeros(out_f, rank, device=dev))
            self.lora_scale = alpha / rank

    def forward(self, x):
        if self.peft_base is not None:
            return self.peft_base(x)
        y = F.linear(x, self.weight, self.bias)
        if self.rank:
            y = y + F.linear(F.linear(x, self.lora_down), self.lora_up) * self.lora_scale
        return y


def timestep_embedding(t, dim=TIMESTEP_DIM, max_period=10000, time_factor=1000.0):
    """Sinusoidal embedding of t·1000: cosines then sines, in t's dtype when t is floating."""
    t = time_factor * t
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    return emb.to(t) if torch.is_floating_point(t) else emb


class Embedder(torch.nn.Module):
    """in_layer → SiLU → out_layer."""

    def __init__(self, sd, name):
        super().__init__()
        self.in_layer = Linear(sd, name + ".in_layer")
        self.out_layer = Linear(sd, name + ".out_layer")

    def forward(self, x):
        return self.out_layer(F.silu(self.in_layer(x)))


def rope_table(ids, axes_dim, theta):
    """[B, 1, L, D/2, 2, 2] rotation matrices of the (t, h, w) ids: per axis, angles pos·theta^(-2i/d) in f64."""
    parts = []
    for i, d in enumerate(axes_dim):
        omega = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=ids.device) / d)
        ang = ids[..., i].double()[..., None] * omega
        rot = torch.stack([ang.cos(), -ang.sin(), ang.sin(), ang.cos()], dim=-1)
        parts.append(rot.reshape(*ang.shape, 2, 2))
    return torch.cat(parts, dim=-3).unsqueeze(1).float()


def apply_rope(x, table):
    """Rotates the adjacent pairs of x [B, H, L, D] by the table (in f32; x's dtype out)."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 1, 2)
    out = table[..., 0] * pairs[..., 0] + table[..., 1] * pairs[..., 1]
    return out.reshape(*x.shape).type_as(x)


def attention(q, k, v, table):
    """RoPE on q and k, SDPA, heads folded back: [B, H, L, D] → [B, L, H·D]."""
    x = F.scaled_dot_product_attention(apply_rope(q, table), apply_rope(k, table), v)
    b, h, l, d = x.shape
    return x.transpose(1, 2).reshape(b, l, h * d)


def rms_norm(x, scale):
    """RMSNorm in f32 (eps 1e-6), back to x's dtype, times the learnt scale."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * scale


def layer_norm(x):
    """LayerNorm without affine parameters, eps 1e-6."""
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6)


class Attn(torch.nn.Module):
    """qkv → per-head q/k RMSNorm; the projection is applied by the block."""

    def __init__(self, sd, prefix, heads, lora):
        super().__init__()
        self.heads = heads
        self.qkv = Linear(sd, prefix + ".qkv", *lora)
        self.proj = Linear(sd, prefix + ".proj", *lora)
        self.register_buffer("q_scale", sd.pop(prefix + ".norm.query_norm.scale"))
        self.register_buffer("k_scale", sd.pop(prefix + ".norm.key_norm.scale"))

    def split(self, x):
        """x [B, L, 3·H·D] → q, k, v [B, H, L, D], q and k normalised and in v's dtype."""
        b, l, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, l, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return rms_norm(q, self.q_scale).to(v), rms_norm(k, self.k_scale).to(v), v


class Mlp(torch.nn.Module):
    def __init__(self, sd, prefix, lora):
        super().__init__()
        self.fc0 = Linear(sd, prefix + ".0", *lora)
        self.fc2 = Linear(sd, prefix + ".2", *lora)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc0(x), approximate="tanh"))


def modulation(lin, vec, n):
    """lin(SiLU(vec)) as n chunks [B, 1, dim]: (shift, scale, gate) per group."""
    return lin(F.silu(vec))[:, None, :].chunk(n, dim=-1)


class DoubleBlock(torch.nn.Module):
    """Separate image and text weights, one joint attention over [txt; img]."""

    def __init__(self, sd, i, heads, lora):
        super().__init__()
        p = f"double_blocks.{i}"
        self.img_mod = Linear(sd, p + ".img_mod.lin")
        self.txt_mod = Linear(sd, p + ".txt_mod.lin")
        self.img_attn = Attn(sd, p + ".img_attn", heads, lora)
        self.txt_attn = Attn(sd, p + ".txt_attn", heads, lora)
        self.img_mlp = Mlp(sd, p + ".img_mlp", lora)
        self.txt_mlp = Mlp(sd, p + ".txt_mlp", lora)

    def forward(self, img, txt, vec, table):
        i_sh1, i_sc1, i_g1, i_sh2, i_sc2, i_g2 = modulation(self.img_mod, vec, 6)
        t_sh1, t_sc1, t_g1, t_sh2, t_sc2, t_g2 = modulation(self.txt_mod, vec, 6)
        iq, ik, iv = self.img_attn.split((1 + i_sc1) * layer_norm(img) + i_sh1)
        tq, tk, tv = self.txt_attn.split((1 + t_sc1) * layer_norm(txt) + t_sh1)
        attn = attention(torch.cat((tq, iq), 2), torch.cat((tk, ik), 2), torch.cat((tv, iv), 2), table)
        t_len = txt.shape[1]
        txt_a, img_a = attn[:, :t_len], attn[:, t_len:]
        img = img + i_g1 * self.img_attn.proj(img_a)
        img = img + i_g2 * self.img_mlp((1 + i_sc2) * layer_norm(img) + i_sh2)
        txt = txt + t_g1 * self.txt_attn.proj(txt_a)
        txt = txt + t_g2 * self.txt_mlp((1 + t_sc2) * layer_norm(txt) + t_sh2)
        return img, txt


class SingleBlock(torch.nn.Module):
    """One linear makes q, k, v and the MLP input; another takes [attention; GELU(mlp)] back to the width."""

    def __init__(self, sd, i, heads, lora):
        super().__init__()
        p = f"single_blocks.{i}"
        self.heads = heads
        self.linear1 = Linear(sd, p + ".linear1", *lora)
        self.linear2 = Linear(sd, p + ".linear2", *lora)
        self.modulation = Linear(sd, p + ".modulation.lin")
        self.register_buffer("q_scale", sd.pop(p + ".norm.query_norm.scale"))
        self.register_buffer("k_scale", sd.pop(p + ".norm.key_norm.scale"))

    def forward(self, x, vec, table):
        shift, scale, gate = modulation(self.modulation, vec, 3)
        hidden = x.shape[-1]
        h = self.linear1((1 + scale) * layer_norm(x) + shift)
        qkv, mlp = h[..., : 3 * hidden], h[..., 3 * hidden:]
        b, l, _ = qkv.shape
        q, k, v = qkv.reshape(b, l, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k = rms_norm(q, self.q_scale).to(v), rms_norm(k, self.k_scale).to(v)
        out = self.linear2(torch.cat((attention(q, k, v, table), F.gelu(mlp, approximate="tanh")), 2))
        return x + gate * out


class Flux(torch.nn.Module):
    """The DiT: embeddings, double-stream blocks, single-stream blocks over [txt; img], the modulated head."""

    def __init__(self, sd, cfg, rank, alpha, checkpointing):
        super().__init__()
        self.cfg = cfg
        self.checkpointing = checkpointing
        lora = (rank, alpha)
        heads = cfg["num_heads"]
        self.img_in = Linear(sd, "img_in")
        self.time_in = Embedder(sd, "time_in")
        self.vector_in = Embedder(sd, "vector_in")
        self.guidance_in = Embedder(sd, "guidance_in") if cfg["guidance_embed"] else None
        self.txt_in = Linear(sd, "txt_in")
        self.double_blocks = torch.nn.ModuleList(DoubleBlock(sd, i, heads, lora) for i in range(cfg["depth"]))
        self.single_blocks = torch.nn.ModuleList(
            SingleBlock(sd, i, heads, lora) for i in range(cfg["depth_single_blocks"])
        )
        self.final_linear = Linear(sd, "final_layer.linear")
        self.final_mod = Linear(sd, "final_layer.adaLN_modulation.1")
        if sd:
            raise SystemExit(f"tensors left unused (not the FLUX.1 layout?): {sorted(sd)[:5]}")

    def run(self, block, *args):
        if self.checkpointing and torch.is_grad_enabled():
            return checkpoint(block, *args, use_reentrant=False)
        return block(*args)

    def forward(self, img, img_ids, txt, txt_ids, timesteps, y, guidance=None, taps=None):
        img = self.img_in(img)
        vec = self.time_in(timestep_embedding(timesteps))
        if self.guidance_in is not None:
            vec = vec + self.guidance_in(timestep_embedding(guidance))
        vec = vec + self.vector_in(y)
        txt = self.txt_in(txt)
        table = rope_table(torch.cat((txt_ids, img_ids), dim=1), self.cfg["axes_dim"], self.cfg["theta"])
        if taps is not None:
            taps["vec"] = vec
        for block in self.double_blocks:
            img, txt = self.run(block, img, txt, vec, table)
        t_len = txt.shape[1]
        x = torch.cat((txt, img), 1)
        for block in self.single_blocks:
            x = self.run(block, x, vec, table)
        x = x[:, t_len:]
        shift, scale = self.final_mod(F.silu(vec)).chunk(2, dim=1)
        return self.final_linear((1 + scale[:, None, :]) * layer_norm(x) + shift[:, None, :])


def pack(latent):
    """[B, C, H, W] → [B, (H/2)(W/2), C·4] (b c (h 2) (w 2) → b (h w) (c 2 2)) and the (0, row, col) ids."""
    b, c, h, w = latent.shape
    img = latent.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)
    ids = torch.zeros(h // 2, w // 2, 3, device=latent.device)
    ids[..., 1] = torch.arange(h // 2, device=latent.device)[:, None]
    ids[..., 2] = torch.arange(w // 2, device=latent.device)[None, :]
    return img, ids.reshape(1, -1, 3).expand(b, -1, -1)


def first_tensor(tensors, prefix, path):
    for name, t in tensors.items():
        if name.startswith(prefix):
            return t
    raise SystemExit(f"{path}: no {prefix}* tensor")


def inputs(a, cfg, dev):
    """Latents [1, 16, H/8, W/8], T5 features [1, L, 4096] and the pooled vector [1, 768]: from Framesmith's FLUX.1
    caches when given, else random of --height x --width and --text-tokens."""
    if a.latent_cache:
        latent = first_tensor(read_safetensors(a.latent_cache, dev), "latents_", a.latent_cache)
        latent = latent.float().transpose(0, 1)  # [C, 1, H, W] → [1, C, H, W]
    else:
        latent = torch.randn(1, cfg["in_channels"] // 4, a.height // 8, a.width // 8, device=dev)
    if a.text_cache:
        te = read_safetensors(a.text_cache, dev)
        txt = first_tensor(te, "t5_vec", a.text_cache).float()[None]
        y = first_tensor(te, "clip_l_pooler", a.text_cache).float().reshape(1, -1)
    else:
        txt = torch.randn(1, a.text_tokens, cfg["context_in_dim"], device=dev)
        y = torch.randn(1, cfg["vec_in_dim"], device=dev)
    return latent, txt, y


def forward_flops(cfg, img_len, txt_len):
    """Multiply-adds × 2 of one forward: the blocks' linears and attention (embeddings and head left out)."""
    d, m = cfg["hidden_size"], cfg["mlp_hidden"]
    seq = img_len + txt_len
    double = 2 * seq * (4 * d * d + 2 * d * m) + 4 * seq * seq * d
    single = 2 * seq * (d * (3 * d + m) + (d + m) * d) + 4 * seq * seq * d
    return cfg["depth"] * double + cfg["depth_single_blocks"] * single


def check_fixture(case):
    """The f32 forward on a fixture's inputs against the official output (and conditioning vector)."""
    sd = read_safetensors(f"{case}/weights.safetensors", "cpu")
    x = read_safetensors(f"{case}/inputs.safetensors", "cpu")
    want = read_safetensors(f"{case}/expected.safetensors", "cpu")
    init = json.load(open(f"{case}/config.json"))["init"]
    cfg = config_of(sd, init["axes_dim"])
    cfg["theta"] = init["theta"]
    # Per-block checkpointing on, so that the recompute path is the one checked.
    model = Flux(dict(sd), cfg, 0, 0.0, checkpointing=True)
    img, img_ids = pack(x["latent"])
    img = img.clone().requires_grad_(True)
    txt = x["txt"].clone().requires_grad_(True)
    taps = {}
    out = model(img, img_ids, txt, x["txt_ids"], x["timesteps"], x["y"], x.get("guidance"), taps)
    (out * x["probe"]).sum().backward()
    pe = rope_table(torch.cat((x["txt_ids"], img_ids), dim=1), cfg["axes_dim"], cfg["theta"])
    worst = 0.0
    checks = (("packed img", img.detach(), x["img"]), ("img_ids", img_ids, x["img_ids"]), ("pe", pe, want["pe"]),
              ("out", out.detach(), want["out"]), ("vec", taps["vec"].detach(), want["vec"]),
              ("grad.img", img.grad, want["grad.img"]), ("grad.txt", txt.grad, want["grad.txt"]))
    for name, got, ref in checks:
        rel = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        print(f"{name}: shape {list(got.shape)}, rel err {rel:.2e}")
        worst = max(worst, rel)
    ok = worst <= 1e-4
    print(("ok" if ok else "FAIL") + f": the reference matches the official forward (worst rel {worst:.2e}, tol 1e-4)")
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dit", help="DiT .safetensors (official layout; ComfyUI prefix and FP8 read too)")
    p.add_argument("--latent-cache", help="a Framesmith *_flux.safetensors latent cache (else random latents)")
    p.add_argument("--text-cache", help="a Framesmith *_flux_te.safetensors text cache (else random features)")
    p.add_argument("--height", type=int, default=1024)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--text-tokens", type=int, default=512)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=None, help="LoRA alpha (default: the rank)")
    p.add_argument("--sigma", type=float, default=0.75, help="the noise level of the step's sample")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--no-checkpointing", action="store_true", help="keep every activation (no recompute)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--kind", help="comma-separated adapter kinds trained through PEFT, one after another "
                   "(lora, lokr, loha, dora); without it, the hand-written LoRA")
    p.add_argument("--check-fixture", metavar="DIR", help="compare the forward with an official flux_dit fixture")
    a = p.parse_args()
    if a.check_fixture:
        return check_fixture(a.check_fixture)
    if not a.dit:
        p.error("--dit is required (or --check-fixture)")
    if a.height % 16 or a.width % 16:
        p.error("--height and --width must be multiples of 16")
    dev = torch.device(a.device)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    sd = official_state(a.dit, dev, torch.bfloat16)
    cfg = config_of(sd)
    load_secs = time.perf_counter() - t0
    kinds = a.kind.split(",") if a.kind else [None]
    global PEFT_TARGETS
    PEFT_TARGETS = a.kind is not None
    for kind in kinds:
        run_kind(a, dict(sd), cfg, kind, load_secs)
    return 0


def run_kind(a, sd, cfg, kind, load_secs):
    """Builds the model over `sd` (shared tensors) with `kind`'s adapters (None: the hand-written LoRA), times
    the steps and prints its FLUX_STEP line."""
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    alpha = a.alpha if a.alpha is not None else float(a.rank)
    model = Flux(sd, cfg, a.rank, alpha, not a.no_checkpointing)
    if kind is not None:
        params = peft_kinds.inject(model, kind, a.rank, alpha)
    else:
        params = [q for q in model.parameters() if q.requires_grad]
    torch.manual_seed(1)  # the same inputs for every kind, whatever drawing the adapters took
    latent, txt, y = inputs(a, cfg, dev)
    noise = torch.randn_like(latent)
    xt, img_ids = pack((1 - a.sigma) * latent + a.sigma * noise)
    target = pack(noise - latent)[0]
    txt_ids = torch.zeros(1, txt.shape[1], 3, device=dev)
    timesteps = torch.tensor([a.sigma], device=dev)
    guidance = torch.tensor([1.0], device=dev)
    xt, txt, y = xt.to(torch.bfloat16), txt.to(torch.bfloat16), y.to(torch.bfloat16)
    opt = adamw(params, a.lr)
    losses = []

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            pred = model(xt, img_ids, txt, txt_ids, timesteps, y, guidance)
        loss = F.mse_loss(pred.float(), target)
        optimizer_step(loss, params, opt, losses)

    timing = time_train_steps(step, losses, a.warmup, a.iters, cuda)
    img_len, txt_len = xt.shape[1], txt.shape[1]
    fields = {
        "blocks": [cfg["depth"], cfg["depth_single_blocks"]],
        "hidden": cfg["hidden_size"],
        "image": [a.width, a.height] if not a.latent_cache else [latent.shape[3] * 8, latent.shape[2] * 8],
        "img_tokens": img_len,
        "txt_tokens": txt_len,
        "rank": a.rank,
        "kind": kind or "lora (hand-written)",
        "lora_parameters": sum(q.numel() for q in params),
        "checkpointing": not a.no_checkpointing,
    }
    flops = (3.0 if a.no_checkpointing else 4.0) * forward_flops(cfg, img_len, txt_len)
    shape = f"b=1 {fields['image'][0]}x{fields['image'][1]} img={img_len} txt={txt_len} r={a.rank}"
    last = {"load_secs": load_secs, "loss": losses[-1].item()}
    bench = ("flux-step", "flux-dev bf16", f"{kind or 'lora'} step", shape, flops)
    report_train_step("FLUX_STEP", cuda, fields, timing, last, bench)
    del model, params, opt




if __name__ == "__main__":
    sys.exit(main())
