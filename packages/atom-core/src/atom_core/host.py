"""The host interface: what a model asks of the serving framework it runs in.

A model is written once and built against a *host*: ATOM's native runner, vLLM or SGLang.  Every
layer that needs something from the framework gets it from the host at construction; per-step
metadata (positions, sequence lengths, KV slots) reaches the host's modules through the host's own
context, never through extra arguments threaded through the model's ``forward``.
"""

from __future__ import annotations

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
        mla: Any = None,
    ) -> nn.Module:
        """A module with ``forward(q, k, v) -> out`` over this step's tokens.

        ``q``: ``[T, num_heads * head_dim]``, ``k``/``v``: ``[T, num_kv_heads * head_dim]`` (this rank's
        heads); ``out``: ``[T, num_heads * head_dim]``.  ``sliding_window`` follows transformers: key j is
        visible to query i when ``0 <= i - j < sliding_window``.
        """
        ...

    def linear_attention_state(
        self,
        prefix: str,
        layer_id: int,
        conv_shape: tuple[int, ...],
        ssm_shape: tuple[int, ...],
        dtype: torch.dtype,
    ) -> Any:
        """Access to the framework's per-sequence conv/SSM state of one linear-attention layer."""
        ...
