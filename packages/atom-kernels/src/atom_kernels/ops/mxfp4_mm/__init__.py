"""MXFP4 weight-only GEMM: bf16 activations times 4-bit microscaled weights.

``mxfp4_mm(x, w, w_scale, bias=None, layout="rows", static_weights=False) -> out``

* ``x``: ``[M, K]`` activations (bf16; fp32/fp16 take the reference path on a GPU);
* ``w``: ``[N, K/2]`` uint8, two e2m1 codes per byte, element ``2i`` in the low nibble (K a multiple
  of 32); ``w_scale``: ``[N, K/32]`` uint8 e8m0 scales (``2**(e-127)``), one per 32 elements of a row;
* ``layout``: ``"rows"`` (the checkpoint's byte order, above) or ``"lanes"`` (the same codes permuted inside each
  128-code block and their bits inside each 32-bit word, ``formats.mxfp4_rows_to_lanes``: the order in which each MMA
  lane's decoded pairs are in natural K order, so neither Triton kernel permutes its activations, and each pair
  decodes in one or two shifts and masks; K a multiple of 128).  ``preferred_layout(n, k,
  device)`` says which one the kernels on ``device`` read faster;
* ``static_weights``: the caller's promise that no kernel recently queued on the stream writes ``w`` or ``w_scale``
  (true of a layer's parameters while it serves): on sm_90 the small-M kernel may then start reading them before the
  previous kernel has finished (programmatic dependent launch, ``gluon_small_m``);
* ``out[m, n] = sum_k x[m, k] * e2m1(w[n, k]) * 2**(w_scale[n, k // 32] - 127) + bias[n]``, fp32
  accumulation, ``[M, N]`` in x's dtype.

The weights stay 4-bit in memory and are decoded in registers: at decode batch sizes the GEMM moves
a quarter of the bytes of a bf16 GEMM.  Backends: ``triton`` (any GPU), ``aiter`` (ROCm
``gemm_a4w4``, opt-in: it also quantizes the activations), ``reference``.
"""

from atom_kernels.dispatch import register_op

mxfp4_mm = register_op("mxfp4_mm", __name__)


def preferred_layout(n: int, k: int, device) -> str:
    """The byte order the Triton kernels read an ``[n, k]`` weight fastest in on ``device``: ``"lanes"`` where the
    sm_90 small-M ring kernel serves decode-sized calls (K % 256 == 0 and the ring's other conditions), else
    ``"rows"``.  Lanes is also the warpgroup-MMA kernel's natural order above 16 tokens (about twice as fast there on
    the H200).  ``atom_core``'s MXFP4 layers keep weights in this order
    (``ATOM_MXFP4_LAYOUT=rows`` keeps the checkpoint's)."""
    from atom_kernels.dispatch import _triton_present

    if not _triton_present():  # only the reference runs, and it reads rows
        return "rows"
    from atom_kernels.ops.mxfp4_mm.planner import lanes_serve

    return "lanes" if lanes_serve(n, k, device) else "rows"
