"""ATOM's GPU ops: one public function per op, each with a torch reference, a Triton kernel and an
AITER wrapper (ROCm), chosen by :mod:`atom_kernels.dispatch`."""

from atom_kernels import library  # noqa: F401  (the ops as torch.ops.atom custom ops, for torch.compile)
from atom_kernels.dispatch import OPS, describe
from atom_kernels.ops.causal_conv1d import causal_conv1d
from atom_kernels.ops.causal_conv1d_update import causal_conv1d_update
from atom_kernels.ops.chunk_gated_delta_rule import chunk_gated_delta_rule
from atom_kernels.ops.fp8_block_mm import fp8_block_mm
from atom_kernels.ops.fp8_scaled_mm import fp8_scaled_mm
from atom_kernels.ops.fused_moe import ExpertQuant, MoeKernelConfig, fused_moe
from atom_kernels.ops.fused_recurrent_gated_delta_rule import fused_recurrent_gated_delta_rule
from atom_kernels.ops.indexer_scores import indexer_scores
from atom_kernels.ops.mla_decode import mla_decode
from atom_kernels.ops.moe_align import moe_align_block_size
from atom_kernels.ops.mrope import mrope
from atom_kernels.ops.mxfp4_mm import mxfp4_mm
from atom_kernels.ops.paged_attention import paged_attention
from atom_kernels.ops.quant_fp8 import quant_fp8
from atom_kernels.ops.reshape_and_cache import reshape_and_cache
from atom_kernels.ops.rms_norm import rms_norm
from atom_kernels.ops.rms_norm_gated import rms_norm_gated
from atom_kernels.ops.rotary_embedding import rotary_embedding
from atom_kernels.ops.silu_and_mul import silu_and_mul
from atom_kernels.ops.sparse_mla import sparse_mla
from atom_kernels.ops.topk_indices import topk_indices
from atom_kernels.ops.topk_routing import topk_routing

__version__ = "0.1.0"

__all__ = [
    "OPS", "ExpertQuant", "MoeKernelConfig", "describe", "causal_conv1d", "causal_conv1d_update", "chunk_gated_delta_rule",
    "fp8_block_mm", "fp8_scaled_mm", "fused_moe", "fused_recurrent_gated_delta_rule", "indexer_scores", "mla_decode",
    "moe_align_block_size",
    "mrope", "mxfp4_mm", "paged_attention", "quant_fp8", "reshape_and_cache", "rms_norm", "rms_norm_gated",
    "rotary_embedding", "silu_and_mul", "sparse_mla", "topk_indices", "topk_routing",
    "__version__",
]
