"""Comparison of an ATOM model run by the native runner with its transformers reference."""

from __future__ import annotations

import copy

import torch

from atom_core.runtime.runner import Runner
from atom_core.runtime.sampler import SamplingParams

# Prompts of different lengths in one batch; the longest passes Mistral's tiny sliding window (32).
PROMPTS = [[5, 17, 99, 3, 200, 41, 7], [11, 300], list(range(40, 90))]

# fp32 on CPU: ATOM and transformers differ only in summation order (measured max |Δlogit| ≈ 6e-7).
FP32_LOGIT_ATOL = 1e-4
# bf16 on GPU, against the fp32 reference: the bound is the larger of this floor and twice transformers' own
# bf16 deviation from its fp32 run on the same checkpoint (ATOM in bf16 must be as close to the fp32
# reference as transformers in bf16 is, within a factor of two).
BF16_LOGIT_ATOL = 0.1


@torch.inference_mode()
def reference_logits(hf, prompts, device="cpu"):
    return [hf(torch.tensor([p], device=device)).logits[0].float().cpu() for p in prompts]


@torch.inference_mode()
def reference_greedy(hf, prompt, max_new_tokens, device="cpu"):
    """HF greedy continuation and the reference logits at every generated position."""
    ids = torch.tensor([prompt], device=device)
    out = hf.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    tokens = out[0, len(prompt):].tolist()
    logits = hf(out[:, :-1]).logits[0, len(prompt) - 1 :].float().cpu()
    return tokens, logits


def check_model(model_dir: str, hf, *, device="cpu", dtype=torch.float32, atol=FP32_LOGIT_ATOL, max_new_tokens=8):
    """Prefill logits, greedy tokens and decode log-probabilities all match the reference."""
    runner = Runner(model_dir, device=device, dtype=dtype)
    atom_logits = runner.prompt_logits(PROMPTS)
    want_logits = reference_logits(hf, PROMPTS)
    hf_own = ""
    if dtype != torch.float32:
        hf_low = copy.deepcopy(hf).to(device=device, dtype=dtype)
        hf_err = max((low - want).abs().max().item() for low, want in zip(reference_logits(hf_low, PROMPTS, device), want_logits))
        atol = max(atol, 2 * hf_err)
        hf_own = f" (transformers' own {dtype} error {hf_err:.2e})"
        del hf_low
    for prompt, got, want in zip(PROMPTS, atom_logits, want_logits):
        err = (got.cpu() - want).abs().max().item()
        assert err <= atol, f"prompt of {len(prompt)} tokens: max |Δlogit| {err:.2e} > {atol:.2e}{hf_own}"
    outputs = runner.generate(PROMPTS, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outputs):
        tokens, ref_logits = reference_greedy(hf, prompt, max_new_tokens)
        ref_logprobs = torch.log_softmax(ref_logits, dim=-1)
        for step, (mine, theirs) in enumerate(zip(out.token_ids, tokens)):
            if mine != theirs:
                # allowed only where the reference itself cannot tell the two apart at this precision
                gap = (ref_logits[step, theirs] - ref_logits[step, mine]).item()
                assert gap <= 2 * atol, f"step {step}: token {mine} != {theirs} (reference gap {gap:.2e})"
                break  # the continuations diverge from here on
            lp = ref_logprobs[step, mine].item()
            assert abs(out.logprobs[step] - lp) <= atol, f"step {step}: logprob {out.logprobs[step]} vs {lp}"
    return runner


def speculative_generate(model_dir: str, k: int, prompts, max_new_tokens: int = 12, draft: str | None = None):
    """Greedy outputs of the native runner drafting ``k`` tokens per step (0: no drafts) from the checkpoint's own
    draft layers or the ``draft`` checkpoint, and the decoder's acceptance stats (None without drafts)."""
    runner = Runner(model_dir, device="cpu", dtype=torch.float32, speculative_tokens=k, draft_model=draft)
    outputs = runner.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))
    return outputs, (runner.speculative.stats if runner.speculative else None)


def assert_same_outputs(plain, spec, logprob_atol: float) -> None:
    """Decoding with drafts gave decoding without them: the same tokens, and log-probabilities within the bound."""
    for p, s in zip(plain, spec):
        assert s.token_ids == p.token_ids
        assert s.finish_reason == p.finish_reason == "length"
        assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(p.logprobs), atol=logprob_atol)


def assert_drafts_keep_greedy(model_dir: str, k: int, prompts, logprob_atol: float, draft: str | None = None):
    """Greedy decoding drafting ``k`` tokens per step gives the outputs of decoding without drafts; returns the
    drafted run's acceptance stats (printed too)."""
    plain, _ = speculative_generate(model_dir, 0, prompts)
    spec, stats = speculative_generate(model_dir, k, prompts, draft=draft)
    assert_same_outputs(plain, spec, logprob_atol)
    print(f"k={k}: acceptance {stats.acceptance_rate:.3f} ({stats.accepted}/{stats.proposed})")
    return stats


def assert_draft_logits_match(runner: Runner, reference, prompts, atol: float, next_token: int = 123) -> None:
    """The runner's draft logits after each prompt followed by ``next_token`` equal ``reference(prompt, next_token)``
    within ``atol``."""
    for prompt in prompts:
        got = runner.speculative.draft_logits(prompt, next_token)
        want = reference(prompt, next_token)
        assert got.shape == want.shape
        err = (got - want).abs().max().item()
        assert err <= atol, f"prompt of {len(prompt)}: max |draft logit difference| {err:.2e}"
