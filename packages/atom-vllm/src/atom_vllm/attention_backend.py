"""ATOM's paged-attention op as a vLLM attention backend, opt-in: ``--attention-backend CUSTOM``.

The plugin (:mod:`atom_vllm.plugin`) registers :class:`AtomAttentionBackend` in vLLM's slot for third-party
backends, ``AttentionBackendEnum.CUSTOM`` (``vllm.v1.attention.backends.registry.register_backend``), in every
process vLLM starts.  Nothing selects it unless asked: ``vllm serve MODEL --attention-backend CUSTOM``,
``LLM(..., attention_backend="CUSTOM")`` or ``attention_config={"backend": "CUSTOM"}``; vLLM's own choice stays
the default.  It serves any decoder ``Attention`` layer, ATOM's model classes' and vLLM's own alike.

Per step: ``do_kv_cache_update`` writes the step's K/V with ``atom_kernels.reshape_and_cache``, ``forward`` attends
with ``atom_kernels.paged_attention`` over vLLM's block table, ``seq_lens`` and ``query_start_loc`` (decode and
chunked prefill in one call; Triton on a GPU, the torch reference on the CPU).

What it serves is declared through vLLM's own capability hooks, which vLLM's selector checks before building a
layer (a selected backend that fails them stops start-up with vLLM's ``Selected backend ... is not valid for this
configuration. Reason: [...]``): model dtypes fp16 / bf16 / fp32; KV cache ``auto`` / ``float16`` / ``bfloat16`` /
``fp8`` (= ``fp8_e4m3``, per-tensor scales); head sizes up to 256; any block size; GQA; sliding window; attention
sinks; logits soft-cap; CUDA graphs for every batch (``AttentionCGSupport.ALWAYS``: the op reads nothing on the
host and its grid depends on shapes only).  Refused there: MLA, sparse attention, encoder / encoder-only /
cross attention, non-causal attention, multimodal prefix-LM attention, per-head quantization scales, fp8_e5m2 and
other KV formats, KV connectors, decode / prefill context parallelism, batch invariance.  What vLLM's selector
does not check (ALiBi, extra per-model arguments) is refused when the layer is built, in one line naming it.

The KV cache of a layer is vLLM's logical ``[num_blocks, kv_heads, block_size, 2 * head_size]`` (K then V in the
content dim) stored token-major (``[num_blocks, block_size, kv_heads, 2 * head_size]`` in memory); the ops get K
and V as ``[num_blocks, block_size, kv_heads, head_size]`` strided views of it, their declared layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadata,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)

from atom_core.errors import AtomError
from atom_kernels import paged_attention, reshape_and_cache
from atom_kernels.ops.paged_attention import warm_up
from atom_vllm import compat

NAME = compat.CUSTOM_ATTENTION_BACKEND  # what --attention-backend takes, and what get_name() must return
MAX_HEAD_SIZE = 256  # the Triton kernel's limit (atom_kernels.ops.paged_attention.triton.MAX_HEAD_DIM)
FP8_CACHE_DTYPES = ("fp8", "fp8_e4m3")


class UnsupportedByAtomAttention(AtomError, ValueError):
    pass


def _refuse(what: str) -> UnsupportedByAtomAttention:
    return UnsupportedByAtomAttention(f"ATOM's attention backend (--attention-backend {NAME}) does not support {what}; "
                                      "leave --attention-backend unset for vLLM's own choice")


class AtomAttentionBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16", *FP8_CACHE_DTYPES]
    forward_includes_kv_cache_update: bool = False  # vLLM calls do_kv_cache_update first

    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_impl_cls() -> type[AtomAttentionImpl]:
        return AtomAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[AtomAttentionMetadataBuilder]:
        return AtomAttentionMetadataBuilder

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return 0 < head_size <= MAX_HEAD_SIZE

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_kv_connector(cls) -> bool:
        return False  # no KV connector has been run against this layout

    # The cache shape: vLLM up to 0.27 asks the backend (get_kv_cache_shape + get_kv_cache_stride_order); from 0.32
    # vLLM owns the logical shape, the same one, and asks only which physical layouts the backend reads.
    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        return (num_blocks, num_kv_heads, block_size, 2 * head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
        # token-major: [num_blocks, block_size, kv_heads, 2 * head_size] ([num_blocks, layers, ...] with layers)
        return (1, 0, 3, 2, 4) if include_num_layers_dimension else (0, 2, 1, 3)

    @classmethod
    def supported_kv_cache_layouts(cls):
        return compat.token_major_kv_cache_layouts()


@dataclass
class AtomAttentionMetadata(AttentionMetadata):
    """One step's view of the batch, as the ops take it (vLLM's tensors, not copied)."""

    num_actual_tokens: int
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32, context lengths with this step's tokens
    block_table: torch.Tensor  # [B, max_blocks] int32
    slot_mapping: torch.Tensor  # [num_actual_tokens] int64


class AtomAttentionMetadataBuilder(AttentionMetadataBuilder[AtomAttentionMetadata]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS

    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> AtomAttentionMetadata:
        m = common_attn_metadata
        if m.causal is False:
            raise _refuse("non-causal attention")
        return AtomAttentionMetadata(num_actual_tokens=m.num_actual_tokens, query_start_loc=m.query_start_loc,
                                     seq_lens=m.seq_lens, block_table=m.block_table_tensor, slot_mapping=m.slot_mapping)


class AtomAttentionImpl(AttentionImpl[AtomAttentionMetadata]):
    supports_dcp = False  # the op returns no log-sum-exp for vLLM to merge across ranks
    supports_pcp = False

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 alibi_slopes: list[float] | None = None, sliding_window: int | None = None,
                 kv_cache_dtype: str = "auto", logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name: str | None = None,
                 sinks: torch.Tensor | None = None, **extra) -> None:
        if alibi_slopes is not None:
            raise _refuse("ALiBi position biases")
        if attn_type != AttentionType.DECODER:
            raise _refuse(f"{attn_type} attention (decoder self-attention only)")
        if kv_cache_dtype not in AtomAttentionBackend.supported_kv_cache_dtypes:
            raise _refuse(f"KV cache dtype {kv_cache_dtype}")
        if extra:
            raise _refuse(f"the layer arguments {', '.join(sorted(extra))}")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.soft_cap = logits_soft_cap if logits_soft_cap else None  # vLLM passes 0 / None for "none"
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.sinks = sinks
        self.fp8 = kv_cache_dtype in FP8_CACHE_DTYPES
        self.warm = False  # the op's kernel variants compiled (its first eager step, before any request)

    def _caches(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V as ``[num_blocks, block_size, kv_heads, head_size]`` views of vLLM's logical
        ``[num_blocks, kv_heads, block_size, 2 * head_size]`` layer cache (an fp8 cache allocated as bytes is
        viewed as the platform's fp8 e4m3)."""
        if self.fp8 and kv_cache.dtype == torch.uint8:
            kv_cache = kv_cache.view(compat.fp8_dtype())
        d = self.head_size
        return kv_cache[..., :d].transpose(1, 2), kv_cache[..., d:].transpose(1, 2)

    def _scales(self, layer) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return (layer._k_scale, layer._v_scale) if self.fp8 else (None, None)

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        # key / value may carry padding rows past the step's tokens; slot_mapping has one entry per real token
        n = slot_mapping.shape[0]
        k_cache, v_cache = self._caches(kv_cache)
        k_scale, v_scale = self._scales(layer)
        reshape_and_cache(key[:n], value[:n], k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AtomAttentionMetadata | None, output: torch.Tensor | None = None,
                output_scale: torch.Tensor | None = None, output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise _refuse("fused output quantization")
        if attn_metadata is None:  # vLLM's memory-profiling run: no cache bound, nothing to attend
            return output.fill_(0)
        k_cache, v_cache = self._caches(kv_cache)
        k_scale, v_scale = self._scales(layer)
        m = attn_metadata
        options = dict(sliding_window=self.sliding_window, sinks=self.sinks, soft_cap=self.soft_cap, k_scale=k_scale,
                       v_scale=v_scale)
        if not self.warm:
            self.warm = warm_up(query, k_cache, v_cache, self.scale, **options)
        out = paged_attention(query, k_cache, v_cache, m.block_table, m.seq_lens, m.query_start_loc, self.scale,
                              **options)
        output.copy_(out.view_as(output))
        return output
