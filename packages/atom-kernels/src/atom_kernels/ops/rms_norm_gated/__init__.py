"""Gated RMSNorm of GDN's output, per head: ``rms_norm_gated(x, z, weight, eps) -> out``.

``out = x / sqrt(mean(x², -1) + eps) * weight * silu(z)`` over the last dim (the head dim), in fp32,
cast back to x's dtype.  ``x``, ``z``: ``[T, N]`` or ``[T, heads, N]`` of the same shape (only the last
dim must be contiguous: z may be a view into a packed projection); ``weight``: ``[N]``.
"""

from atom_kernels.dispatch import register_op

rms_norm_gated = register_op("rms_norm_gated", __name__, backends=("triton", "reference"))
