"""MXFP4 weight-only GEMM at decode sizes, the issue's target: at M <= 16 ATOM's MXFP4 must beat bf16
cuBLAS by >= 2.5x (it moves a quarter of the bytes).

For N = K = 8192 and gpt-oss-120b's expert gate|up shape (N = 5760, K = 2880), M = 1 and 16 (and 4
without ``--quick``): bf16 cuBLAS, the op's default Triton path (``mxfp4_mm.call_backend("triton")``),
every configuration of the small-M kernel (``planner.SWEEP``) and the warpgroup-MMA kernel's
baseline configurations (``triton.SWEEP``), each row with its time, the floor (bytes over the measured
copy bandwidth), the plan it ran (split, blocks) and its relative error against the dequantized matmul
(so a fast but wrong configuration shows).  The default is timed back to back with itself and after each of
``PREDECESSORS`` (what it adds to a decode step after ATOM's RMSNorm, which lets it start early, and after a plain
kernel, which does not: ``ops/_pdl.py``).  Then the fused MoE with MXFP4 experts at decode sizes.
Summary rows: best configuration per case and the target check for the default and for the best.
Weights rotate over enough copies that the L2 cache cannot hold them.

``python -m atom_tools.kernels mxfp4 --quick --out F.json`` is the one GPU run that picks the default.
"""

from __future__ import annotations

import itertools
import json

import torch

from atom_kernels import formats, mxfp4_mm, rms_norm
from atom_kernels.ops.mxfp4_mm import planner, preferred_layout
from atom_kernels.ops.mxfp4_mm import triton as mma_triton
from atom_tools.kernels.timing import measure

SHAPES = {"8192x8192": (8192, 8192), "moe-gpt-oss-w13": (5760, 2880)}  # (N, K)
TOKENS = (1, 4, 16)
QUICK_TOKENS = (1, 16)
TARGET = 2.5  # speedup over bf16 at M <= 16
L2_BYTES = 60 << 20
MOE_CASES = {  # name -> (experts, top_k, hidden, intermediate); gpt-oss-120b with 32 of its 128 experts
    "qwen3-30b-a3b": (128, 8, 2048, 768),  # (4 routings touch <= 16 of them: 200 MB, far above the L2 cache)
    "gpt-oss-120b-e32": (32, 4, 2880, 2880),
}


