"""FP8 e4m3 quantization of activations, dynamic (per token or per token group) or static.

``quant_fp8(x, group_size=None, static_scale=None) -> (q, scale)``

* ``x``: ``[..., K]`` fp32 / bf16 / fp16, last dim contiguous.
* dynamic, ``group_size=None``: one scale per row (token), ``scale [..., 1]``
  ``= max(amax(|x_row|), 1e-10) / 448``;
* dynamic, ``group_size=g``: one scale per row and ``g`` consecutive columns (the last group may be
  short), ``scale [..., ceil(K / g)]`` (g = 128 is DeepSeek-V3's 1x128 activation groups);
* ``static_scale``: a one-element fp32 tensor (a checkpoint's ``input_scale``); ``scale [..., 1]``
  holds it for every row.

``q [..., K]`` (``torch.float8_e4m3fn``) ``= round_to_nearest_even(clamp(x * (1 / scale), -448, 448))``
with the reciprocal an IEEE fp32 division; ``q * scale`` approximates ``x``.  Scales are fp32.
"""

from atom_kernels.dispatch import register_op

quant_fp8 = register_op("quant_fp8", __name__)
