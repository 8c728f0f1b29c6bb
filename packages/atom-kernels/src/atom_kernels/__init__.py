"""ATOM's GPU ops: one public function per op, each with a torch reference, a Triton kernel and an
AITER wrapper (ROCm), chosen by :mod:`atom_kernels.dispatch`."""

from atom_kernels.dispatch import OPS, describe
from atom_kernels.ops.fused_moe import ExpertQuant, MoeKernelConfig, fused_moe
from atom_kernels.ops.moe_align import moe_align_block_size
from atom_kernels.ops.mrope import mrope
from atom_kernels.ops.rms_norm import rms_norm
from atom_kernels.ops.rotary_embedding import rotary_embedding
from atom_kernels.ops.silu_and_mul import silu_and_mul
from atom_kernels.ops.topk_routing import topk_routing

__version__ = "0.1.0"

__all__ = [
    "OPS", "ExpertQuant", "MoeKernelConfig", "describe", "fused_moe", "moe_align_block_size", "mrope", "rms_norm",
    "rotary_embedding", "silu_and_mul", "topk_routing", "__version__",
]
