"""gpt-oss' fused MoE, MXFP4 experts beside bf16 experts: H = I = 2880, top-4 of E = 32 (gpt-oss-20b) and
E = 128 (gpt-oss-120b), with the expert biases and the clamped SwiGLU, T = 1, 2, 4, 8, 16, 32, 64 (the
decode sizes of the 1.5x target) and 256, 4096.

Rows (``op: "fused_moe"``): ``impl`` ``atom-triton bf16`` / ``atom-triton mxfp4`` (the default tiles), and
for MXFP4 at T <= 64 ``atom-triton mxfp4 sweep`` (``triton_quant.QUANT_SWEEP``), each with its time, the
touched experts, the floor (the touched experts' weight bytes over the measured copy bandwidth, or the FLOPs
over the measured bf16 matmul rate) and ``rel_err`` to the reference on the same weights.  Summary rows
``mxfp4-vs-bf16`` per (E, T): ``speedup_default`` / ``speedup_best`` = bf16 time / MXFP4 time, ``target`` 1.5
(T <= 64), ``meets_target`` for the default tiles.  Timing: CUDA-graph replays rotating over several routings,
so the L2 cache does not keep one routing's experts between calls.
"""

from __future__ import annotations

import itertools

import torch

from atom_kernels import ExpertQuant, formats, fused_moe, topk_routing
from atom_kernels.ops.fused_moe import triton_quant
from atom_tools.kernels.timing import measure

CASES = {"gpt-oss-20b": (32, 4, 2880, 2880), "gpt-oss-120b": (128, 4, 2880, 2880)}  # (E, top_k, H, I)
TOKENS = (1, 2, 4, 8, 16, 32, 64, 256, 4096)
TARGET, TARGET_TOKENS = 1.5, 64  # MXFP4 experts >= 1.5x bf16 experts at T <= 64
ROUTINGS = 4
KW = {"activation": "swigluoai"}


def _quantized(weights: torch.Tensor, experts_at_once: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 codes and scales of stacked expert weights, a few experts at a time (quantizing gpt-oss-120b's 128
    experts at once needs ~16 GB of temporaries: more than an H100 has beside them)."""
    parts = [formats.quantize_mxfp4(weights[e:e + experts_at_once]) for e in range(0, weights.shape[0], experts_at_once)]
    return torch.cat([codes for codes, _ in parts]), torch.cat([scales for _, scales in parts])


def _experts(experts: int, hidden: int, inter: int, device: str) -> dict:
    """name -> (w13, w2, quant, weight bytes per expert), with biases, for bf16 and MXFP4 experts."""
    bf16 = torch.bfloat16
    w13 = torch.randn(experts, 2 * inter, hidden, device=device, dtype=bf16) * hidden**-0.5
    w2 = torch.randn(experts, hidden, inter, device=device, dtype=bf16) * inter**-0.5
    (p13, e13), (p2, e2) = _quantized(w13), _quantized(w2)
    mx_bytes = 3 * hidden * inter // 2 + 3 * hidden * inter // 32
    return {"bf16": (w13, w2, None, 3 * hidden * inter * 2), "mxfp4": (p13, p2, ExpertQuant("mxfp4", e13, e2), mx_bytes)}


def _case_rows(ctx: dict, case: str, experts: int, top_k: int, hidden: int, inter: int) -> list[dict]:
    device = ctx.get("device", "cuda")
    variants = _experts(experts, hidden, inter, device)
    b13 = torch.randn(experts, 2 * inter, device=device, dtype=torch.bfloat16) * 0.1
    b2 = torch.randn(experts, hidden, device=device, dtype=torch.bfloat16) * 0.1
    rows = []
    for tokens in TOKENS:
        x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
        routings = [topk_routing(torch.randn(tokens, experts, device=device), top_k) for _ in range(ROUTINGS)]
        touched = sum(torch.unique(ids).numel() for _, ids in routings) / len(routings)
        flops = 6.0 * tokens * top_k * hidden * inter
        for name, (a, b, quant, per_expert) in variants.items():
            reference = fused_moe.call_backend("reference", x, a, b, *routings[0], quant=quant, w13_bias=b13,
                                               w2_bias=b2, **KW).float()
            nbytes = touched * per_expert + 2 * tokens * hidden * 2
            floor_us = max(nbytes / ctx["copy_bytes_per_s"], flops / ctx["bf16_flops_per_s"]) * 1e6
            sweep = list(triton_quant.QUANT_SWEEP) if quant is not None and tokens <= TARGET_TOKENS and not ctx.get("quick") else []
            for cfg in [None, *sweep]:
                base = {"op": "fused_moe", "case": case, "impl": f"atom-triton {name}" + (" sweep" if cfg else ""),
                        "tokens": tokens, "experts": experts, "top_k": top_k, "hidden": hidden, "inter": inter,
                        "config": cfg.name() if cfg else "default"}
                calls = itertools.cycle(routings)

                def fn(x=x, a=a, b=b, quant=quant, cfg=cfg, calls=calls):
                    weights, ids = next(calls)
                    return fused_moe.call_backend("triton", x, a, b, weights, ids, quant=quant, config=cfg,
                                                  w13_bias=b13, w2_bias=b2, **KW)

                try:
                    out = fused_moe.call_backend("triton", x, a, b, *routings[0], quant=quant, config=cfg,
                                                 w13_bias=b13, w2_bias=b2, **KW).float()
                    err = ((out - reference).norm() / reference.norm()).item()
                    timing = measure(fn)
                except Exception as exc:  # a configuration that does not compile or fit is reported, not fatal
                    rows.append({**base, "error": f"{type(exc).__name__}: {exc}"[:300]})
                    continue
                us = timing["us"]
                rows.append({**base, "us": us, "graph": timing["graph"], "rel_err": err, "touched_experts": touched,
                             "bytes": nbytes, "flops": flops, "TBps": nbytes / (us * 1e-6) / 1e12, "floor_us": floor_us,
                             "x_floor": us / floor_us})
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def summaries(rows: list[dict]) -> list[dict]:
    """Per (case, T): bf16 experts' time over MXFP4 experts' (default tiles and best of the sweep)."""
    out = []
    timed = [r for r in rows if r.get("op") == "fused_moe" and "us" in r and r["rel_err"] < 5e-2]
    for (case, tokens), group in itertools.groupby(sorted(timed, key=lambda r: (r["case"], r["tokens"])),
                                                   key=lambda r: (r["case"], r["tokens"])):
        group = list(group)
        bf16 = [r["us"] for r in group if r["impl"] == "atom-triton bf16"]
        default = [r["us"] for r in group if r["impl"] == "atom-triton mxfp4"]
        best = [r["us"] for r in group if r["impl"].startswith("atom-triton mxfp4")]
        if not (bf16 and default):
            continue
        out.append({"summary": "mxfp4-vs-bf16", "case": case, "tokens": tokens, "bf16_us": bf16[0],
                    "mxfp4_default_us": default[0], "mxfp4_best_us": min(best),
                    "speedup_default": bf16[0] / default[0], "speedup_best": bf16[0] / min(best),
                    "target": TARGET if tokens <= TARGET_TOKENS else None,
                    "meets_target": bf16[0] / default[0] >= TARGET if tokens <= TARGET_TOKENS else None})
    return out


def run(ctx: dict) -> list[dict]:
    rows = []
    for case, shape in CASES.items():
        rows.extend(_case_rows(ctx, case, *shape))
    return rows + summaries(rows)
