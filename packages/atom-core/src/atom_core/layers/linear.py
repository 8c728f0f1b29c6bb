"""Linear layers split over tensor parallelism, with the weight's storage delegated to a
quantization method (unquantized by default).

``y = x Wᵀ + b``.  A *column*-parallel layer splits W's output features over the ranks (no
communication); a *row*-parallel layer splits the input features and all-reduces the partial sums.
Fused layers (q|k|v, gate|up) concatenate several logical *shards*, each loaded from its own
checkpoint tensor and split over the ranks on its own.  A layer given LoRA adapters (``lora``, set by
:func:`atom_core.lora.attach_adapters`) adds their per-token delta to its base output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from atom_core.host import Host
from atom_core.layers.params import copy_checked, divide, make_param
from atom_core.quant.base import UnquantizedLinearMethod


class LinearBase(nn.Module):
    """Holds the partition sizes and places checkpoint tensors; subclasses choose the split."""

    parallel: str = "replicated"  # "column" | "row" | "replicated"

    def __init__(
        self,
        input_size: int,
        output_sizes: Sequence[int],
        *,
        host: Host,
        prefix: str = "",
        bias: bool = False,
        shard_ids: Sequence[Any] | None = None,
        params_dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.prefix = prefix
        self.tp = host.tp
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.shard_ids = list(shard_ids) if shard_ids is not None else list(range(len(self.output_sizes)))
        world = self.tp.world_size
        self.out_partitions = [
            divide(s, world, f"{prefix} output shard") if self.parallel == "column" else s for s in self.output_sizes
        ]
        self.in_partition = divide(input_size, world, f"{prefix} input") if self.parallel == "row" else input_size
        params_dtype = params_dtype or torch.get_default_dtype()
        method = host.quant.linear_method(self, prefix) if host.quant is not None else None
        self.quant_method = method or UnquantizedLinearMethod()
        self.quant_method.create_weights(self, params_dtype)
        self.lora = None  # a LoraDelta once adapters are attached
        # False where a host reads the weight itself instead of calling forward (latent attention's kv_b_proj):
        # an adapter there would never apply, so atom_core.lora refuses it
        self.adapts_in_forward = True
        if bias:
            self.bias = make_param(
                (sum(self.out_partitions),), params_dtype, output_dim=0 if self.parallel != "row" else None
            )
        else:
            self.bias = None
        for param in self.parameters(recurse=False):
            if not hasattr(param, "weight_loader"):
                param.weight_loader = self.weight_loader
            param.shard_ids = tuple(self.shard_ids) if getattr(param, "output_dim", None) is not None else (None,)
            if getattr(param, "per_shard", False):
                param.shard_ids = tuple(self.shard_ids)

    # ----------------------------------------------------------------------------------- placement
    def shard_source(self, index: int) -> tuple[int, int, int]:
        """(start, size, full size) along the output features of shard ``index``'s checkpoint tensor."""
        size = self.out_partitions[index]
        start = self.tp.rank * size if self.parallel == "column" else 0
        return start, size, self.output_sizes[index]

    def input_source(self) -> tuple[int, int, int]:
        """(start, size, full size) along the input features this rank reads."""
        start = self.tp.rank * self.in_partition if self.parallel == "row" else 0
        return start, self.in_partition, self.input_size

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        """Place one checkpoint tensor (or a lazy slice of one) into ``param``; a tensor of the wrong
        shape is an error, never a silent partial copy."""
        out_dim = getattr(param, "output_dim", None)
        per_shard = getattr(param, "per_shard", False)
        if shard_id is None and len(self.shard_ids) > 1 and not per_shard and out_dim is not None:
            self._load_fused(param, loaded)
            return
        if shard_id is not None and shard_id not in self.shard_ids:
            raise ValueError(f"unknown shard {shard_id!r} (this layer has {self.shard_ids})")
        index = self.shard_ids.index(shard_id) if shard_id is not None else 0
        target = param.data
        if per_shard:
            copy_checked(target[index : index + 1], loaded.reshape(1) if loaded.dim() == 0 else loaded)
            return
        if out_dim is not None:
            q = param.out_divisor
            start, size, full = self.shard_source(index)
            _expect_dim(loaded, out_dim, full, q, "output")
            loaded = loaded.narrow(out_dim, *_span(start, size, full, q))
            dest = sum(self.out_partitions[:index])
            target = target.narrow(out_dim, *_span(dest, size, sum(self.out_partitions), q))
        in_dim = getattr(param, "input_dim", None)
        if in_dim is not None:
            q = param.in_divisor
            start, size, full = self.input_source()
            _expect_dim(loaded, in_dim, full, q, "input")
            loaded = loaded.narrow(in_dim, *_span(start, size, full, q))
        copy_checked(target, loaded)

    def _load_fused(self, param: nn.Parameter, loaded: Any) -> None:
        """A checkpoint that already stores the fused tensor: split it into the logical shards."""
        out_dim, q = param.output_dim, param.out_divisor
        sizes = self.checkpoint_shard_sizes()
        _expect_dim(loaded, out_dim, sum(sizes), q, "fused output")
        offset = 0
        for shard_id, full in zip(self.shard_ids, sizes):
            self.weight_loader(param, loaded.narrow(out_dim, *_span(offset, full, sum(sizes), q)), shard_id)
            offset += full

    def checkpoint_shard_sizes(self) -> list[int]:
        """Output features of each shard as a checkpoint stores them."""
        return list(self.output_sizes)

    def apply_base(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The base weight's product (any quantization method), plus the adapters' delta when there are some."""
        y = self.quant_method.apply(self, x, bias)
        return self.lora(x, y) if self.lora is not None else y

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_sizes}, parallel={self.parallel}, tp={self.tp.world_size}"


def _span(start: int, size: int, full: int, divisor: int) -> tuple[int, int]:
    """(start, length) in elements of a parameter dim whose elements each cover ``divisor`` features."""
    if start == 0 and size == full:
        return 0, -(-full // divisor)  # the whole dim: a partial last block is fine
    for value in (start, size):
        if value % divisor:
            raise ValueError(f"a split at {value} features cuts blocks of {divisor}")
    return start // divisor, size // divisor


def _expect_dim(loaded: Any, dim: int, features: int, divisor: int, what: str) -> None:
    expected = -(-features // divisor)
    if loaded.dim() <= dim or loaded.shape[dim] != expected:
        raise ValueError(
            f"shape mismatch: checkpoint {tuple(loaded.shape)} has {what} dim {dim} of size "
            f"{loaded.shape[dim] if loaded.dim() > dim else 'n/a'}, expected {expected}"
        )


class ReplicatedLinear(LinearBase):
    """Every rank holds the whole weight."""

    parallel = "replicated"

    def __init__(self, input_size: int, output_size: int, **kw: Any):
        super().__init__(input_size, [output_size], **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply_base(x, self.bias)


class ColumnParallelLinear(LinearBase):
    """Output features split over ranks; each rank returns its slice of y."""

    parallel = "column"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply_base(x, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input fused into one GEMM (gate|up)."""


class QKVParallelLinear(ColumnParallelLinear):
    """q|k|v fused; k/v heads are replicated over ranks when there are fewer of them than ranks."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, *, host: Host, **kw: Any):
        world = host.tp.world_size
        self.head_dim = head_dim
        self.total_kv_heads = num_kv_heads
        self.num_heads = divide(num_heads, world, "attention heads")
        if num_kv_heads >= world:
            self.num_kv_heads = divide(num_kv_heads, world, "kv heads")
            self.kv_replicas = 1
        else:
            self.num_kv_heads = 1
            self.kv_replicas = divide(world, num_kv_heads, "tensor-parallel size over kv heads")
        kv_full = self.num_kv_heads * world * head_dim  # as if there were `world` kv heads when replicated
        super().__init__(
            hidden_size, [num_heads * head_dim, kv_full, kv_full], host=host, shard_ids=["q", "k", "v"], **kw
        )
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim

    def shard_source(self, index: int) -> tuple[int, int, int]:
        if index == 0 or self.kv_replicas == 1:
            start, size, _ = super().shard_source(index)
            return start, size, self.checkpoint_shard_sizes()[index]
        return (self.tp.rank // self.kv_replicas) * self.head_dim, self.head_dim, self.total_kv_heads * self.head_dim

    def checkpoint_shard_sizes(self) -> list[int]:
        kv = self.total_kv_heads * self.head_dim
        return [self.output_sizes[0], kv, kv]

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)


class RowParallelLinear(LinearBase):
    """Input features split over ranks; partial products are all-reduced, then the bias added once.  With
    ``reduce_results`` False the caller sums the ranks' outputs (folding this reduction into its own): each
    rank returns its partial product, rank 0's with the bias."""

    parallel = "row"

    def __init__(self, input_size: int, output_size: int, *, reduce_results: bool = True, **kw: Any):
        super().__init__(input_size, [output_size], **kw)
        self.reduce_results = reduce_results

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.apply_base(x, None)  # a partial delta joins the partial sum
        if self.tp.world_size > 1:
            if not self.reduce_results:
                return y + self.bias if self.bias is not None and self.tp.rank == 0 else y
            y = self.tp.all_reduce(y)
        return y + self.bias if self.bias is not None else y
