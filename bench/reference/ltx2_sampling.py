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

A second case, `sampling_ltx23_av_i2v` (same kind), drives both streams and image-to-video as ltx-pipelines'
one-stage text/image-to-audio+video pipeline does (`euler_denoising_loop` with the guided denoiser's CFG pass, STG
and the modality pass off): the `ltx23_av` transformer case of bench/reference/ltx2_av.py (its weights copied in),
a clip of 2 x 3 x 2 latent tokens and 5 audio latent frames, both streams' start noise, the first latent frame's
tokens replaced by clean image latents (`VideoConditionByLatentIndex` at 0, strength 1: denoise mask 0 there, so
timestep 0 on them and `post_process_latent` keeping them clean), X0Model over both streams, the video guided at
CFG 3.0 and the audio at 7.0 (both with rescale 0.7, the uncond pass with both negative contexts), Euler on both.
Extra inputs `first_frame` [1, 6, 8] (the clean tokens), `audio_noise` [1, 5, 8], `audio_context`,
`audio_negative_context` [5, 8]; extra expected `audio_denoised.0`, `audio_uncond.0`, `audio_guided.0`,
`audio_latent.1..3`; `call.audio_frames`, `call.audio_cfg_scale`.
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
from ltx2_av import audio_positions  # noqa: E402
from ltx2_av import build as build_av  # noqa: E402

from ltx_core.components.diffusion_steps import EulerDiffusionStep  # noqa: E402
from ltx_core.components.guiders import MultiModalGuider, MultiModalGuiderParams  # noqa: E402
from ltx_core.components.schedulers import LTX2Scheduler  # noqa: E402
from ltx_core.model.transformer.modality import Modality  # noqa: E402
from ltx_core.model.transformer.model import X0Model  # noqa: E402

COMMIT = "400fd31054597515f47125691032c04b1c3ee24e"
FIXTURES = Path(__file__).resolve().parents[2] / "crates/framesmith-models/tests/fixtures/ltx2"
WEIGHTS = FIXTURES / "ltx23_t2v/weights.safetensors"
OUT = FIXTURES / "sampling_ltx23"
AV_WEIGHTS = FIXTURES / "ltx23_av/weights.safetensors"
AV_OUT = FIXTURES / "sampling_ltx23_av_i2v"

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


AV_CALL = {
    "layout": "single_file",
    "frames": 2,
    "height": 3,
    "width": 2,
    "fps": 24.0,
    "steps": 3,
    "cfg_scale": 3.0,
    "audio_cfg_scale": 7.0,
    "rescale_scale": 0.7,
    "txt_len": 5,
    "audio_frames": 5,
    "seed": 13,
}


def t2v_case():
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


