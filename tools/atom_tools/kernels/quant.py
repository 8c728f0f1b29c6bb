"""Quantized GEMMs side by side: bf16 cuBLAS, cuBLASLt's row-wise FP8 ``torch._scaled_mm``, and ATOM's
Triton kernels (per-row x per-column FP8, block FP8, MXFP4 weight-only), at M = 1, 16, 256, 4096 tokens
for N = K = 8192 and a MoE expert (gpt-oss-120b's gate|up, N = 5760, K = 2880), with the floor, the
anchors' peer numbers, a sweep of kernel configurations at decode sizes, and the MXFP4 target
(>= 2.5x bf16 at M <= 16).  Then the fused MoE with bf16, FP8-block and MXFP4 experts at the ``moe``
suite's Qwen3-30B-A3B shape (E 128, top-8, H 2048, I 768).

Every GEMM row times the GEMM alone (inputs already quantized, as a layer's weights are); rows named
``... +quant`` add the activation quantization the layer runs first.  Weights are rotated over enough
copies that the L2 cache (50 MB on H200) cannot hold them.  Floors: bytes (weights + activations +
output) over the measured copy bandwidth, or FLOPs over the measured bf16 matmul rate (twice that for
FP8 operands), whichever is larger.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import torch

from atom_kernels import formats, fp8_block_mm, fp8_scaled_mm, mxfp4_mm, quant_fp8
from atom_kernels.ops import fp8_gemm
from atom_kernels.ops.mxfp4_mm import preferred_layout
from atom_kernels.ops.mxfp4_mm import triton as mxfp4_triton
from atom_tools.kernels.timing import measure

TOKENS = (1, 16, 256, 4096)
SHAPES = {"8192x8192": (8192, 8192), "moe-gpt-oss-w13": (5760, 2880)}  # (N, K)
L2_BYTES = 60 << 20  # rotate weight copies until they exceed this
MXFP4_TARGET = 2.5  # speedup over bf16 at M <= 16
QUANT_CASES = ((4096, 8192, None), (4096, 8192, 128), (16, 8192, None))  # (M, K, group) of quant_fp8 rows
# Peer numbers measured on an H200: the folder ATOM_ANCHORS_DIR names, else the checkout's shared/anchors.
_ANCHOR_DIRS = tuple(Path(d) for d in (os.environ.get("ATOM_ANCHORS_DIR"),
                                       Path(__file__).resolve().parents[3] / "shared" / "anchors") if d)


def _anchors() -> dict:
    """Peer numbers measured on an H200 (shared/anchors), when the files are present."""
    peers = {}
    for folder in _ANCHOR_DIRS:
        for name in ("h200-peers-2026-11-30.json", "h200-moe-mxfp4-2026-11-30.json"):
            path = folder / name
            if path.is_file() and not any(k in peers for k in json.loads(path.read_text())):
                peers.update(json.loads(path.read_text()))
    return peers


def _peer_fields(peers: dict, shape: str, m: int) -> dict:
    """The anchor numbers that describe this case (N = K = 8192 only)."""
    if shape != "8192x8192":
        return {}
    keys = {  # anchor key -> (row field, factor to µs)
        f"bf16_M{m}_ms": ("anchor_bf16_cublas_us", 1000.0), f"bf16_mm_M{m}_us": ("anchor_bf16_mm_us", 1.0),
        f"fp8_M{m}_ms": ("anchor_fp8_scaled_mm_us", 1000.0),
        f"mxfp4_naive_deq_mm_M{m}_us": ("anchor_mxfp4_naive_us", 1.0), f"mxfp4_floor_M{m}_us": ("anchor_mxfp4_floor_us", 1.0),
    }
    return {field: peers[key] * factor for key, (field, factor) in keys.items() if key in peers}


def _copies(nbytes: int) -> int:
    return max(1, -(-L2_BYTES // max(nbytes, 1)) + 1)


def _rotating(fn, arg_sets):
    """A closure that calls ``fn`` on the next argument set each time (CUDA-graph capture records the
    rotation, so replays stream every copy)."""
    cycle = itertools.cycle(arg_sets)
    return lambda: fn(*next(cycle))


class _Case:
    def __init__(self, shape: str, n: int, k: int, m: int, ctx: dict, peers: dict):
        self.shape, self.n, self.k, self.m, self.ctx = shape, n, k, m, ctx
        self.peers = _peer_fields(peers, shape, m)
        self.flops = 2.0 * m * n * k

    def row(self, op: str, impl: str, fn, weight_bytes: int, act_bytes: float, fp8_math: bool, extra=None) -> dict:
        nbytes = weight_bytes + act_bytes + self.m * self.n * 2
        base = {"op": op, "impl": impl, "shape": self.shape, "N": self.n, "K": self.k, "M": self.m, **(extra or {})}
        try:
            timing = measure(fn)
        except Exception as err:  # a config or peer that fails must not hide the others
            return {**base, "error": f"{type(err).__name__}: {err}"[:300]}
        us = timing["us"]
        rate = self.ctx["bf16_flops_per_s"] * (2.0 if fp8_math else 1.0)
        floor_us = max(nbytes / self.ctx["copy_bytes_per_s"], self.flops / rate) * 1e6
        return {**base, "us": us, "graph": timing["graph"], "bytes": nbytes, "flops": self.flops,
                "TBps": nbytes / (us * 1e-6) / 1e12, "TFLOPs": self.flops / (us * 1e-6) / 1e12,
                "floor_us": floor_us, "x_floor": us / floor_us, "samples_us": timing.get("samples_us"), **self.peers}


def _gemm_rows(case: _Case, sweep: bool) -> list[dict]:
    m, n, k = case.m, case.n, case.k
    dev, bf16 = case.ctx.get("device", "cuda"), torch.bfloat16
    x = torch.randn(m, k, device=dev, dtype=bf16)
    w = torch.randn(n, k, device=dev, dtype=bf16) * 0.02
    rows = []

    # bf16 cuBLAS
    ws = [w] + [w.clone() for _ in range(_copies(w.numel() * 2) - 1)]
    rows.append(case.row("gemm", "bf16-cublas", _rotating(lambda a, b: a @ b.t(), [(x, c) for c in ws]),
                         w.numel() * 2, m * k * 2, False))
    del ws

    # FP8 per-token x per-channel: cuBLASLt, Triton, and the layer's path (quant + GEMM)
    xq, xs = quant_fp8(x)
    wq, wsc = formats.quantize_fp8_per_row(w)
    copies = [(wq, wsc)] + [(wq.clone(), wsc.clone()) for _ in range(_copies(wq.numel()) - 1)]
    fp8_bytes, fp8_act = wq.numel() + n * 4, m * k + m * 4
    for impl in ("torch", "triton"):
        rows.append(case.row("fp8-rowwise", f"{'cublaslt-scaled_mm' if impl == 'torch' else 'atom-triton'}",
                             _rotating(lambda b, bs, i=impl: fp8_scaled_mm.call_backend(i, xq, xs, b, bs, None, bf16), copies),
                             fp8_bytes, fp8_act, True))
    rows.append(case.row("fp8-rowwise", "atom (dispatch) +quant",
                         _rotating(lambda b, bs: fp8_scaled_mm(*quant_fp8(x), b, bs, None, bf16), copies),
                         fp8_bytes, m * k * 2, True))
    if sweep:
        for cfg in fp8_gemm.SWEEP:
            rows.append(case.row("fp8-rowwise", "atom-triton sweep", _rotating(
                lambda b, bs, c=cfg: fp8_scaled_mm.call_backend("triton", xq, xs, b, bs, None, bf16, config=c), copies),
                fp8_bytes, fp8_act, True, {"config": json.dumps(cfg)}))
    del copies

    # FP8 block (128x128 weights, 1x128 activations)
    xbq, xbs = quant_fp8(x, 128)
    wbq, wbs = formats.quantize_fp8_blocks(w)
    copies = [(wbq, wbs)] + [(wbq.clone(), wbs.clone()) for _ in range(_copies(wbq.numel()) - 1)]
    blk_bytes, blk_act = wbq.numel() + wbs.numel() * 4, m * k + xbs.numel() * 4
    rows.append(case.row("fp8-block", "atom-triton", _rotating(
        lambda b, bs: fp8_block_mm.call_backend("triton", xbq, xbs, b, bs, (128, 128), None, bf16), copies),
        blk_bytes, blk_act, True))
    rows.append(case.row("fp8-block", "atom +quant", _rotating(
        lambda b, bs: fp8_block_mm(*quant_fp8(x, 128), b, bs, (128, 128), None, bf16), copies),
        blk_bytes, m * k * 2, True))
    large = fp8_gemm.shape_class(m) == "large"
    block_sweep = fp8_gemm.SWEEP if sweep else fp8_gemm.BLOCKWISE_LARGE_SWEEP if large else []
    for cfg in block_sweep:
        rows.append(case.row("fp8-block", "atom-triton sweep", _rotating(
            lambda b, bs, c=cfg: fp8_block_mm.call_backend("triton", xbq, xbs, b, bs, (128, 128), None, bf16, config=c),
            copies), blk_bytes, blk_act, True, {"config": json.dumps(cfg)}))
    del copies

    # MXFP4 weight-only
    wp, wsx = formats.quantize_mxfp4(w)
    copies = [(wp, wsx)] + [(wp.clone(), wsx.clone()) for _ in range(_copies(wp.numel() + wsx.numel()) - 1)]
    mx_bytes = wp.numel() + wsx.numel()
    layout = preferred_layout(n, k, x.device)  # the byte order MXFP4 layers keep on this device
    layouts = {"atom-triton": layout, **({"atom-triton rows-layout": "rows"} if layout != "rows" else {})}
    for impl, row_layout in layouts.items():
        pairs = [(formats.mxfp4_rows_to_lanes(b), bs) for b, bs in copies] if row_layout == "lanes" else copies
        rows.append(case.row("mxfp4", impl, _rotating(
            lambda b, bs, lay=row_layout: mxfp4_mm.call_backend("triton", x, b, bs, layout=lay, static_weights=True),
            pairs), mx_bytes,
            m * k * 2, False, {"layout": row_layout}))
        del pairs
    rows.append(case.row("mxfp4", "torch dequant+matmul", lambda: x @ formats.dequantize_mxfp4(wp, wsx, bf16).t(),
                         mx_bytes, m * k * 2, False))
    if sweep:
        for cfg in mxfp4_triton.SWEEP:
            rows.append(case.row("mxfp4", "atom-triton sweep", _rotating(
                lambda b, bs, c=cfg: mxfp4_mm.call_backend("triton", x, b, bs, None, config=c), copies),
                mx_bytes, m * k * 2, False, {"config": json.dumps(cfg)}))
    return rows


def _quant_rows(ctx: dict) -> list[dict]:
    rows = []
    for m, k, group in QUANT_CASES:
        x = torch.randn(m, k, device=ctx.get("device", "cuda"), dtype=torch.bfloat16)
        nbytes = m * k * 3 + m * 4 * (1 if group is None else k // group)
        timing = measure(lambda x=x, g=group: quant_fp8.call_backend("triton", x, g))
        floor_us = nbytes / ctx["copy_bytes_per_s"] * 1e6
        rows.append({"op": "quant_fp8", "impl": "atom-triton", "M": m, "K": k, "group": group, "us": timing["us"],
                     "graph": timing["graph"], "bytes": nbytes, "TBps": nbytes / (timing["us"] * 1e-6) / 1e12,
                     "floor_us": floor_us, "x_floor": timing["us"] / floor_us})
    return rows


MOE_SHAPE = (128, 8, 2048, 768)  # experts, top-k, hidden, intermediate (Qwen3-30B-A3B)
MOE_ROUTINGS = 4  # routings rotated over, so the L2 cache does not keep one routing's experts


def _moe_rows(ctx: dict) -> list[dict]:
    from atom_kernels import ExpertQuant, fused_moe, topk_routing
    from atom_kernels.ops.fused_moe import triton_quant

    experts, top_k, hidden, inter = MOE_SHAPE
    device, bf16 = ctx.get("device", "cuda"), torch.bfloat16
    w13 = torch.randn(experts, 2 * inter, hidden, device=device, dtype=bf16) * hidden**-0.5
    w2 = torch.randn(experts, hidden, inter, device=device, dtype=bf16) * inter**-0.5
    fp8_13 = [formats.quantize_fp8_blocks(w.float()) for w in w13.reshape(-1, inter, hidden)]
    fp8_2 = [formats.quantize_fp8_blocks(w.float()) for w in w2]
    q13 = torch.stack([q for q, _ in fp8_13]).reshape(experts, 2 * inter, hidden)
    s13 = torch.stack([s for _, s in fp8_13]).reshape(experts, 2 * inter // 128, -1)
    q2, s2 = torch.stack([q for q, _ in fp8_2]), torch.stack([s for _, s in fp8_2])
    p13, e13 = formats.quantize_mxfp4(w13)
    p2, e2 = formats.quantize_mxfp4(w2)
    variants = {  # name -> (w13, w2, quant, bytes per expert)
        "bf16": (w13, w2, None, 3 * hidden * inter * 2),
        "fp8-block": (q13, q2, ExpertQuant("fp8-block", s13, s2, (128, 128), torch.float8_e4m3fn),
                      3 * hidden * inter + (s13[0].numel() + s2[0].numel()) * 4),
        "mxfp4": (p13, p2, ExpertQuant("mxfp4", e13, e2), 3 * hidden * inter // 2 + 3 * hidden * inter // 32),
    }
    rows = []
    for tokens in TOKENS:
        x = torch.randn(tokens, hidden, device=device, dtype=bf16)
        routings = [topk_routing(torch.randn(tokens, experts, device=device), top_k) for _ in range(MOE_ROUTINGS)]
        touched = sum(torch.unique(ids).numel() for _, ids in routings) / MOE_ROUTINGS
        flops = 6.0 * tokens * top_k * hidden * inter
        configs = [None] + (list(triton_quant.QUANT_SWEEP) if tokens <= 16 and not ctx.get("quick") else [])
        for name, (a, b, quant, per_expert) in variants.items():
            nbytes = touched * per_expert + 2 * tokens * hidden * 2
            rate = ctx["bf16_flops_per_s"] * (2.0 if name == "fp8-block" else 1.0)
            floor_us = max(nbytes / ctx["copy_bytes_per_s"], flops / rate) * 1e6
            for cfg in configs if quant is not None else [None]:
                base = {"op": "fused_moe", "impl": f"atom-triton {name}", "tokens": tokens, "experts": experts,
                        "top_k": top_k, "hidden": hidden, "inter": inter, "config": cfg.name() if cfg else "default"}
                calls = itertools.cycle([(w, i) for w, i in routings])

                def fn(x=x, a=a, b=b, quant=quant, cfg=cfg, calls=calls):
                    weights, ids = next(calls)
                    return fused_moe.call_backend("triton", x, a, b, weights, ids, quant=quant, config=cfg)

                try:
                    timing = measure(fn)
                except Exception as err:
                    rows.append({**base, "error": f"{type(err).__name__}: {err}"[:300]})
                    continue
                us = timing["us"]
                rows.append({**base, "us": us, "graph": timing["graph"], "touched_experts": touched, "bytes": nbytes,
                             "flops": flops, "TBps": nbytes / (us * 1e-6) / 1e12, "floor_us": floor_us,
                             "x_floor": us / floor_us})
    return rows


def _summaries(rows: list[dict]) -> list[dict]:
    """Best configuration per (op, shape, M), and the MXFP4 target check at M <= 16."""
    out = []
    timed = [r for r in rows if "us" in r and "N" in r]
    for (op, shape, m), group in itertools.groupby(sorted(timed, key=lambda r: (r["op"], r["shape"], r["M"])),
                                                   key=lambda r: (r["op"], r["shape"], r["M"])):
        group = list(group)
        best = min(group, key=lambda r: r["us"])
        out.append({"summary": "best", "op": op, "shape": shape, "M": m, "impl": best["impl"],
                    "config": best.get("config"), "us": best["us"], "x_floor": best["x_floor"]})
    moe = [r for r in rows if r.get("op") == "fused_moe" and "us" in r]
    for (impl, tokens), group in itertools.groupby(sorted(moe, key=lambda r: (r["impl"], r["tokens"])),
                                                   key=lambda r: (r["impl"], r["tokens"])):
        best = min(group, key=lambda r: r["us"])
        out.append({"summary": "best", "op": "fused_moe", "impl": impl, "tokens": tokens, "config": best["config"],
                    "us": best["us"], "x_floor": best["x_floor"]})
    for shape in SHAPES:
        for m in (t for t in TOKENS if t <= 16):
            bf16 = [r["us"] for r in timed if r["op"] == "gemm" and r["shape"] == shape and r["M"] == m]
            mx = [r["us"] for r in timed if r["op"] == "mxfp4" and r["impl"].startswith("atom-triton")
                  and r["shape"] == shape and r["M"] == m]
            default = [r["us"] for r in timed if r["op"] == "mxfp4" and r["impl"] == "atom-triton"
                       and r["shape"] == shape and r["M"] == m]
            if bf16 and mx:
                out.append({"summary": "mxfp4-vs-bf16", "shape": shape, "M": m, "bf16_us": bf16[0],
                            "mxfp4_default_us": default[0] if default else None, "mxfp4_best_us": min(mx),
                            "speedup_default": bf16[0] / default[0] if default else None,
                            "speedup_best": bf16[0] / min(mx), "target": MXFP4_TARGET,
                            "meets_target": bf16[0] / (default[0] if default else min(mx)) >= MXFP4_TARGET})
    return out


def run(ctx: dict) -> list[dict]:
    peers = _anchors()
    quick = ctx.get("quick", False)
    rows = []
    for shape, (n, k) in SHAPES.items():
        for m in TOKENS if not quick else (1, 16, 4096):
            case = _Case(shape, n, k, m, ctx, peers)
            rows.extend(_gemm_rows(case, sweep=m <= 16 and (shape == "8192x8192" or not quick)))
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    rows.extend(_quant_rows(ctx))
    rows.extend(_moe_rows(ctx))
    return rows + _summaries(rows)
