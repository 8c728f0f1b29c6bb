"""Sparse multi-head latent attention (DeepSeek sparse attention, absorbed form): each query attends only to the
cached latents its indexer selected.  Also DeepSeek-V4's compressed attention: rows of one shared key = value head
(``kv_lora_rank`` the whole row, no rope part) with per-head sinks.

``sparse_mla(q, cache, slots, scale, kv_lora_rank, sinks=None) -> out``

* ``q``: ``[T, H, kv_lora_rank + rope_dim]``, absorbed queries (``q_nope W_UK`` then ``q_pe``), any float dtype;
* ``cache``: ``[num_blocks, block_size, kv_lora_rank + rope_dim]``, each token's latent ``kv_c`` then ``k_pe``;
  slot ``s`` is ``cache[s // block_size, s % block_size]``;
* ``slots``: ``[T, K]`` int32, the cache slots query t attends to (negative: unused; a row with none gives zeros);
* ``sinks``: optional ``[H]``, one logit per head that joins each softmax and takes no value (gpt-oss' sinks).

``out[t, h] = softmax(scale · q[t, h] · C_tᵀ) · C_t[:, :kv_lora_rank]`` with ``C_t`` the rows at ``slots[t]``
(with sinks: ``softmax([scale · q[t, h] · C_tᵀ | sinks[h]])`` without the sink's share), ``[T, H, kv_lora_rank]``
in q's dtype; scores and softmax in fp32.  ``0 < kv_lora_rank <= D``.  Only the selected rows are read.
"""

from atom_kernels.dispatch import register_op

sparse_mla = register_op("sparse_mla", __name__, backends=("triton", "reference"))
