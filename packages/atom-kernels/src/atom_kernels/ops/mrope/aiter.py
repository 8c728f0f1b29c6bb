"""AITER for MRoPE (ROCm): only the text-only special case.

AITER has no stand-alone in-place MRoPE: its multimodal kernel
(``fused_qk_norm_mrope_3d_cache_quant_shuffle``) also writes the KV cache, and its ``MRotaryEmbedding``
is plain torch.  With 1-D positions MRoPE is ordinary NeoX rotary, which AITER's cached-positions kernel
does; every other call falls back to the Triton kernel.  Unverified here: nobody on the team has an AMD GPU.
"""

from __future__ import annotations

from atom_kernels.ops.rotary_embedding import aiter as rotary_aiter


def unsupported(positions, q, k, cos_sin_cache, head_size, mrope_section, interleaved=False, *,
                q_weight=None, k_weight=None, eps=1e-6, weight_offset=0.0) -> str | None:
    if positions.dim() != 1:
        return "aiter has no stand-alone in-place kernel for [3, T] positions"
    if q_weight is not None:
        return "aiter's fused q/k norm + rope also writes the KV cache; not wired"
    return rotary_aiter.unsupported(positions, q, k, cos_sin_cache, head_size, True)


def mrope(positions, q, k, cos_sin_cache, head_size, mrope_section, interleaved=False, *,
          q_weight=None, k_weight=None, eps=1e-6, weight_offset=0.0):
    return rotary_aiter.rotary_embedding(positions, q, k, cos_sin_cache, head_size, True)
