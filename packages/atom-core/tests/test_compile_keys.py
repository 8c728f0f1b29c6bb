"""Serving never compiles a kernel again because a step has a new size.

Triton compiles a kernel once per specialization key (its constexprs, and whether each other integer argument is
1 or a multiple of 16).  An integer that follows the step -- a token, pair or sequence count, a stride equal to the
token count -- would compile a new variant the first time each class appears, seconds in the middle of serving
(likely the 1.6 s first-request TTFT of Qwen3-Next inside vLLM on an H100, 2026-12-06, that the next request did not
have).  The native runner here serves prompt batches of 1, 16, 9 + 7 and 3 + 17 + 33 tokens (step token counts and
sequence counts of every class; one prefill and one decode step each) with Triton's interpreter recording what the
GPU JIT would compile; constexpr variants (tile configurations per shape class) are bounded by design and not
counted."""

from __future__ import annotations

import pytest
import torch

from atom_core.runtime.runner import Runner
from atom_core.runtime.sampler import SamplingParams
from atom_kernels.compile_keys import recording, size_specializations
from atom_kernels.dispatch import ENV_OVERRIDE, triton_interpreting

PROMPT_BATCHES = [[[5]], [list(range(3, 19))], [list(range(2, 11)), list(range(20, 27))],
                  [[4, 5, 6], list(range(30, 47)), list(range(50, 83))]]
ARCHS = ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM", "Qwen3NextForCausalLM",
         "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"]


@pytest.mark.skipif(not triton_interpreting(), reason="records the launches Triton's interpreter runs (CPU)")
@pytest.mark.parametrize("arch", ARCHS)
def test_new_step_sizes_compile_nothing_new(tiny, monkeypatch, arch):
    monkeypatch.setenv(ENV_OVERRIDE, "triton")
    runner = Runner(tiny(arch), dtype=torch.float32)
    with recording() as keys:
        for prompts in PROMPT_BATCHES:
            runner.generate(prompts, SamplingParams(max_new_tokens=2, ignore_eos=True))
    assert len(keys) >= 4, sorted(keys)  # the model's Triton kernels ran
    assert size_specializations(keys) == {}
