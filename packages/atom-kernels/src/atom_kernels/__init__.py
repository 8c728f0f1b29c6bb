"""ATOM's GPU ops: one public function per op, each with a torch reference, a Triton kernel and an
AITER wrapper (ROCm), chosen by :mod:`atom_kernels.dispatch`."""

from atom_kernels.dispatch import OPS, describe
from atom_kernels.ops.mrope import mrope
from atom_kernels.ops.rms_norm import rms_norm
from atom_kernels.ops.rotary_embedding import rotary_embedding
from atom_kernels.ops.silu_and_mul import silu_and_mul

__version__ = "0.1.0"

__all__ = ["OPS", "describe", "mrope", "rms_norm", "rotary_embedding", "silu_and_mul", "__version__"]
