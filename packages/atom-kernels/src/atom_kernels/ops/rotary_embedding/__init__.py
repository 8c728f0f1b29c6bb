"""Rotary position embedding of q and k, in place.

``rotary_embedding(positions, q, k, cos_sin_cache, head_size, is_neox=True) -> (q, k)``

* ``positions``: ``[T]`` integer positions;
* ``q``: ``[T, num_heads * head_size]`` or ``[T, num_heads, head_size]``; ``k`` likewise, or None;
* ``cos_sin_cache``: ``[max_position, rotary_dim]`` fp32, ``cos`` in the first half of each row and
  ``sin`` in the second (scaling such as Llama-3 or YaRN is already folded into the cache);
* ``is_neox``: rotate the two halves of the first ``rotary_dim`` dims (NeoX / Llama) or adjacent
  pairs (GPT-J).  Dims past ``rotary_dim`` pass through (partial rotary).

The rotation is computed in fp32 and written back in q's and k's dtype.
"""

from atom_kernels.dispatch import register_op

rotary_embedding = register_op("rotary_embedding", __name__)
