"""Write this step's keys and values into a paged KV cache.

``reshape_and_cache(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None``

* ``k`` / ``v``: ``[T, kv_heads, D]`` (any float dtype; a strided token dim is fine);
* ``k_cache`` / ``v_cache``: ``[num_blocks, block_size, kv_heads, D]``, written in place; token t goes to slot
  ``slot_mapping[t] = block * block_size + offset``; a negative slot (a padding token) is skipped;
* ``k_scale`` / ``v_scale``: per-tensor fp32 scales (a 1-element tensor): the stored value is ``x / scale``,
  the dequant multiplier :func:`paged_attention` takes.  An fp8 e4m3 cache stores it clamped to +-448 and rounded
  to nearest even.
"""

from atom_kernels.dispatch import register_op

reshape_and_cache = register_op("reshape_and_cache", __name__, backends=("triton", "reference"))
