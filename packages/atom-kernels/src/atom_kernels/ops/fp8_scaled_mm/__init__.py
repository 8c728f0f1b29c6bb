"""FP8 GEMM with per-row scales on the activations and per-column scales on the weights.

``fp8_scaled_mm(a, a_scale, b, b_scale, bias=None, out_dtype=torch.bfloat16) -> out``

* ``a``: ``[M, K]`` float8_e4m3fn (activations, e.g. from ``quant_fp8``), ``a_scale``: ``[M, 1]`` fp32;
* ``b``: ``[N, K]`` float8_e4m3fn (the weight as stored, one output feature per row),
  ``b_scale``: ``[N, 1]`` (or ``[N]``) fp32;
* ``out[m, n] = sum_k (a[m, k] a_scale[m]) (b[n, k] b_scale[n]) + bias[n]``, accumulated in fp32 and
  written as ``out_dtype`` ``[M, N]``.

Backends: ``torch`` (cuBLASLt row-wise ``torch._scaled_mm``; Hopper or newer, K and N multiples of
16), ``triton`` (any GPU; swapped operands and split K for decode-sized M), ``aiter`` (ROCm
``gemm_a8w8``), ``reference``.
"""

from atom_kernels.dispatch import register_op

fp8_scaled_mm = register_op("fp8_scaled_mm", __name__, backends=("aiter", "torch", "triton", "reference"))
