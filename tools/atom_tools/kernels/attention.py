"""Paged attention (Qwen3-8B heads: 32 query heads, 8 KV heads, head dim 128, bf16, block size 16): ATOM's Triton
``paged_attention`` side by side with torch SDPA over dense K/V and the peers ``--peers`` modules offer (vLLM's
FlashAttention-3 and Triton ``unified_attention`` from ``atom_tools.kernel_peers_vllm``), one row per case.  A peer maker
takes the :class:`Case` and returns a callable giving ``[T, H, D]`` (one call per timed step, cycling the cache
copies with ``case.next()``), or a string saying why it is unavailable.

Decode: one query per sequence, batch 1/16/64/256 x context 1k/4k/16k/32k (cases whose K/V exceed CACHE_LIMIT are
skipped).  Prefill (varlen, causal): 4 sequences x 2048 new tokens after 0 and 2048 cached tokens, and one 8192-token
sequence.  Each sequence's blocks are scattered over the cache; small caches are cycled over several copies so the
L2 cache does not hold them.

Prefill rows also time ATOM under each PREFILL_SWEEP launch configuration (``sweep_us``, ``sweep_err``,
``sweep_best``).  Columns: ``<impl>_us`` (median of CUDA-graph replays, see :func:`timing.measure`), ``<impl>_err`` (max abs error
against an fp32 SDPA reference over the first REF_SEQS sequences), ``atom_over_<peer>`` (ATOM's time / the peer's),
``bytes`` (K/V read once, q read, out written), ``flops`` and ``floor_us`` (max of bytes / copy bandwidth and flops /
bf16 matmul rate), ``atom_GBps``.  A peer that cannot be imported reads ``"unavailable: ..."``, one that fails
``"error: ..."``.  SDPA runs on contiguous per-sequence K/V gathered from the cache beforehand (the gather is not
timed), and only while that dense copy stays under DENSE_LIMIT bytes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from atom_kernels.ops.paged_attention import triton as pa_triton
from atom_tools.kernels import peers
from atom_tools.kernels.timing import measure

HEADS, KV_HEADS, DIM, PAGE = 32, 8, 128, 16
DTYPE = torch.bfloat16
BATCHES = (1, 16, 64, 256)
CONTEXTS = (1024, 4096, 16384, 32768)
QUICK_DECODE = ((1, 4096), (64, 4096), (64, 32768), (256, 16384))
PREFILL = ((4, 2048, 0), (4, 2048, 2048), (1, 8192, 0))  # (sequences, new tokens each, cached tokens each)
CACHE_LIMIT = 40e9  # K + V bytes
DENSE_LIMIT = 12e9  # the dense K/V copy SDPA is timed on
L2_DEFEAT_BYTES = 256 << 20
REF_SEQS = 4
# Prefill launch configurations timed beside the default (block_m rows = queries x group heads, block_n keys per
# step, warps, pipeline stages): what the prefill default is chosen from.
PREFILL_SWEEP = tuple(pa_triton.Config(block_m=m, block_n=n, num_warps=w, num_stages=st) for m, n, w, st in (
    (64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 8, 2), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2)))


class Case:
    """One batch of ``batch`` sequences, each ``cached + new`` tokens long with its ``new`` tokens as queries, over
    ``copies`` paged caches (block tables scattered at random) cycled per call."""

    def __init__(self, batch: int, new: int, cached: int, device, seed: int = 0):
        gen = torch.Generator(device=device).manual_seed(seed)
        self.batch, self.new, self.context = batch, new, cached + new
        self.blocks = math.ceil(self.context / PAGE)
        self.kv_bytes = 2 * batch * self.context * KV_HEADS * DIM * DTYPE.itemsize
        self.copies = max(1, min(8, math.ceil(L2_DEFEAT_BYTES / self.kv_bytes)))
        num_blocks = batch * self.blocks
        shape = (num_blocks, PAGE, KV_HEADS, DIM)
        self.caches = [(torch.randn(shape, device=device, dtype=DTYPE, generator=gen),
                        torch.randn(shape, device=device, dtype=DTYPE, generator=gen)) for _ in range(self.copies)]
        self.tables = [torch.randperm(num_blocks, device=device, generator=gen).view(batch, self.blocks).int()
                       for _ in range(self.copies)]
        self.q = torch.randn(batch * new, HEADS, DIM, device=device, dtype=DTYPE, generator=gen)
        self.seq_lens = torch.full((batch,), self.context, dtype=torch.int32, device=device)
        self.qsl = torch.arange(0, batch + 1, dtype=torch.int32, device=device) * new
        self.scale = DIM**-0.5
        self.index = 0

    def next(self) -> int:
        """The cache copy the next call reads."""
        i = self.index
        self.index = (i + 1) % self.copies
        return i

    def dense(self, i: int, seqs: int | None = None, dtype=DTYPE) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy ``i``'s K and V of the first ``seqs`` sequences as contiguous ``[seqs, KV_HEADS, context, DIM]``."""
        table = self.tables[i][: seqs or self.batch].long()
        return tuple(c[table].flatten(1, 2)[:, : self.context].transpose(1, 2).to(dtype).contiguous()
                     for c in self.caches[i])

    def mask(self) -> torch.Tensor | None:
        """SDPA's boolean mask for queries at the last ``new`` positions (None when no key is hidden)."""
        if self.new == 1:
            return None
        rows = torch.arange(self.new, device=self.q.device)[:, None] + self.context - self.new
        return torch.arange(self.context, device=self.q.device)[None, :] <= rows

    def sdpa(self, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor | None = None, gqa: bool = True) -> torch.Tensor:
        """SDPA over dense ``k`` / ``v`` for the first ``k.shape[0]`` sequences; ``[seqs * new, HEADS, DIM]``."""
        seqs = k.shape[0]
        q = (self.q if q is None else q)[: seqs * self.new].view(seqs, self.new, HEADS, DIM).transpose(1, 2)
        if not gqa:
            k, v = (t.repeat_interleave(HEADS // KV_HEADS, dim=1) for t in (k, v))
        kw = {"enable_gqa": True} if gqa else {}
        if self.new > 1 and self.context == self.new:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, **kw)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask(), scale=self.scale, **kw)
        return out.transpose(1, 2).reshape(seqs * self.new, HEADS, DIM)


