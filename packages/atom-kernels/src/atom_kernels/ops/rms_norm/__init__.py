"""RMSNorm, optionally fused with the residual add that precedes it.

``rms_norm(x, weight, eps, residual=None, weight_offset=0.0)``:

* without ``residual``: ``y = x / sqrt(mean(x², -1) + eps) * (weight + weight_offset)``;
* with ``residual``: ``s = x + residual`` (in x's dtype), returns ``(rms_norm(s), s)``.

The norm is computed in fp32 and cast back to x's dtype. ``weight_offset=1.0`` is the zero-centred
("Gemma-style") RMSNorm of Qwen3-Next/Qwen3.5.
"""

from atom_kernels.dispatch import register_op

rms_norm = register_op("rms_norm", __name__)
