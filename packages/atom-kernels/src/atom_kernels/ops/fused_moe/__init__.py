"""Fused mixture-of-experts: the routed experts' SwiGLU MLPs, weighted and summed per token.

``fused_moe(hidden, w13, w2, topk_weights, topk_ids, *, expert_map=None, quant=None, config=None, w13_bias=None,
w2_bias=None, activation="silu", swiglu_limit=None) -> out``

* ``hidden``: ``[T, H]`` fp32 / fp16 / bf16;
* ``w13``: ``[E, 2I, H]``: expert e's gate projection in rows ``[0, I)``, its up projection in
  ``[I, 2I)`` (``nn.Linear`` layout: out x in);  ``w2``: ``[E, H, I]`` (down projection);
* ``topk_weights``: ``[T, k]`` (any float dtype), ``topk_ids``: ``[T, k]`` integer expert ids;
* ``expert_map``: optional int ``[global experts]``, global id -> index into ``w13``/``w2`` or -1 for an
  expert another rank holds (expert parallelism).  Without it ``topk_ids`` index ``w13``/``w2`` directly.
* ``quant``: optional :class:`ExpertQuant` when ``w13``/``w2`` are quantized (format + scales); None
  for plain fp32/fp16/bf16 weights.  Backends without a path for a format decline it (dispatch falls
  back to the reference, which dequantizes through the format's registered function).  Formats:
  ``fp8-block`` (the inputs of both GEMMs are quantized per token per 128 columns, the SiLU-and-mul
  rows after their rounding to hidden's dtype) and ``mxfp4`` (weight-only); see ``expert_formats``.
* ``config``: optional :class:`MoeKernelConfig` overriding the Triton kernel's tiles (benchmarks).
* ``w13_bias`` ``[E, 2I]`` (gate then up, as ``w13``'s rows) / ``w2_bias`` ``[E, H]``: optional expert biases,
  added to each GEMM's fp32 accumulator (the down bias before the routing weight);
* ``activation``: ``"silu"`` (``silu(gate) · up``) or ``"swigluoai"`` (gpt-oss: ``g · σ(1.702 g) · (u + 1)``
  with ``g = min(gate, 7)``, ``u = clamp(up, -7, 7)``);
* ``swiglu_limit``: optional, with ``"silu"``: ``silu(min(gate, limit)) · clamp(up, -limit, limit)`` (DeepSeek-V4;
  the quantized Triton paths and AITER decline it).

``out[t] = Σ_j topk_weights[t, j] · w2[e] (silu(w13[e, :I] h_t) ⊙ (w13[e, I:] h_t))`` with
``e = expert_map[topk_ids[t, j]]`` (pairs with ``e = -1`` contribute zero; the caller all-reduces over
the expert-parallel ranks).  Products accumulate in fp32; the SiLU-and-mul activation is rounded to
``hidden``'s dtype before the down projection, each pair's weighted output may be rounded to it before
the sum over k, and the sum is rounded once.  ``out`` has ``hidden``'s dtype and shape ``[T, H]``.
"""

from atom_kernels.dispatch import register_op
from atom_kernels.ops.fused_moe import expert_formats  # noqa: E402,F401  (registers fp8-block and mxfp4)
from atom_kernels.ops.fused_moe.configs import CONFIGS, GemmTile, MoeKernelConfig, config_for
from atom_kernels.ops.fused_moe.reference import ACTIVATIONS
from atom_kernels.ops.fused_moe.weights import ExpertQuant, dequantize_expert, register_expert_format

fused_moe = register_op("fused_moe", __name__)

__all__ = [
    "ACTIVATIONS", "CONFIGS", "ExpertQuant", "GemmTile", "MoeKernelConfig", "config_for", "dequantize_expert", "fused_moe",
    "register_expert_format",
]