def atom(case: Case, config: pa_triton.Config | None = None):
    def call():
        i = case.next()
        k, v = case.caches[i]
        return pa_triton.paged_attention(case.q, k, v, case.tables[i], case.seq_lens, case.qsl, case.scale,
                                         config=config)
    return call


def config_label(cfg: pa_triton.Config) -> str:
    return f"m{cfg.block_m}-n{cfg.block_n}-w{cfg.num_warps}-s{cfg.num_stages}"


def sweep_prefill(case: Case, want: torch.Tensor, ref_tokens: int, index0: int) -> dict:
    """ATOM's prefill under each PREFILL_SWEEP launch configuration: ``{label: us}`` (or the error), the largest
    error against the reference over the configurations that ran, and the fastest label."""
    times, worst = {}, 0.0
    for cfg in PREFILL_SWEEP:
        fn = atom(case, cfg)
        try:
            case.index = index0
            worst = max(worst, (fn()[:ref_tokens].float() - want).abs().max().item())
            times[config_label(cfg)] = measure(fn, calls_per_graph=case.copies, reps=10)["us"]
        except Exception as err:  # a configuration that does not fit (registers, shared memory) is a cell saying so
            times[config_label(cfg)] = f"error: {type(err).__name__}: {err}"[:200]
    timed = {label: us for label, us in times.items() if isinstance(us, float)}
    return {"sweep_us": times, "sweep_err": worst, "sweep_best": min(timed, key=timed.get) if timed else None}


