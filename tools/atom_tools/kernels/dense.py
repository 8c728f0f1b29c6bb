"""The dense-model ops (RMSNorm with residual, SiLU-and-mul, rotary) against torch eager,
torch.compile and the bandwidth floor, at decode- and prefill-sized token counts."""

from __future__ import annotations

import torch

from atom_kernels import rms_norm, rotary_embedding, silu_and_mul
from atom_tools.kernels.timing import measure

TOKENS = (1, 256, 8192)
HIDDEN, INTER = 4096, 14336  # Llama-3-8B
HEADS, KV_HEADS, HEAD = 32, 8, 128


def _row(op, impl, tokens, timing, nbytes, ctx):
    us = timing["us"]
    floor_us = nbytes / ctx["copy_bytes_per_s"] * 1e6
    return {"op": op, "impl": impl, "tokens": tokens, "us": us, "graph": timing["graph"], "bytes": nbytes,
            "TBps": nbytes / (us * 1e-6) / 1e12, "floor_us": floor_us, "x_floor": us / floor_us,
            "samples_us": timing.get("samples_us")}


def _cases(tokens: int):
    dt = torch.bfloat16
    x = torch.randn(tokens, HIDDEN, device="cuda", dtype=dt)
    res = torch.randn_like(x)
    w = torch.randn(HIDDEN, device="cuda", dtype=dt)
    gate_up = torch.randn(tokens, 2 * INTER, device="cuda", dtype=dt)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD, device="cuda", dtype=dt)
    q, k = qkv[:, : HEADS * HEAD], qkv[:, HEADS * HEAD : (HEADS + KV_HEADS) * HEAD]
    angles = torch.rand(8192, HEAD // 2, device="cuda") * 6.28  # a real cos|sin cache keeps repeated in-place rotation bounded
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    pos = torch.randint(0, 8192, (tokens,), device="cuda")
    el = 2
    return [
        ("rms_norm+residual", (x, w, 1e-6, res), 4 * tokens * HIDDEN * el, rms_norm),
        ("silu_and_mul", (gate_up,), 3 * tokens * INTER * el, silu_and_mul),
        ("rotary", (pos, q, k, cache, HEAD, True), 2 * tokens * (HEADS + KV_HEADS) * HEAD * el, rotary_embedding),
    ]


def run(ctx: dict) -> list[dict]:
    rows = []
    for tokens in TOKENS:
        for name, args, nbytes, op in _cases(tokens):
            ref = lambda a=args, o=op: o.call_backend("reference", *a)
            torch._dynamo.reset()  # a fresh compile per case (dynamo caches per code object)
            compiled = torch.compile(ref, dynamic=False)
            for impl, fn in (("atom-triton", lambda a=args, o=op: o.call_backend("triton", *a)),
                             ("torch-eager", ref), ("torch-compile", compiled)):
                try:
                    rows.append(_row(name, impl, tokens, measure(fn), nbytes, ctx))
                except Exception as err:  # a peer that fails to build must not hide the others
                    rows.append({"op": name, "impl": impl, "tokens": tokens, "error": repr(err)[:200]})
    return rows
