"""The adapter kinds of Framesmith's `[lora] kind` through PEFT (huggingface/peft; run against the version the GPU
machine has installed, printed as `PEFT x.y.z`): LoRA (`LoraConfig`), DoRA (`LoraConfig(use_dora=True)`), LoKr
(`LoKrConfig`, factor -1, w1 full, w2 a rank-r product below half its larger side, as LyCORIS and Framesmith
default) and LoHa (`LoHaConfig`), on the frozen linears a reference step marks as targets. The reference step
scripts (`flux_step.py`, `step.py`) use it for `--kind`.

A target is a plain `torch.nn.Linear` named `peft_base` inside the script's own layer (`frozen_linear`), holding
the frozen weight and bias; `inject` adds the adapters of one kind to every such module and returns the trainable
parameters (adapter weights in f32, as PEFT's `autocast_adapter_dtype` keeps them; the base stays bf16)."""
import torch

KINDS = ("lora", "lokr", "loha", "dora")


def frozen_linear(weight, bias):
    """A frozen `torch.nn.Linear` over `weight` [out, in] and `bias` (or None), sharing their storage."""
    out_f, in_f = weight.shape
    lin = torch.nn.Linear(in_f, out_f, bias=bias is not None, device="meta")
    lin.weight = torch.nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        lin.bias = torch.nn.Parameter(bias, requires_grad=False)
    return lin


def config(kind, rank, alpha):
    import peft

    targets = r".*peft_base"
    if kind in ("lora", "dora"):
        return peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, use_dora=kind == "dora")
    if kind == "lokr":
        return peft.LoKrConfig(r=rank, alpha=alpha, target_modules=targets, decompose_both=False,
                               decompose_factor=-1)
    if kind == "loha":
        return peft.LoHaConfig(r=rank, alpha=alpha, target_modules=targets)
    raise SystemExit(f"unknown kind {kind} (expected {', '.join(KINDS)})")


def inject(model, kind, rank, alpha):
    """Adds `kind` adapters to every `peft_base` of `model`; returns the trainable parameters."""
    import peft

    for q in model.parameters():
        q.requires_grad_(False)
    peft.inject_adapter_in_model(config(kind, rank, alpha), model)
    params = []
    for name, q in model.named_parameters():
        if "peft_base" in name and any(t in name for t in ("lora_", "hada_", "lokr_")):
            q.data = q.data.float()
            q.requires_grad_(True)
            params.append(q)
    if not params:
        raise SystemExit(f"PEFT added no {kind} parameters")
    print(f"PEFT {peft.__version__}: {kind}, {sum(q.numel() for q in params)} parameters", flush=True)
    return params
