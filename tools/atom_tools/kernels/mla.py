"""MLA decode (DeepSeek-V3's absorbed attention over the paged latent cache): ATOM's Triton kernel against the
torch reference, the peers ``--peers`` modules offer (vLLM's two Hopper decode kernels, its Triton MLA and FlashMLA,
from ``atom_tools.kernel_peers_vllm``) and the floor.  A peer maker takes the :class:`Inputs` and returns a function with
``mla_decode``'s arguments ``(q, cache, block_table, seq_lens, scale, latent)`` giving ``[B, heads, latent]``.

Cases: 128 heads (one rank) and 16 (TP8), kv_lora_rank 512 + rope 64, bf16, batch 1/16/64/256, every sequence at
context 1k/8k/32k, page size 64 (vLLM's MLA block size), each sequence's blocks scattered over the cache.  Times
are medians of CUDA-graph replays cycling over enough cache copies to defeat the L2 cache.

Floor (bytes / measured copy bandwidth): every cached latent row read once, q read and the output written once.
The reference gathers the whole context to fp32 (four times the cache's bytes and the scores), so it is timed
only up to REFERENCE_MAX_TOKENS context tokens per batch.
"""

from __future__ import annotations

import itertools
import math

import torch

from atom_kernels.ops.mla_decode import reference as mla_reference
from atom_kernels.ops.mla_decode import triton as mla_triton
from atom_tools.kernels import peers, timing

HEADS = (128, 16)
BATCHES = (1, 16, 64, 256)
CONTEXTS = (1024, 8192, 32768)
LATENT, ROPE, PAGE = 512, 64, 64
L2_DEFEAT_BYTES = 256 << 20
REFERENCE_MAX_TOKENS = 1 << 20
DTYPE = torch.bfloat16


class Inputs:
    """``copies`` caches (with their block tables) for one (batch, context), cycled per call, and one query."""

    def __init__(self, batch: int, heads: int, context: int, device, copies: int, seed: int = 0):
        gen = torch.Generator(device=device).manual_seed(seed)
        blocks_per_seq = math.ceil(context / PAGE)
        num_blocks = batch * blocks_per_seq
        dim = LATENT + ROPE
        self.q = torch.randn(batch, heads, dim, device=device, generator=gen).to(DTYPE)
        self.caches = [torch.randn(num_blocks, PAGE, dim, device=device, generator=gen).to(DTYPE)
                       for _ in range(copies)]
        self.tables = [torch.randperm(num_blocks, device=device, generator=gen).view(batch, blocks_per_seq).int()
                       for _ in range(copies)]
        self.seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        self.scale = (128 + ROPE) ** -0.5  # DeepSeek-V3's qk_nope_head_dim + qk_rope_head_dim
        self.index = 0

    def next(self) -> tuple:
        i = self.index
        self.index = (i + 1) % len(self.caches)
        return self.q, self.caches[i], self.tables[i], self.seq_lens, self.scale, LATENT


def run(ctx: dict) -> list[dict]:
    rows: list[dict] = []
    for heads, batch, context in itertools.product(HEADS, BATCHES, CONTEXTS):
        device = ctx.get("device", "cuda")
        rows.extend(bench_case(heads, batch, context, ctx, device=device))
        if device == "cuda":
            torch.cuda.empty_cache()  # the next case's caches may need what this one's held (up to ~10 GB)
    return rows


def bench_case(heads: int, batch: int, context: int, ctx: dict, device: str = "cuda") -> list[dict]:
    dim = LATENT + ROPE
    elt = torch.finfo(DTYPE).bits // 8
    cache_bytes = batch * context * dim * elt
    op_bytes = cache_bytes + batch * heads * (dim + LATENT) * elt
    copies = max(1, min(8, math.ceil(L2_DEFEAT_BYTES / cache_bytes)))
    inputs = Inputs(batch, heads, context, device, copies)
    head_groups = math.ceil(heads / mla_triton.DEFAULT.block_h)
    base = dict(case=f"h{heads}-b{batch}-ctx{context}", heads=heads, batch=batch, context=context, bytes=op_bytes,
                splits=mla_triton.num_splits(batch, head_groups, context, inputs.q.device),
                floor_us=op_bytes / ctx["copy_bytes_per_s"] * 1e6)
    rows: list[dict] = []
    args = inputs.next()
    got = mla_triton.mla_decode(*args)
    impls = [("atom-triton", mla_triton.mla_decode)]
    if batch * context <= REFERENCE_MAX_TOKENS:
        want = mla_reference.mla_decode(*args)
        base["rel_err"] = ((got.float() - want.float()).norm() / want.float().norm()).item()
        impls.append(("torch-reference", mla_reference.mla_decode))
    else:
        rows.append(dict(base, impl="torch-reference", skipped=f"batch x context > {REFERENCE_MAX_TOKENS}"))
    for impl, make in peers.for_suite(ctx, "mla").items():
        try:
            fn = make(inputs)
            out = fn(*args)
            peer_err = ((out.float() - got.float()).norm() / got.float().norm()).item()
        except Exception as err:  # not importable, or its signature moved: a row saying so, not a crash
            rows.append(dict(base, impl=impl, error=f"{type(err).__name__}: {err}"[:300]))
            continue
        base[f"{impl}_rel_err_to_atom"] = peer_err
        impls.append((impl, fn))
    for impl, fn in impls:
        try:
            timed = timing.measure(lambda fn=fn: fn(*inputs.next()), calls_per_graph=max(copies, 10))
        except Exception as err:  # one failing implementation must not lose the others' numbers
            rows.append(dict(base, impl=impl, error=f"{type(err).__name__}: {err}"[:300]))
            continue
        us = timed["us"]
        rows.append(dict(base, impl=impl, us=us, graph=timed["graph"], TBps=op_bytes / (us * 1e-6) / 1e12,
                         ratio_to_floor=us / base["floor_us"]))
    return rows
