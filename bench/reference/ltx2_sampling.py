"""Parity fixture for Framesmith's LTX-2 sampling (text-to-video, video only), made by the official implementation:
ltx-core's components of github:Lightricks/LTX-2 (package ltx-core 1.2.0) at commit
400fd31054597515f47125691032c04b1c3ee24e, driven as the official trainer's `ValidationRunner._run_denoising`
drives them for a video-only sample: `LTX2Scheduler().execute(steps)` (no latent: the pipelines' 4096-token
shift), `X0Model` over `LTXModel` called with `audio=None`, `MultiModalGuider` with CFG and the guidance rescale
(STG off), `EulerDiffusionStep`. Random weights at small shapes (the `ltx23_t2v` transformer case of
bench/reference/ltx2.py: LTX-2.3's switches, stored as the released single file), float32 on the CPU, one thread.

Versions: ltx-core from the commit above on PYTHONPATH (`packages/ltx-core/src`), with einops 0.8.x and scipy (the
schedulers module imports it); torch 2.15.0 (PyPI wheel, CPU), safetensors 0.8.0, numpy 2.4.6, Python 3.11.7.

Command (from the repository root; writes crates/framesmith-models/tests/fixtures/ltx2/sampling_ltx23/):
  git clone https://github.com/Lightricks/LTX-2 /tmp/LTX-2 && git -C /tmp/LTX-2 checkout 400fd310
  pip install --target /tmp/ltxdeps einops scipy
  PYTHONPATH=/tmp/LTX-2/packages/ltx-core/src:/tmp/ltxdeps /work/venv-ref/bin/python bench/reference/ltx2_sampling.py

The case (`kind` `ltx2_sampling`): a clip of 2 x 3 x 2 latent tokens at 24 fps (the trainer's positions, causal
fix), start noise [1, 12, 8] from a seeded generator (the state the `GaussianNoiser` makes from zeros), 3 steps at
CFG 3.0 with rescale 0.7 against a negative text context, text contexts [5, 16] of random values. Tensors: inputs
`noise`, `context`, `negative_context`; expected `sigmas` (the scheduler's), `sigmas_tokens` (`execute(steps,
latent)` with this clip's 12 tokens: the token-count shift), `denoised.0` / `uncond.0` / `guided.0` (step 0's
denoised latents for the prompt and the negative prompt, and the guided result), `latent.1`, `latent.2`,
`latent.3` (the tokens after each Euler step; `latent.3` is the clip the decoder gets). The transformer's weights
are the `ltx23_t2v` case's, copied in as weights.safetensors.
"""
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ltx2 import build, transformer_config, video_positions  # noqa: E402

from ltx_core.components.diffusion_steps import EulerDiffusionStep  # noqa: E402
from ltx_core.components.guiders import MultiModalGuider, MultiModalGuiderParams  # noqa: E402
from ltx_core.components.schedulers import LTX2Scheduler  # noqa: E402
from ltx_core.model.transformer.modality import Modality  # noqa: E402
from ltx_core.model.transformer.model import X0Model  # noqa: E402

COMMIT = "400fd31054597515f47125691032c04b1c3ee24e"
FIXTURES = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/ltx2"
WEIGHTS = FIXTURES / "ltx23_t2v/weights.safetensors"
OUT = FIXTURES / "sampling_ltx23"

CALL = {
    "layout": "single_file",
    "frames": 2,
    "height": 3,
    "width": 2,
    "fps": 24.0,
    "steps": 3,
    "cfg_scale": 3.0,
    "rescale_scale": 0.7,
    "txt_len": 5,
    "seed": 11,
}


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg = transformer_config("ltx23")
    model = build("ltx23").float().eval()
    sd = load_file(WEIGHTS)
    model.load_state_dict({k.removeprefix("model.diffusion_model."): v for k, v in sd.items()})
    x0_model = X0Model(model)

    f, h, w = CALL["frames"], CALL["height"], CALL["width"]
    tokens = f * h * w
    g = torch.Generator().manual_seed(CALL["seed"])
    noise = torch.randn(1, tokens, cfg["in_channels"], generator=g)
    context = torch.randn(CALL["txt_len"], cfg["cross_attention_dim"], generator=g)
    negative = torch.randn(CALL["txt_len"], cfg["cross_attention_dim"], generator=g)
    positions = video_positions({"batch": 1, "frames": f, "height": h, "width": w, "fps": CALL["fps"]})

    scheduler = LTX2Scheduler()
    sigmas = scheduler.execute(steps=CALL["steps"]).float()
    sigmas_tokens = scheduler.execute(steps=CALL["steps"], latent=torch.zeros(1, 8, f, h, w)).float()
    stepper = EulerDiffusionStep()
    guider = MultiModalGuider(
        MultiModalGuiderParams(cfg_scale=CALL["cfg_scale"], rescale_scale=CALL["rescale_scale"], stg_scale=0.0)
    )
    expected = {"sigmas": sigmas, "sigmas_tokens": sigmas_tokens}
    latent = noise.clone()
    denoise_mask = torch.ones(1, tokens, 1)
    with torch.no_grad():
        for i, sigma in enumerate(sigmas[:-1]):

            def modality(ctx, sigma=sigma, latent=latent):
                return Modality(
                    enabled=True,
                    latent=latent,
                    sigma=sigma.unsqueeze(0),
                    timesteps=denoise_mask * sigma,
                    positions=positions,
                    context=ctx.unsqueeze(0),
                    context_mask=None,
                )

            pos, _ = x0_model(video=modality(context), audio=None, perturbations=None)
            neg, _ = x0_model(video=modality(negative), audio=None, perturbations=None)
            guided = guider.calculate(pos, neg, 0.0, 0.0)
            if i == 0:
                expected.update({"denoised.0": pos, "uncond.0": neg, "guided.0": guided})
            latent = stepper.step(latent, guided, sigmas, i)
            expected[f"latent.{i + 1}"] = latent
    assert torch.isfinite(latent).all()

    OUT.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(WEIGHTS, OUT / "weights.safetensors")
    inputs = {"noise": noise, "context": context, "negative_context": negative}
    save_file({k: v.contiguous() for k, v in inputs.items()}, OUT / "inputs.safetensors")
    save_file({k: v.detach().contiguous() for k, v in expected.items()}, OUT / "expected.safetensors")
    config = {
        "kind": "ltx2_sampling",
        "source": f"github:Lightricks/LTX-2@{COMMIT} (ltx-core 1.2.0)",
        "components": "LTX2Scheduler, X0Model(LTXModel), MultiModalGuider, EulerDiffusionStep",
        "init": cfg,
        "call": CALL,
        "torch": torch.__version__,
    }
    (OUT / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"sigmas {sigmas.tolist()}, tokens {sigmas_tokens.tolist()}, |latent| max {latent.abs().max():.3f}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    sys.exit(main())
