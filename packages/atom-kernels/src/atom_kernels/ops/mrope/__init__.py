"""Multimodal rotary position embedding (MRoPE) of q and k, in place, optionally fused with the
per-head RMSNorm that precedes it.

``mrope(positions, q, k, cos_sin_cache, head_size, mrope_section, interleaved=False, *, q_weight=None,
k_weight=None, eps=1e-6, weight_offset=0.0) -> (q, k)``

* ``positions``: ``[3, T]`` integer positions, one row each for time, height and width (Qwen2-VL,
  Qwen2.5-VL, Qwen3-VL, Qwen3.5), or ``[T]``: text only, the same position on all three rows;
* ``q``: ``[T, num_heads * head_size]`` or ``[T, num_heads, head_size]`` (any token and head stride;
  the last dim contiguous); ``k`` likewise, or None;
* ``cos_sin_cache``: ``[max_position, rotary_dim]`` fp32, ``cos`` in the first half of each row and
  ``sin`` in the second — the layout of :func:`atom_kernels.rotary_embedding`;
* ``mrope_section``: ``(t, h, w)`` with ``t + h + w == rotary_dim // 2`` assigns each frequency index
  ``i`` of the rotated half to a position row:

  - chunked (Qwen2-VL, Qwen2.5-VL): ``i < t`` -> row 0, ``i < t + h`` -> row 1, else row 2;
  - ``interleaved`` (Qwen3-VL, Qwen3.5): row 1 where ``i % 3 == 1 and i < 3h``, row 2 where
    ``i % 3 == 2 and i < 3w``, row 0 elsewhere.

  Frequency ``i`` then rotates the NeoX pair ``(x[i], x[i + rotary_dim/2])`` by the angle the cache
  holds for that row's position: ``cos = cache[pos[row(i)], i]``, ``sin = cache[pos[row(i)], rotary_dim/2 + i]``.
  Dims past ``rotary_dim`` pass through (partial rotary).
* ``q_weight`` / ``k_weight`` (``[head_size]``, both or neither): first RMS-normalise every head over
  its ``head_size`` dims, ``x / sqrt(mean(x²) + eps) * (w + weight_offset)``, rounded to the tensor's
  dtype (exactly :func:`atom_kernels.rms_norm` per head), then rotate.  ``weight_offset=1.0`` is the
  zero-centred norm of Qwen3-Next/Qwen3.5.

Rotation and norm are computed in fp32 and written back in q's and k's dtype.
"""

from atom_kernels.dispatch import register_op

mrope = register_op("mrope", __name__)