def atom_splits(case: Case) -> int:
    """The split count ATOM's launch picks for this case (its tile sizes as in ``pa_triton.paged_attention``)."""
    tokens, group_p2 = case.q.shape[0], triton_next_pow2(HEADS // KV_HEADS)
    block_q = max(16 if tokens <= 2 * case.batch else 64, group_p2) // group_p2
    tiles = tokens // block_q + case.batch
    return pa_triton.num_splits(tiles * KV_HEADS, case.blocks * PAGE, case.q.device)


def sdpa_peer(case: Case):
    """Torch SDPA on dense K/V per cache copy (gathered here, not timed)."""
    if case.kv_bytes * case.copies > DENSE_LIMIT:
        return f"skipped: dense K/V > {DENSE_LIMIT:.0e} bytes"
    dense = [case.dense(i) for i in range(case.copies)]
    return lambda: case.sdpa(*dense[case.next()])


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


BUILTIN_PEERS = {"sdpa": sdpa_peer}


def bench_case(phase: str, batch: int, new: int, cached: int, ctx: dict, device="cuda") -> dict:
    case = Case(batch, new, cached, device)
    context = case.context
    visible = batch * sum(cached + i + 1 for i in range(new))  # (query, key) pairs under the causal mask
    flops = 4 * HEADS * DIM * visible
    nbytes = case.kv_bytes + 2 * case.q.numel() * DTYPE.itemsize
    floor_us = max(nbytes / ctx["copy_bytes_per_s"], flops / ctx.get("bf16_flops_per_s", math.inf)) * 1e6
    row = dict(case=f"{phase}-b{batch}-new{new}-ctx{context}", phase=phase, batch=batch, new_tokens=new,
               context=context, bytes=nbytes, flops=flops, floor_us=floor_us, copies=case.copies,
               atom_splits=atom_splits(case))
    ref_seqs = min(batch, REF_SEQS)
    ref_tokens = ref_seqs * new
    index0 = case.index  # every impl's checked output reads copy 0
    want = case.sdpa(*case.dense(0, ref_seqs, torch.float32), q=case.q.float(), gqa=False)
    impls = {"atom": atom(case)}
    makers = {**BUILTIN_PEERS, **peers.for_suite(ctx, "attention")}
    for peer, make in makers.items():
        try:
            built = make(case)
        except Exception as err:  # a peer that fails to set up must not lose the others' numbers
            built = f"error: {type(err).__name__}: {err}"[:300]
        if isinstance(built, str):
            row[f"{peer}_us"] = built
        else:
            impls[peer] = built
    for impl, fn in impls.items():
        try:
            case.index = index0
            got = fn()
            row[f"{impl}_err"] = (got[:ref_tokens].float() - want).abs().max().item()
            calls = max(case.copies, min(20, max(1, int(2e9 // case.kv_bytes))))
            timed = measure(fn, calls_per_graph=calls, reps=10 if case.kv_bytes > 4e9 else 30)
        except Exception as err:  # one failing implementation must not lose the others' numbers
            row[f"{impl}_us"] = f"error: {type(err).__name__}: {err}"[:300]
            continue
        row[f"{impl}_us"] = timed["us"]
        row[f"{impl}_graph"] = timed["graph"]
    if isinstance(row.get("atom_us"), float):
        row["atom_GBps"] = nbytes / (row["atom_us"] * 1e-6) / 1e9
        row["atom_x_floor"] = row["atom_us"] / floor_us
        for peer in makers:
            if isinstance(row.get(f"{peer}_us"), float):
                row[f"atom_over_{peer}"] = row["atom_us"] / row[f"{peer}_us"]
    if phase == "prefill":
        row.update(sweep_prefill(case, want, ref_tokens, index0))
    return row


def cases(quick: bool) -> list[tuple[str, int, int, int]]:
    decode = QUICK_DECODE if quick else [(b, c) for b in BATCHES for c in CONTEXTS]
    out = [("decode", b, 1, c - 1) for b, c in decode if 2 * b * c * KV_HEADS * DIM * DTYPE.itemsize <= CACHE_LIMIT]
    return out + [("prefill", b, n, c) for b, n, c in (PREFILL[1:2] if quick else PREFILL)]


def run(ctx: dict) -> list[dict]:
    device = ctx.get("device", "cuda")
    rows = []
    for phase, batch, new, cached in cases(ctx.get("quick", False)):
        try:
            rows.append(bench_case(phase, batch, new, cached, ctx, device))
        except Exception as err:  # a case that cannot even be set up (memory) must not lose the others
            rows.append(dict(case=f"{phase}-b{batch}-new{new}-ctx{cached + new}", error=f"{type(err).__name__}: {err}"[:300]))
        if device == "cuda":
            torch.cuda.empty_cache()  # the next case's caches may need what this one's held (up to ~34 GB)
    return rows
