"""MXFP4 weight-only GEMM: bf16 activations times 4-bit microscaled weights.

``mxfp4_mm(x, w, w_scale, bias=None) -> out``

* ``x``: ``[M, K]`` activations (bf16; fp32/fp16 take the reference path on a GPU);
* ``w``: ``[N, K/2]`` uint8, two e2m1 codes per byte, element ``2i`` in the low nibble (K a multiple
  of 32); ``w_scale``: ``[N, K/32]`` uint8 e8m0 scales (``2**(e-127)``), one per 32 elements of a row;
* ``out[m, n] = sum_k x[m, k] * e2m1(w[n, k]) * 2**(w_scale[n, k // 32] - 127) + bias[n]``, fp32
  accumulation, ``[M, N]`` in x's dtype.

The weights stay 4-bit in memory and are decoded in registers: at decode batch sizes the GEMM moves
a quarter of the bytes of a bf16 GEMM.  Backends: ``triton`` (any GPU), ``aiter`` (ROCm
``gemm_a4w4``, opt-in: it also quantizes the activations), ``reference``.
"""

from atom_kernels.dispatch import register_op

mxfp4_mm = register_op("mxfp4_mm", __name__)
