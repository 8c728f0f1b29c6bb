"""Multi-head latent attention decode (DeepSeek-V2/V3, absorbed form) over a paged latent cache.

``mla_decode(q, cache, block_table, seq_lens, scale, kv_lora_rank) -> out``

* ``q``: ``[B, H, kv_lora_rank + rope_dim]``, one query per sequence, already absorbed (``q_nope W_UK`` then
  ``q_pe``); bf16, fp16 or fp32, last dim contiguous;
* ``cache``: ``[num_blocks, block_size, kv_lora_rank + rope_dim]``, each token's latent ``kv_c`` then its
  rotated ``k_pe`` (a host's ``[num_slots, 1, D]`` cache viewed with the head dim squeezed); token j of
  sequence b lives at ``cache[block_table[b, j // block_size], j % block_size]``;
* ``block_table``: ``[B, max_blocks]`` int32; entries past a sequence's ``ceil(seq_len / block_size)`` blocks
  are never read (any value, -1 included);
* ``seq_lens``: ``[B]`` int32, the context length including the new token; 0 marks a padding row (zero output,
  nothing read).

``out[b, h] = softmax(scale * q[b, h] · K_bᵀ) · K_b[:, :kv_lora_rank]`` with ``K_b`` sequence b's cached rows,
``[B, H, kv_lora_rank]`` in q's dtype; scores and softmax in fp32.  The caller applies ``W_UV``.
CUDA-graph capturable (the Triton path reads lengths on the device; shapes come from tensor metadata).
"""

from atom_kernels.dispatch import register_op

mla_decode = register_op("mla_decode", __name__)
