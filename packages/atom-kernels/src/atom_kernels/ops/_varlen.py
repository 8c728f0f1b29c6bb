"""Packed variable-length sequences (``cu_seqlens``) cut into fixed-size chunks, without a host sync.

Kernels over packed sequences launch one program per chunk.  The number of chunks depends on the
lengths, which live on the device; instead of reading them back (a sync, and no CUDA-graph capture)
the grid is the upper bound ``ceil(T / block) + N`` and a program whose chunk does not exist exits.
"""

from __future__ import annotations

import torch
import triton

# A host's prefill sequences follow its decode ones, so their per-sequence slots and initial-state flags are slices
# at a step-dependent offset: kernels taking them leave these pointers out of alignment specialization
# (``do_not_specialize_on_alignment``), one compile for every step.
PER_SEQUENCE_POINTERS = ["slots_ptr", "init_ptr"]


def max_chunks(num_tokens: int, num_seqs: int, block: int) -> int:
    """Upper bound of ``sum(ceil(len_i / block))`` over sequences of total length <= num_tokens."""
    return triton.cdiv(num_tokens, block) + num_seqs


def padded_tokens(num_tokens: int) -> int:
    """The row length of a per-head ``[heads, tokens]`` buffer: tokens rounded up to a multiple of 16, so the row
    stride a kernel receives is specialized the same way at every token count (no new compile per step) and rows
    stay 64-byte aligned."""
    return max(16, -(-num_tokens // 16) * 16)


def chunk_map(cu_seqlens: torch.Tensor, num_tokens: int, block: int):
    """``(chunk_seq, chunk_start, chunk_offsets)`` for chunks of ``block`` tokens.

    ``chunk_seq[c]``: the sequence of chunk c (-1 past the last chunk); ``chunk_start[c]``: its first
    token; ``chunk_offsets[n]``: the index of sequence n's first chunk (``[N + 1]``).  int32.
    """
    cu = cu_seqlens.to(torch.int64)
    num_seqs = cu.numel() - 1
    counts = (cu[1:] - cu[:-1] + block - 1) // block
    offsets = torch.zeros(num_seqs + 1, dtype=torch.int64, device=cu.device)
    offsets[1:] = torch.cumsum(counts, 0)
    ids = torch.arange(max_chunks(num_tokens, num_seqs, block), device=cu.device)
    seq = torch.searchsorted(offsets[1:], ids, right=True)
    valid = seq < num_seqs
    seq_c = seq.clamp(max=max(num_seqs - 1, 0))
    start = cu[seq_c] + (ids - offsets[seq_c]) * block
    chunk_seq = torch.where(valid, seq_c, -1).to(torch.int32)
    return chunk_seq, start.to(torch.int32), offsets.to(torch.int32)


def decode_rows(op: str, num_tokens: int, num_seqs: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int]]:
    """``(first, end)`` token rows of each of ``num_seqs`` decode sequences (for the torch references: reads the
    offsets back): ``cu_seqlens [N + 1]`` when given, else ``num_tokens / num_seqs`` consecutive tokens each."""
    if cu_seqlens is None:
        if num_seqs == 0 or num_tokens % num_seqs:
            raise ValueError(f"{op}: {num_tokens} tokens do not split evenly over {num_seqs} sequences")
        per_seq = num_tokens // num_seqs
        return [(n * per_seq, (n + 1) * per_seq) for n in range(num_seqs)]
    cu = cu_seqlens.tolist()
    if len(cu) != num_seqs + 1 or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])) or cu[-1] > num_tokens:
        raise ValueError(f"{op}: cu_seqlens must be [{num_seqs + 1}] non-decreasing offsets from 0 to at most "
                         f"{num_tokens}, got {cu}")
    return list(zip(cu, cu[1:]))
