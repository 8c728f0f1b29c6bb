"""Block-scaled FP8 GEMM (DeepSeek-V3 style).

``fp8_block_mm(a, a_scale, b, b_scale, block_size=(128, 128), bias=None, out_dtype=torch.bfloat16)``

* ``a``: ``[M, K]`` float8_e4m3fn activations with ``a_scale [M, ceil(K/bk)]`` fp32, one per token per
  ``bk`` columns (``quant_fp8(x, group_size=bk)``);
* ``b``: ``[N, K]`` float8_e4m3fn weight with ``b_scale [ceil(N/bn), ceil(K/bk)]`` fp32, one per
  ``bn x bk`` block (a checkpoint's ``weight_scale_inv``: the dequantization multiplier);
* ``out[m, n] = sum_k a[m, k] a_scale[m, k // bk] b[n, k] b_scale[n // bn, k // bk] + bias[n]``,
  fp32 accumulation, ``out_dtype [M, N]``.

Backends: ``triton`` (``bk = 128``), ``aiter`` (ROCm ``gemm_a8w8_blockscale``), ``reference``.
"""

from atom_kernels.dispatch import register_op

fp8_block_mm = register_op("fp8_block_mm", __name__)
