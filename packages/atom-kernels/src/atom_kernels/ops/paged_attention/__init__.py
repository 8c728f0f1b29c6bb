"""Paged attention over a block-table KV cache: decode and chunked prefill in one op.

``paged_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, *, sliding_window=None,
sinks=None, soft_cap=None, k_scale=None, v_scale=None) -> out``

* ``q``: ``[T, H, D]`` packed varlen queries, bf16 / fp16 / fp32; sequence b's queries are
  ``q[query_start_loc[b] : query_start_loc[b + 1]]``, the *last* ``n_b`` tokens of its context of
  ``seq_lens[b]`` tokens (so query i sits at absolute position ``seq_lens[b] - n_b + i``);
* ``k_cache`` / ``v_cache``: ``[num_blocks, block_size, kv_heads, D]`` (bf16 / fp16 / fp32, or fp8 e4m3 with
  ``k_scale`` / ``v_scale``), every token of every context already written (:func:`reshape_and_cache`); token j of
  sequence b lives at ``cache[block_table[b, j // block_size], j % block_size]``;
* ``block_table``: ``[B, max_blocks]`` int32; entries past a sequence's ``ceil(seq_len / block_size)`` blocks are
  never read (-1 allowed);
* ``seq_lens``: ``[B]`` int32 context lengths (new tokens included), ``seq_lens[b] >= n_b``;
* ``query_start_loc``: ``[B + 1]`` int32 cumulative query counts, ``query_start_loc[B] <= T``; rows of ``out``
  past ``query_start_loc[B]`` (a host's padding tokens) are undefined;
* ``H`` a multiple of ``kv_heads`` (query head h reads kv head ``h // (H / kv_heads)``).

Key j is visible to query position i when ``j <= i`` and, with ``sliding_window`` w, ``i - j < w`` (transformers'
convention).  Scores are ``scale * q·k`` (times ``k_scale``), then ``soft_cap * tanh(s / soft_cap)`` when given;
``sinks`` (``[H]`` fp32, gpt-oss) add one logit per head to the softmax denominator only.  Softmax in fp32; ``out``
is ``[T, H, D]`` in q's dtype.  The Triton path is CUDA-graph capturable: no host reads, grid from shapes.
"""

import torch

from atom_kernels.dispatch import register_op

paged_attention = register_op("paged_attention", __name__)


def warm_up(q, k_cache, v_cache, scale, **options) -> bool:
    """Compile, before serving, every kernel variant that calls like ``paged_attention(q, k_cache, v_cache, ...,
    scale, **options)`` can launch (Triton; other backends compile nothing).  True once warm, False while the
    current CUDA stream is being captured (nothing may run then: call again on a later eager step).  A host's
    attention backend calls it on its first eager step, so no request pays a compile."""
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    probe = torch.zeros(1, 1, dtype=torch.int32, device=q.device)
    starts = torch.zeros(2, dtype=torch.int32, device=q.device)
    backend, _ = paged_attention.resolve(q[:1], k_cache, v_cache, probe, probe[0], starts, scale, **options)
    if backend == "triton":
        from atom_kernels.ops.paged_attention.triton import warm_up as triton_warm_up

        triton_warm_up(q, k_cache, v_cache, scale, **options)
    return True
