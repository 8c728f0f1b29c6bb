"""The host interface: what a model asks of the serving framework it runs in.

A model is written once and built against a *host*: ATOM's native runner, vLLM or SGLang.  Every
layer that needs something from the framework gets it from the host at construction; per-step
metadata (positions, sequence lengths, KV slots) reaches the host's modules through the host's own
context, never through extra arguments threaded through the model's ``forward``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class TensorParallel(Protocol):
    """The tensor-parallel group a model's layers shard over."""

    rank: int
    world_size: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor: ...

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor: ...


@dataclass(frozen=True)
class SingleRank:
    """No tensor parallelism."""

    rank: int = 0
    world_size: int = 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return x


@dataclass(frozen=True)
class TorchDistributedTP:
    """Tensor parallelism over a ``torch.distributed`` process group (the native host's TP)."""

    group: Any = None

    @property
    def rank(self) -> int:
        return torch.distributed.get_rank(self.group)

    @property
    def world_size(self) -> int:
        return torch.distributed.get_world_size(self.group)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        torch.distributed.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        torch.distributed.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)


@runtime_checkable
class Host(Protocol):
    """What every host provides.  See DESIGN.md, "The host interface"."""

    tp: TensorParallel
    quant: Any  # atom_core.quant.QuantConfig | None
    attention_sinks_dtype: torch.dtype  # the dtype this host's attention takes ``sinks`` in (the models store them so)

    def attention(
        self,
        prefix: str,
        layer_id: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        *,
        sliding_window: int | None = None,
        sinks: torch.Tensor | None = None,
        mla: LatentAttentionSpec | None = None,
        compressed: CompressedAttentionSpec | None = None,
    ) -> nn.Module:
        """A module with ``forward(q, k, v) -> out`` over this step's tokens.

        ``q``: ``[T, num_heads * head_dim]``, ``k``/``v``: ``[T, num_kv_heads * head_dim]`` (this rank's
        heads); ``out``: ``[T, num_heads * head_dim]``.  ``sliding_window`` follows transformers: key j is
        visible to query i when ``0 <= i - j < sliding_window``.

        With ``mla`` (a :class:`LatentAttentionSpec`) the layer is multi-head latent attention: ``head_dim``
        is the query/key head size ``qk_nope_head_dim + qk_rope_head_dim``, ``num_kv_heads`` is 1 and the
        module's ``forward(q, kv_c, k_pe)`` takes ``q`` ``[T, num_heads * head_dim]`` (rotary already applied
        to each head's last ``qk_rope_head_dim``), the normalised latent ``kv_c`` ``[T, kv_lora_rank]`` and the
        shared rotated key ``k_pe`` ``[T, qk_rope_head_dim]``; ``out`` is ``[T, num_heads * v_head_dim]``.
        The host caches ``kv_c | k_pe`` per token and owns how ``mla.kv_b_proj`` is applied (expanded
        keys/values, or absorbed into the query and output).

        With ``compressed`` (a :class:`CompressedAttentionSpec`, DeepSeek-V4) the layer has one key head that is
        also its value, ``sliding_window`` and ``sinks`` are given, and ``forward(q, kv, compress, index)`` takes
        ``q`` ``[T, num_heads, head_dim]``, ``kv`` ``[T, head_dim]`` and the compressor's (and indexer's) per-token
        projections; see the spec.
        """
        ...

    def linear_attention_state(
        self,
        prefix: str,
        layer_id: int,
        conv_shape: tuple[int, ...],
        ssm_shape: tuple[int, ...],
        dtype: torch.dtype,
        mix: Callable[..., torch.Tensor],
    ) -> LinearAttentionState:
        """The framework's per-sequence state of one linear-attention (Gated DeltaNet) layer.

        Called once per layer at construction.  ``conv_shape = (conv_dim, kernel_width - 1)`` and
        ``ssm_shape = (num_v_heads, head_k_dim, head_v_dim)`` are this rank's per-sequence shapes, logical
        (K-major); ``dtype`` is the model's activation dtype (the conv state's).  The host allocates one
        conv and one SSM state per sequence slot (the SSM state in fp32 or bf16, its choice) and returns a
        :class:`LinearAttentionState`; in every forward the layer calls its ``run(*inputs)``, which is
        ``mix(*inputs, step)`` for this step's :class:`LinearAttentionStep`: the part of the layer that reads
        and writes the state, returning ``[T, num_v_heads, head_v_dim]`` in the inputs' dtype.
        """
        ...


