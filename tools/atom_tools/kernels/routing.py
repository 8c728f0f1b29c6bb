"""MoE routing (router logits -> top-k expert ids and weights): ATOM's Triton ``topk_routing`` against the torch
reference and the peers ``--peers`` modules offer (vLLM's CUDA routing kernels from ``atom_tools.kernel_peers_vllm``).  A
peer maker takes the case name (a key of :data:`CASES`) and the correction bias (or None) and returns a function
of the fp32 logits ``[T, experts]`` giving ``(weights [T, top_k], ids [T, top_k])``.

Cases: DeepSeek-V3 / R1 (256 experts in 8 groups, the best 4 groups, top-8, sigmoid scores with the correction
bias for the choice, renormalised, x2.5), Kimi-K2 (384 experts, one group, top-8, sigmoid + bias, x2.827) and
Qwen3-30B-A3B (128 experts, softmax, top-8, renormalised); tokens 1 .. 16384 (vLLM's batch-token budget).

Columns per row: ``us`` (median of CUDA-graph replays), ``ids_match`` (the fraction of tokens whose chosen expert
set equals the reference's: near-ties of the fp32 scores can flip one), ``weight_err`` (max abs difference of the
weights over tokens whose sets match) and the floor (logits read + ids and weights written / copy bandwidth).
A peer that cannot be imported or called gives a row with ``error``.
"""

from __future__ import annotations

import torch

from atom_kernels import topk_routing
from atom_tools.kernels import peers, timing

# name: (experts, top_k, scoring, n_group, topk_group, routed_scaling_factor, correction bias)
CASES = {
    "deepseek-v3": (256, 8, "sigmoid", 8, 4, 2.5, True),
    "kimi-k2": (384, 8, "sigmoid", 1, 1, 2.827, True),
    "qwen3-30b-a3b": (128, 8, "softmax", 1, 1, 1.0, False),
}
TOKENS = (1, 16, 256, 4096, 16384)


def _kwargs(case: str, bias: torch.Tensor | None) -> dict:
    _, _, scoring, n_group, topk_group, scale, _ = CASES[case]
    return dict(scoring=scoring, renormalize=True, correction_bias=bias, n_group=n_group, topk_group=topk_group,
                routed_scaling_factor=scale)


def backend(name: str):
    """The maker of atom-kernels' ``name`` backend of ``topk_routing`` for a case."""
    def make(case: str, bias):
        top_k = CASES[case][1]
        return lambda logits: topk_routing.call_backend(name, logits, top_k, **_kwargs(case, bias))

    return make


IMPLS = {"atom-triton": backend("triton"), "torch-reference": backend("reference")}


def _agreement(got, want) -> dict:
    """Fraction of tokens with the reference's expert set, and the weights' error over those tokens."""
    (w, ids), (w_ref, ids_ref) = got, want
    ids_sorted, order = ids.long().sort(dim=-1)
    ref_sorted, ref_order = ids_ref.long().sort(dim=-1)
    same = (ids_sorted == ref_sorted).all(dim=-1)
    err = (w.float().gather(1, order) - w_ref.float().gather(1, ref_order)).abs()[same]
    return {"ids_match": same.float().mean().item(), "weight_err": err.max().item() if err.numel() else 0.0}


def run(ctx: dict) -> list[dict]:
    device = ctx.get("device", "cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    rows: list[dict] = []
    for case, (experts, top_k, *_, has_bias) in CASES.items():
        bias = torch.randn(experts, generator=gen, device=device) * 0.1 if has_bias else None
        for tokens in TOKENS if not ctx.get("quick") else (1, 256, 16384):
            logits = torch.randn(tokens, experts, generator=gen, device=device)
            want = topk_routing.call_backend("reference", logits, top_k, **_kwargs(case, bias))
            nbytes = tokens * experts * 4 + tokens * top_k * 8
            base = {"case": case, "experts": experts, "top_k": top_k, "tokens": tokens, "bytes": nbytes,
                    "floor_us": nbytes / ctx["copy_bytes_per_s"] * 1e6}
            for impl, make in {**IMPLS, **peers.for_suite(ctx, "routing")}.items():
                try:
                    fn = make(case, bias)
                    checked = _agreement(fn(logits), want)
                    timed = timing.measure(lambda fn=fn, logits=logits: fn(logits))
                except Exception as err:  # not importable, or its signature moved: a row saying so
                    rows.append({**base, "impl": impl, "error": f"{type(err).__name__}: {err}"[:300]})
                    continue
                rows.append({**base, "impl": impl, **checked, "us": timed["us"], "graph": timed["graph"],
                             "ratio_to_floor": timed["us"] / base["floor_us"]})
    return rows
