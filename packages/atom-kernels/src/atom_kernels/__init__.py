"""ATOM's GPU ops: one public function per op, each with a torch reference, a Triton kernel and an
AITER wrapper (ROCm), chosen by :mod:`atom_kernels.dispatch`."""

from atom_kernels.dispatch import OPS, describe
from atom_kernels.ops.causal_conv1d import causal_conv1d
from atom_kernels.ops.causal_conv1d_update import causal_conv1d_update
from atom_kernels.ops.chunk_gated_delta_rule import chunk_gated_delta_rule
from atom_kernels.ops.fused_recurrent_gated_delta_rule import fused_recurrent_gated_delta_rule
from atom_kernels.ops.rms_norm import rms_norm
from atom_kernels.ops.rms_norm_gated import rms_norm_gated
from atom_kernels.ops.rotary_embedding import rotary_embedding
from atom_kernels.ops.silu_and_mul import silu_and_mul

__version__ = "0.1.0"

__all__ = [
    "OPS", "describe", "causal_conv1d", "causal_conv1d_update", "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule", "rms_norm", "rms_norm_gated", "rotary_embedding", "silu_and_mul", "__version__",
]