@dataclass(frozen=True, eq=False)
class LatentAttentionSpec:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2).  Per token the cache holds the latent
    ``kv_c`` (``kv_lora_rank``) and one rotated key ``k_pe`` (``qk_rope_head_dim``) shared by all heads;
    ``kv_b_proj`` (``kv_lora_rank -> heads * (qk_nope_head_dim + v_head_dim)``, this rank's heads, rows of
    each head: its no-rope key, then its value) expands the latent:

        k_h = [kv_c W_UK,hᵀ | k_pe]      v_h = kv_c W_UV,hᵀ
        score = q_h · k_h · scale  =  (q_nope,h W_UK,h) · kv_c + q_pe,h · k_pe      (the absorbed form)
    """

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    kv_b_proj: nn.Module
    sparse: SparseSelectionSpec | None = None  # DeepSeek sparse attention: attend only to the indexer's top-k


@dataclass(frozen=True)
class SparseSelectionSpec:
    """DeepSeek sparse attention (DeepSeek-V3.2, GLM-5) over latent attention.  A layer with its own indexer
    caches one indexer key (``index_head_dim``) per token beside its latent and is called with the step's indexer
    queries ``[T, index_heads, index_head_dim]``, keys ``[T, index_head_dim]`` and head weights ``[T, index_heads]``;
    each query keeps the ``topk`` cached tokens of largest ``Σ_h w_h · relu(index_scale · q_h · k)`` (itself
    included, never a later token) and attends to those alone.  A layer without one (``own_indexer`` False, GLM-5's
    shared layers) reuses the selection of the last layer before it that has one."""

    index_head_dim: int
    topk: int
    index_scale: float
    own_indexer: bool = True


@dataclass(frozen=True, eq=False)
class CompressedAttentionSpec:
    """DeepSeek-V4's compressed attention (CSA and HCA layers).  Each query attends, in one softmax with the
    layer's sinks, to the shared ``kv`` of the last ``sliding_window`` tokens and to *compressed entries*: one per
    ``compress_rate`` tokens, pooled from that window's compressor projections once its last token is known.

    ``forward(q, kv, compress=(kv_raw, gate_raw), index=None | (index_q, kv_raw, gate_raw, weights))``:
    ``compress`` holds the step's compressor projections ``[T, raw_dim]`` each; the host keeps them per token and,
    at a window's last token (position ``p`` with ``(p + 1) % compress_rate == 0``), calls
    ``compressor.pool(kv [N, L, raw_dim], gate [N, L, raw_dim], valid [N, L], start [N]) -> [N, head_dim]`` over
    the ``L`` tokens ending at ``p`` (``L = 2 · compress_rate`` with ``overlap``, else ``compress_rate``; ``valid``
    False before position 0; ``start = p - compress_rate + 1``, the window's first position).

    Without an ``indexer`` (HCA) a query sees every entry whose window it has passed; with one (CSA) only the
    ``indexer.topk`` of them that score highest, ``Σ_h weights_h · relu(indexer.scale · index_q_h · k)`` over the
    index keys the indexer's own compressor pools the same way (:class:`CompressedIndexerSpec`)."""

    compress_rate: int
    overlap: bool
    raw_dim: int
    compressor: nn.Module
    indexer: CompressedIndexerSpec | None = None


@dataclass(frozen=True, eq=False)
class CompressedIndexerSpec:
    """The lightning indexer of a CSA layer: ``head_dim``-wide index keys pooled by ``compressor`` from its
    ``raw_dim``-wide projections (two series, as the layer's), ``topk`` entries kept per query."""

    head_dim: int
    topk: int
    scale: float
    raw_dim: int
    compressor: nn.Module


# --------------------------------------------------------------------------- linear-attention state
@dataclass
class LinearAttentionStep:
    """One forward step's view of a linear-attention layer's per-sequence state.

    **Token order.** The step's ``T`` tokens are: first ``num_decode_tokens`` decode tokens — each decode
    sequence n contributes ``Tq = num_decode_tokens // len(decode_slots)`` consecutive tokens (1 for
    plain decode, more for speculative decode), or, with ``decode_cu_seqlens`` ``[num_decodes + 1]`` (int32,
    from 0), the tokens ``[decode_cu_seqlens[n], decode_cu_seqlens[n + 1])`` (a speculative step whose
    sequences bring different numbers of draft tokens) — then ``num_prefill_tokens`` tokens of packed prefill
    sequences, then padding up to T (outputs zero).  Either part may be empty.  A host whose batch
    interleaves them gives ``token_order`` ``[num_decode_tokens + num_prefill_tokens]``: the batch rows in the
    order above (the layer gathers them, and scatters its outputs back; other rows output zero).

    **State pools** (the host's tensors, updated in place by the layer's kernels):

    * ``conv_state``: ``[num_slots, conv_dim, kernel_width - 1]`` (any strides), oldest input first; wider
      (``kernel_width - 2 + Tq_max``) for a host's speculative rolling buffer (below), whose plain steps use
      its first ``kernel_width - 1`` columns;
    * ``ssm_state``: ``[num_slots, HV, K, V]`` when ``ssm_layout == "k_major"`` or ``[num_slots, HV, V, K]``
      when ``"v_major"`` (see :mod:`atom_kernels.gdn`).

    **Decode part.** ``decode_slots`` ``[num_decodes]``: each decode sequence's slot (conv and SSM state,
    read and written back in place; negative = padding: zero outputs, nothing touched).  For speculative
    decode a host that rolls back rejected tokens may add ``decode_ssm_slots`` ``[num_decodes, Tq]``: the
    SSM state after token t is written to ``decode_ssm_slots[n, t]`` and the initial one is read from
    ``decode_ssm_slots[n, num_accepted_tokens[n] - 1]`` (index 0 without ``num_accepted_tokens``).  The
    conv state at ``decode_slots`` is shifted in place, or, with ``num_accepted_tokens``, is the rolling
    buffer of :func:`atom_kernels.causal_conv1d_update` (the step's window starts at column
    ``num_accepted_tokens[n] - 1``; vLLM's layout).

    **Prefill part.** ``prefill_cu_seqlens`` ``[num_prefills + 1]`` (int32, offsets into the prefill
    tokens, starting at 0), ``prefill_slots`` ``[num_prefills]`` (negative = padding) and
    ``prefill_has_initial_state`` ``[num_prefills]`` bool: whether the sequence continues from the state
    in its slot (a chunk of a longer prompt, a cached prefix) or starts from zero.  Every prefill
    sequence's final states are written to its slot.

    **A step without tokens** (both parts empty) is a host's warm-up or profiling run: the layer outputs
    zeros, touches no state, and the first time warms its kernels up on scratch pools laid out as
    ``conv_state`` / ``ssm_state``, which may have no slots yet (a host that binds its pools later gives empty
    ``[0, ...]`` tensors of the pools' layout; other tensors skip the warm-up).

    Index tensors live on the model's device.  Nothing here needs a host sync, so a host may build the
    step for CUDA-graph capture (a decode-only batch padded with negative slots).
    """

    conv_state: torch.Tensor
    ssm_state: torch.Tensor
    ssm_layout: str = "k_major"
    num_decode_tokens: int = 0
    decode_slots: torch.Tensor | None = None
    decode_ssm_slots: torch.Tensor | None = None
    num_accepted_tokens: torch.Tensor | None = None
    decode_cu_seqlens: torch.Tensor | None = None
    num_prefill_tokens: int = 0
    prefill_cu_seqlens: torch.Tensor | None = None
    prefill_slots: torch.Tensor | None = None
    prefill_has_initial_state: torch.Tensor | None = None
    token_order: torch.Tensor | None = None


@runtime_checkable
class LinearAttentionState(Protocol):
    """What :meth:`Host.linear_attention_state` returns for one layer."""

    ssm_layout: str  # "k_major" or "v_major": the layout of this host's SSM state pools

    def step(self) -> LinearAttentionStep:
        """This forward step's pools and metadata (read from the host's own per-step context)."""
        ...

    def run(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The layer's ``mix(*inputs, self.step())``.  A host that traces the model's forward runs it as one
        opaque op, since the step is read in Python from the host's per-step context (vLLM's torch.compile: a
        graph split point, as its own GDN layers' core op is)."""
        ...
