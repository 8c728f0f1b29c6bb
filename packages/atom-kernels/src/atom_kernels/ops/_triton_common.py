"""Small pieces the Triton kernels of several ops share.

Two interpreter facts shape them (Triton 3.6 with NumPy >= 2.4, how the CPU tests run):

* a ``for`` loop over a *runtime* bound fails (the interpreter turns the bound into a 1-element array
  that NumPy no longer converts to an int); a ``while`` loop works.  Kernels with data-dependent trip
  counts take ``USE_WHILE`` and use ``while`` only under the interpreter, keeping ``for`` (software
  pipelined) on the GPU.
* ``tl.dot`` of bf16/fp16 operands returns garbage; fp32 operands are exact.  Kernels take the operand
  dtype of their dots as a constexpr: the tensor dtype on the GPU, fp32 under the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.dispatch import triton_interpreting

LOG2E = 1.4426950408889634
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the tensor dtypes the float kernels take

_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def dot_dtype(dtype: torch.dtype):
    """Operand dtype of ``tl.dot`` for tensors of ``dtype``."""
    if triton_interpreting():
        return tl.float32
    return _TL_DTYPES[dtype]


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 dots in IEEE precision (no TF32 rounding) so fp32 runs match the fp32 reference; the setting
    only concerns fp32 operands (bf16/fp16 dots use the tensor cores either way)."""
    return "ieee" if dtype == torch.float32 or triton_interpreting() else "tf32"


def use_while() -> bool:
    return triton_interpreting()


@triton.jit
def softplus(x):
    """``log(1 + exp(x))``, linear above 20 (torch's threshold)."""
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def gdn_gate(a, b, A_log, dt_bias):
    """``(g, beta)`` of the gated delta rule in fp32 from the raw projections."""
    g = -tl.exp(A_log) * softplus(a + dt_bias)
    return g, tl.sigmoid(b)


@triton.jit
def grouped_tile(pid, row_tiles, col_tiles, GROUP: tl.constexpr):
    """(row tile, column tile) of program ``pid`` in grouped order: ``GROUP`` row tiles take each column tile
    in turn, so the column tile's operand is reused from L2 while those rows pass."""
    per_group = GROUP * col_tiles
    first = (pid // per_group) * GROUP
    rows_in_group = tl.minimum(row_tiles - first, GROUP)
    return first + (pid % per_group) % rows_in_group, (pid % per_group) // rows_in_group


@triton.jit
def chunk_span(c, chunk_seq_ptr, chunk_start_ptr, cu_ptr, BT: tl.constexpr):
    """Chunk ``c`` of packed sequences (see ``_varlen.chunk_map``): its sequence (negative for a spare program
    past the last chunk, whose start and length mean nothing), first token and length (at most ``BT``)."""
    seq = tl.load(chunk_seq_ptr + c)
    start = tl.load(chunk_start_ptr + c).to(tl.int64)
    length = tl.minimum(tl.load(cu_ptr + tl.maximum(seq, 0) + 1).to(tl.int64) - start, BT)
    return seq, start, length


@triton.jit
def dot_acc(a, b, acc, IEEE: tl.constexpr):
    """``acc + a @ b``; ``IEEE``: exact fp32 products (the interpreter's fp32 path) instead of the default."""
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


def latent_cache_unsupported(q: torch.Tensor, cache: torch.Tensor, kv_lora_rank: int, max_latent: int) -> str | None:
    """Why the latent-attention kernels (MLA decode, sparse MLA) cannot take these tensors, or None."""
    if kv_lora_rank > max_latent:
        return f"kv_lora_rank {kv_lora_rank} > {max_latent}"
    if q.stride(-1) != 1 or cache.stride(-1) != 1:
        return "q and cache need a contiguous last dim"
    if q.dtype not in FLOAT_DTYPES or cache.dtype not in FLOAT_DTYPES:
        return f"q {q.dtype} / cache {cache.dtype}: float caches only"
    return None


@triton.jit
def latent_fold(m, l, acc, q_lat, q_pe, row, ok, cols_l, cols_r, l_ok, r_ok, scale_log2, L: tl.constexpr,
                DOT: tl.constexpr, PREC: tl.constexpr):
    """Fold the latent cache rows at pointers ``row`` (those with ``ok``; each ``L`` latent values, then the RoPE
    part) into the online softmax ``(m, l, acc)`` of the queries ``q_lat | q_pe`` (base-2 logits): the rows are
    the keys and, latent part only, the values.  A fold with no ``ok`` row so far keeps ``exp2`` finite."""
    kv = tl.load(row[:, None] + cols_l[None, :], mask=ok[:, None] & l_ok[None, :], other=0.0).to(DOT)
    pe = tl.load(row[:, None] + L + cols_r[None, :], mask=ok[:, None] & r_ok[None, :], other=0.0).to(DOT)
    s = tl.dot(q_lat, tl.trans(kv), input_precision=PREC) + tl.dot(q_pe, tl.trans(pe), input_precision=PREC)
    s = tl.where(ok[None, :], s * scale_log2, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT), kv, input_precision=PREC)
    return m_new, l, acc