def _copies(nbytes: int) -> int:
    return max(1, -(-L2_BYTES // max(nbytes, 1)) + 1)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _timed(fn, base: dict, nbytes: float, ctx: dict) -> dict:
    try:
        timing = measure(fn)
    except Exception as err:  # a configuration that fails must not hide the others
        return {**base, "error": f"{type(err).__name__}: {err}"[:300]}
    return _with_floor({**base, "graph": timing["graph"], "samples_us": timing.get("samples_us")}, timing["us"], nbytes, ctx)


def _with_floor(row: dict, us: float, nbytes: float, ctx: dict) -> dict:
    floor_us = nbytes / ctx["copy_bytes_per_s"] * 1e6
    return {**row, "us": us, "bytes": nbytes, "TBps": nbytes / (us * 1e-6) / 1e12 if us > 0 else None,
            "floor_us": floor_us, "x_floor": us / floor_us}


# The kernel before a GEMM in a decode step, making the GEMM's input from a fresh one: ATOM's RMSNorm (launched with
# programmatic dependent launch: it lets the GEMM start streaming its weights while it runs) and a plain torch copy
# (no PDL: the GEMM starts when it ends, as after most of a host framework's kernels).
PREDECESSORS = {
    "rms_norm": lambda src, gamma: rms_norm(src, gamma, 1e-6),
    "plain copy": lambda src, gamma: src.clone(),
}


def predecessor_rows(base: dict, impl: str, gemm, x: torch.Tensor, nbytes: float, ctx: dict) -> list[dict]:
    """``gemm(x_in)`` timed after each of ``PREDECESSORS``: ``us`` is the pair's time minus the predecessor's time
    alone (both recorded), what the GEMM adds to a decode step after that kernel.  (The predecessor alone runs back to
    back with itself, which with PDL overlaps consecutive calls a little, so ``us`` leans high, for every GEMM alike:
    compare ATOM's and cuBLAS' rows after the same predecessor.)  The plain rows time each GEMM back to back with
    itself, which for ATOM's also overlaps each call with the previous one."""
    gamma = torch.ones(x.shape[1], device=x.device, dtype=x.dtype)
    rows = []
    for name, make in PREDECESSORS.items():
        row = {**base, "impl": f"{impl} after {name}"}
        try:
            alone = measure(lambda make=make: make(x, gamma))
            both = measure(lambda make=make: gemm(make(x, gamma)))
        except Exception as err:
            rows.append({**row, "error": f"{type(err).__name__}: {err}"[:300]})
            continue
        rows.append(_with_floor({**row, "graph": both["graph"], "pair_us": both["us"], "predecessor_us": alone["us"]},
                                both["us"] - alone["us"], nbytes, ctx))
    return rows


def sweep_layout(cfg: dict, x: torch.Tensor, n: int, preferred: str) -> str:
    """The byte order a small-M sweep configuration is timed in: the layers' (``preferred``) where the ring kernel
    serves that configuration, since it reads it fastest, else the checkpoint's, the only one the register-load
    kernel reads."""
    return preferred if planner.ring_serves(x, n, cfg) else "rows"


def gemm_rows(shape: str, n: int, k: int, m: int, ctx: dict, sweep: bool = True) -> list[dict]:
    """bf16 cuBLAS and ATOM's MXFP4 kernels for one (N, K, M)."""
    dev, bf16 = ctx.get("device", "cuda"), torch.bfloat16
    x = torch.randn(m, k, device=dev, dtype=bf16)
    w = torch.randn(n, k, device=dev, dtype=bf16) * 0.02
    base = {"op": "mxfp4", "shape": shape, "N": n, "K": k, "M": m}
    rows = []

    copies = [w] + [w.clone() for _ in range(_copies(w.numel() * 2) - 1)]
    cycle = itertools.cycle(copies)
    bf16_bytes = w.numel() * 2 + m * k * 2 + m * n * 2
    rows.append(_timed(lambda: x @ next(cycle).t(), {**base, "op": "gemm", "impl": "bf16-cublas"}, bf16_bytes, ctx))
    rows.extend(predecessor_rows({**base, "op": "gemm"}, "bf16-cublas", lambda xin: xin @ next(cycle).t(), x,
                                 bf16_bytes, ctx))
    del copies, cycle

    wp, ws = formats.quantize_mxfp4(w)
    ref = x.float() @ formats.dequantize_mxfp4(wp, ws).t()
    pairs = [(wp, ws)] + [(wp.clone(), ws.clone()) for _ in range(_copies(wp.numel() + ws.numel()) - 1)]
    nbytes = wp.numel() + ws.numel() + m * k * 2 + m * n * 2
    # The default row runs the op as a layer does by default: weights in the byte order the kernels prefer on this
    # device ("lanes" on sm_90 where K % 256 == 0); where that is not the checkpoint's, a row for the checkpoint's.
    layout = preferred_layout(n, k, x.device)
    candidates = [("atom-triton", None, layout)] + ([("atom-triton rows-layout", None, "rows")] if layout != "rows" else [])
    if sweep:  # {} is the default; each configuration in the byte order a layer would give its kernel
        candidates += [("small-m sweep", cfg, sweep_layout(cfg, x, n, layout)) for cfg in planner.SWEEP if cfg]
        candidates += [("mma sweep", cfg, "rows") for cfg in mma_triton.SWEEP]
    for impl, cfg, row_layout in candidates:
        row = {**base, "impl": impl, "config": json.dumps(cfg) if cfg is not None else "default", "layout": row_layout}
        row_pairs = [(formats.mxfp4_rows_to_lanes(a), b) for a, b in pairs] if row_layout == "lanes" else pairs
        if cfg is None or cfg.get("kernel", "small_m") == "small_m":
            row["plan"] = json.dumps({key: v for key, v in planner.plan(m, n, k, x.device, cfg, row_layout).items()
                                      if key in ("mma", "block_n", "block_k", "split", "reduce", "num_warps",
                                                 "num_stages", "loads", "stages")})
        try:
            row["rel_err"] = _rel_err(mxfp4_mm.call_backend("triton", x, *row_pairs[0], None, config=cfg,
                                                            layout=row_layout, static_weights=True), ref)
        except Exception as err:
            rows.append({**row, "error": f"{type(err).__name__}: {err}"[:300]})
            continue
        cycle = itertools.cycle(row_pairs)

        def fn(cfg=cfg, cycle=cycle, layout=row_layout):
            b, s = next(cycle)
            return mxfp4_mm.call_backend("triton", x, b, s, None, config=cfg, layout=layout, static_weights=True)

        rows.append(_timed(fn, row, nbytes, ctx))
        if impl == "atom-triton":
            def gemm(xin, cycle=cycle, layout=row_layout):
                b, s = next(cycle)
                return mxfp4_mm.call_backend("triton", xin, b, s, None, layout=layout, static_weights=True)

            rows.extend(predecessor_rows({**row, "config": "default"}, impl, gemm, x, nbytes, ctx))
    return rows


def moe_rows(ctx: dict, tokens_list=(1, 16), routings: int = 4) -> list[dict]:
    """The fused MoE with MXFP4 experts (default configuration) at decode sizes."""
    from atom_kernels import ExpertQuant, fused_moe, topk_routing

    device, bf16 = ctx.get("device", "cuda"), torch.bfloat16
    rows = []
    for name, (experts, top_k, hidden, inter) in MOE_CASES.items():
        w13 = torch.randn(experts, 2 * inter, hidden, device=device, dtype=bf16) * hidden**-0.5
        w2 = torch.randn(experts, hidden, inter, device=device, dtype=bf16) * inter**-0.5
        p13, e13 = formats.quantize_mxfp4(w13)
        p2, e2 = formats.quantize_mxfp4(w2)
        del w13, w2
        quant = ExpertQuant("mxfp4", e13, e2)
        per_expert = 3 * hidden * inter // 2 + 3 * hidden * inter // 32
        for tokens in tokens_list:
            x = torch.randn(tokens, hidden, device=device, dtype=bf16)
            routes = [topk_routing(torch.randn(tokens, experts, device=device), top_k) for _ in range(routings)]
            touched = sum(torch.unique(ids).numel() for _, ids in routes) / routings
            calls = itertools.cycle(routes)

            def fn(x=x, calls=calls, w13=p13, w2=p2, quant=quant):
                weights, ids = next(calls)
                return fused_moe.call_backend("triton", x, w13, w2, weights, ids, quant=quant)

            base = {"op": "fused_moe", "impl": "atom-triton mxfp4", "case": name, "tokens": tokens,
                    "experts": experts, "top_k": top_k, "hidden": hidden, "inter": inter, "touched_experts": touched}
            rows.append(_timed(fn, base, touched * per_expert + 2 * tokens * hidden * 2, ctx))
    return rows


def summaries(rows: list[dict]) -> list[dict]:
    """Best configuration per (shape, M) and the target check (default and best against bf16)."""
    out = []
    timed = [r for r in rows if "us" in r and r.get("op") in ("mxfp4", "gemm")]
    for (shape, m), group in itertools.groupby(sorted(timed, key=lambda r: (r["shape"], r["M"])),
                                               key=lambda r: (r["shape"], r["M"])):
        group = list(group)
        bf16 = [r["us"] for r in group if r["impl"] == "bf16-cublas"]  # back to back
        mx = [r for r in group if r["op"] == "mxfp4" and r.get("rel_err", 1.0) < 2e-2 and "pair_us" not in r]
        after = {r["impl"]: r["us"] for r in group if "pair_us" in r}
        if not (bf16 and mx):
            continue
        best = min(mx, key=lambda r: r["us"])
        default = next((r for r in mx if r["impl"] == "atom-triton"), None)
        out.append({"summary": "mxfp4-vs-bf16", "shape": shape, "M": m, "bf16_us": bf16[0],
                    "default_us": default["us"] if default else None, "best_us": best["us"],
                    "best_impl": best["impl"], "best_config": best["config"], "best_plan": best.get("plan"),
                    "speedup_default": bf16[0] / default["us"] if default else None,
                    "speedup_best": bf16[0] / best["us"], "target": TARGET,
                    "meets_target_default": bool(default) and bf16[0] / default["us"] >= TARGET,
                    "meets_target_best": bf16[0] / best["us"] >= TARGET, "best_x_floor": best["x_floor"],
                    **{f"{impl.replace('-', '_').replace(' ', '_')}_us": us for impl, us in after.items()}})
    return out


def run(ctx: dict) -> list[dict]:
    rows = []
    tokens = QUICK_TOKENS if ctx.get("quick") else TOKENS
    for shape, (n, k) in SHAPES.items():
        for m in tokens:
            rows.extend(gemm_rows(shape, n, k, m, ctx))
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    rows.extend(moe_rows(ctx))
    return rows + summaries(rows)