def av_i2v_case():
    cfg = transformer_config("ltx23")
    model = build_av("ltx23").float().eval()
    sd = load_file(AV_WEIGHTS)
    model.load_state_dict({k.removeprefix("model.diffusion_model."): v for k, v in sd.items()})
    x0_model = X0Model(model)

    f, h, w, ta = AV_CALL["frames"], AV_CALL["height"], AV_CALL["width"], AV_CALL["audio_frames"]
    tokens, lead = f * h * w, h * w
    inner = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    audio_inner = cfg["audio_num_attention_heads"] * cfg["audio_attention_head_dim"]
    g = torch.Generator().manual_seed(AV_CALL["seed"])
    noise = torch.randn(1, tokens, cfg["in_channels"], generator=g)
    audio_noise = torch.randn(1, ta, cfg["audio_in_channels"], generator=g)
    first_frame = torch.randn(1, lead, cfg["in_channels"], generator=g)
    context = torch.randn(AV_CALL["txt_len"], inner, generator=g)
    negative = torch.randn(AV_CALL["txt_len"], inner, generator=g)
    audio_context = torch.randn(AV_CALL["txt_len"], audio_inner, generator=g)
    audio_negative = torch.randn(AV_CALL["txt_len"], audio_inner, generator=g)
    positions = video_positions({"batch": 1, "frames": f, "height": h, "width": w, "fps": AV_CALL["fps"]})
    a_positions = audio_positions({"batch": 1, "audio_frames": ta})

    sigmas = LTX2Scheduler().execute(steps=AV_CALL["steps"]).float()
    sigmas_tokens = LTX2Scheduler().execute(steps=AV_CALL["steps"], latent=torch.zeros(1, 8, f, h, w)).float()
    stepper = EulerDiffusionStep()

    def guider(scale):
        return MultiModalGuider(
            MultiModalGuiderParams(cfg_scale=scale, rescale_scale=AV_CALL["rescale_scale"], stg_scale=0.0)
        )

    video_guider, audio_guider = guider(AV_CALL["cfg_scale"]), guider(AV_CALL["audio_cfg_scale"])
    # The conditioned state: the first frame's tokens clean (denoise mask 0), the rest noise.
    denoise_mask = torch.ones(1, tokens, 1)
    denoise_mask[:, :lead] = 0.0
    clean = torch.zeros(1, tokens, cfg["in_channels"])
    clean[:, :lead] = first_frame
    latent = noise * denoise_mask + clean * (1 - denoise_mask)
    audio_latent = audio_noise.clone()
    audio_mask = torch.ones(1, ta, 1)
    expected = {"sigmas": sigmas, "sigmas_tokens": sigmas_tokens}
    with torch.no_grad():
        for i, sigma in enumerate(sigmas[:-1]):

            def modalities(ctx, a_ctx, sigma=sigma, latent=latent, audio_latent=audio_latent):
                video = Modality(
                    enabled=True,
                    latent=latent,
                    sigma=sigma.unsqueeze(0),
                    timesteps=denoise_mask * sigma,
                    positions=positions,
                    context=ctx.unsqueeze(0),
                    context_mask=None,
                )
                audio = Modality(
                    enabled=True,
                    latent=audio_latent,
                    sigma=sigma.unsqueeze(0),
                    timesteps=audio_mask * sigma,
                    positions=a_positions,
                    context=a_ctx.unsqueeze(0),
                    context_mask=None,
                )
                return {"video": video, "audio": audio}

            pos_v, pos_a = x0_model(**modalities(context, audio_context), perturbations=None)
            neg_v, neg_a = x0_model(**modalities(negative, audio_negative), perturbations=None)
            guided_v = video_guider.calculate(pos_v, neg_v, 0.0, 0.0)
            guided_a = audio_guider.calculate(pos_a, neg_a, 0.0, 0.0)
            if i == 0:
                expected.update(
                    {
                        "denoised.0": pos_v,
                        "uncond.0": neg_v,
                        "guided.0": guided_v,
                        "audio_denoised.0": pos_a,
                        "audio_uncond.0": neg_a,
                        "audio_guided.0": guided_a,
                    }
                )
            guided_v = post_process_latent(guided_v, denoise_mask, clean)
            latent = stepper.step(latent, guided_v, sigmas, i)
            audio_latent = stepper.step(audio_latent, guided_a, sigmas, i)
            expected[f"latent.{i + 1}"] = latent
            expected[f"audio_latent.{i + 1}"] = audio_latent
    assert torch.isfinite(latent).all() and torch.isfinite(audio_latent).all()
    assert torch.equal(latent[:, :lead], first_frame), "the first frame stays clean"

    AV_OUT.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(AV_WEIGHTS, AV_OUT / "weights.safetensors")
    inputs = {
        "noise": noise,
        "audio_noise": audio_noise,
        "first_frame": first_frame,
        "context": context,
        "negative_context": negative,
        "audio_context": audio_context,
        "audio_negative_context": audio_negative,
    }
    save_file({k: v.contiguous() for k, v in inputs.items()}, AV_OUT / "inputs.safetensors")
    save_file({k: v.detach().contiguous() for k, v in expected.items()}, AV_OUT / "expected.safetensors")
    config = {
        "kind": "ltx2_sampling",
        "source": f"github:Lightricks/LTX-2@{COMMIT} (ltx-core 1.2.0)",
        "components": "LTX2Scheduler, X0Model(LTXModel, both streams), MultiModalGuider x2, EulerDiffusionStep, "
        "post_process_latent (as ltx_pipelines.utils.helpers defines it)",
        "init": cfg,
        "call": AV_CALL,
        "torch": torch.__version__,
    }
    (AV_OUT / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"av+i2v: |latent| max {latent.abs().max():.3f}, |audio| max {audio_latent.abs().max():.3f}")


def post_process_latent(denoised, denoise_mask, clean):
    """ltx_pipelines.utils.helpers.post_process_latent (ltx-pipelines is not on the path: ltx-core only)."""
    return (denoised * denoise_mask + clean.float() * (1 - denoise_mask)).to(denoised.dtype)


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    t2v_case()
    av_i2v_case()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    sys.exit(main())
