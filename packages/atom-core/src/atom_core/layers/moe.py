"""Mixture-of-experts layers: the router, the routed experts (one fused kernel over stacked weights)
and the sparse MoE block that adds an optional (sigmoid-gated) shared expert.

    weights, ids = topk_routing(x Wᵣᵀ (+ bᵣ))                               Router
    y = Σ_j weights_j · W2[e_j] (silu(W1[e_j] x) ⊙ W3[e_j] x)             FusedMoE (+ all-reduce)
        (optionally with expert biases and gpt-oss' clamped SwiGLU, see ``atom_kernels.fused_moe``)
    y += σ(x wₛᵀ) · shared_expert(x)                                        SparseMoeBlock

Parallelism, from the host: under tensor parallelism each rank holds every expert's slice of the
intermediate dim (``I / world`` columns of gate/up, rows of down) and the partial outputs are
all-reduced.  When the host sets ``expert_parallel`` (a true attribute), the experts are split over
the same ranks instead (rank r holds a contiguous block, the intermediate dim whole): an expert map
sends every other expert's tokens nowhere, and the same all-reduce sums the ranks' contributions.

Weights are created by a :class:`MoEMethod` (``host.quant.moe_method(layer, prefix)`` when the
quantization config has one, else :class:`UnquantizedMoEMethod`), so a quantization scheme adds its
expert parameters (scales, packed codes) and its kernel call without touching this file.  Every
expert parameter is stacked ``[local experts, ...]`` and loads through :meth:`FusedMoE.weight_loader`
from either checkpoint layout (see :mod:`atom_core.loader.experts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.errors import UnsupportedConfigError
from atom_core.host import Host
from atom_core.layers.linear import ReplicatedLinear
from atom_core.layers.params import copy_checked, divide, make_param
from atom_kernels import fused_moe, topk_routing
from atom_kernels.ops.fused_moe import ACTIVATIONS

# projection -> (parameter group, position of its slice within the group's intermediate dim)
PROJECTIONS: dict[str, tuple[str, int]] = {"gate": ("w13", 0), "up": ("w13", 1), "down": ("w2", 0)}
GROUP_PROJECTIONS: dict[str, tuple[str, ...]] = {"w13": ("gate", "up"), "w2": ("down",)}
# the dim of a group's parameter (expert dim 0 included) that runs along the intermediate features
INTER_DIM: dict[str, int] = {"w13": 1, "w2": 2}


@dataclass(frozen=True)
class RouterConfig:
    """How a family routes (see :func:`atom_kernels.topk_routing`).

    ``fp32_logits``: the router GEMM runs in fp32 (DeepSeek-V3, GLM-4.5); ``weights_in_input_dtype``:
    the routing weights are rounded to the activation dtype (transformers' Qwen MoE routers do)."""

    num_experts: int
    top_k: int
    scoring: str = "softmax"
    renormalize: bool = True
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    correction_bias: bool = False
    fp32_logits: bool = False
    weights_in_input_dtype: bool = False
    bias: bool = False  # the router GEMM has a bias (gpt-oss)


class Router(nn.Module):
    """Replicated router: ``logits = x Wᵀ`` (W ``[E, H]``), then top-k routing."""

    def __init__(self, hidden_size: int, config: RouterConfig):
        super().__init__()
        self.config = config
        self.weight = make_param((config.num_experts, hidden_size), torch.get_default_dtype())
        self.bias = make_param((config.num_experts,), torch.get_default_dtype()) if config.bias else None
        if config.correction_bias:
            self.e_score_correction_bias = make_param((config.num_experts,), torch.float32)
        else:
            self.e_score_correction_bias = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        if cfg.fp32_logits:
            logits = F.linear(x.float(), self.weight.float(), None if self.bias is None else self.bias.float())
        else:
            logits = F.linear(x, self.weight, self.bias)
        weights, ids = topk_routing(
            logits, cfg.top_k, scoring=cfg.scoring, renormalize=cfg.renormalize,
            correction_bias=self.e_score_correction_bias, n_group=cfg.n_group, topk_group=cfg.topk_group,
            routed_scaling_factor=cfg.routed_scaling_factor,
        )
        return (weights.to(x.dtype) if cfg.weights_in_input_dtype else weights), ids

    def extra_repr(self) -> str:
        return f"{self.config}"


class MoEMethod:
    """How a :class:`FusedMoE` stores and applies its expert weights."""

    def create_weights(self, layer: FusedMoE, params_dtype: torch.dtype) -> None:
        raise NotImplementedError

    def apply(self, layer: FusedMoE, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def process_weights_after_loading(self, layer: FusedMoE) -> None:
        """Convert on-disk layouts into the kernel's (after every tensor is loaded)."""


class UnquantizedMoEMethod(MoEMethod):
    def create_weights(self, layer: FusedMoE, params_dtype: torch.dtype) -> None:
        experts, inter, hidden = layer.num_local_experts, layer.inter_partition, layer.hidden_size
        layer.w13_weight = layer.expert_param((experts, 2 * inter, hidden), params_dtype, "w13")
        layer.w2_weight = layer.expert_param((experts, hidden, inter), params_dtype, "w2")

    def apply(self, layer: FusedMoE, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        return fused_moe(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids, expert_map=layer.expert_map,
                         **layer.kernel_options())


def expert_partition(num_experts: int, rank: int, world: int) -> tuple[int, int]:
    """(first global expert, count) of ``rank``'s contiguous block; the first ``E % world`` ranks hold one more."""
    base, extra = divmod(num_experts, world)
    return rank * base + min(rank, extra), base + (rank < extra)


class FusedMoE(nn.Module):
    """The routed experts of one layer.  ``forward(x [T, H], topk_weights, topk_ids) -> [T, H]``
    (all-reduced over the host's tensor-parallel group unless ``reduce_results`` is False)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *, host: Host, prefix: str = "",
                 reduce_results: bool = True, params_dtype: torch.dtype | None = None, activation: str = "silu",
                 bias: bool = False, swiglu_limit: float | None = None):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise UnsupportedConfigError(f"{prefix}: expert activation {activation!r} is not supported ({', '.join(ACTIVATIONS)})")
        self.prefix = prefix
        self.activation = activation
        self.swiglu_limit = swiglu_limit  # silu's gate and up clamped to it first (DeepSeek-V4); None: no clamp
        self.tp = host.tp
        self.reduce_results = reduce_results
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        world, rank = self.tp.world_size, self.tp.rank
        self.expert_parallel = bool(getattr(host, "expert_parallel", False)) and world > 1
        if self.expert_parallel:
            if num_experts < world:
                raise UnsupportedConfigError(f"{prefix}: {num_experts} experts cannot be split over {world} ranks")
            self.first_expert, self.num_local_experts = expert_partition(num_experts, rank, world)
            self.inter_partition, self.inter_rank = intermediate_size, 0
            expert_map = torch.full((num_experts,), -1, dtype=torch.int32)
            expert_map[self.first_expert : self.first_expert + self.num_local_experts] = torch.arange(
                self.num_local_experts, dtype=torch.int32
            )
        else:
            self.first_expert, self.num_local_experts = 0, num_experts
            self.inter_partition = divide(intermediate_size, world, f"{prefix} expert intermediate size")
            self.inter_rank = rank
            expert_map = None
        self.register_buffer("expert_map", expert_map, persistent=False)
        method = getattr(host.quant, "moe_method", None) if host.quant is not None else None
        self.quant_method: MoEMethod = (method(self, prefix) if method is not None else None) or UnquantizedMoEMethod()
        self.quant_method.create_weights(self, params_dtype or torch.get_default_dtype())
        self.w13_bias = self.w2_bias = None
        if bias:  # w13: gate then up biases of this rank's intermediate slice; w2: whole (added by one TP rank)
            dtype = params_dtype or torch.get_default_dtype()
            self.w13_bias = self.expert_param((self.num_local_experts, 2 * self.inter_partition), dtype, "w13")
            self.w2_bias = self.expert_param((self.num_local_experts, hidden_size), dtype, "w2", whole=True)

    def kernel_options(self) -> dict[str, Any]:
        """The activation, its clamp and the biases every MoE method passes to ``fused_moe``.  Under tensor
        parallelism the down bias is added by rank 0 only (the ranks' partial outputs are summed)."""
        w2_bias = self.w2_bias if (self.expert_parallel or self.tp.rank == 0) else None
        return {"activation": self.activation, "w13_bias": self.w13_bias, "w2_bias": w2_bias,
                "swiglu_limit": self.swiglu_limit}

    # ----------------------------------------------------------------------------------- params
    def expert_param(self, shape: tuple[int, ...], dtype: torch.dtype, group: str, *, inter_divisor: int = 1,
                     per_shard: bool = False, whole: bool = False) -> nn.Parameter:
        """A stacked expert parameter of ``group`` ("w13" or "w2") that this layer's loader fills.

        ``inter_divisor``: intermediate features per element along the group's intermediate dim (block
        scales); ``per_shard``: one value per expert and projection (per-tensor scales:
        ``[E, 2]`` for w13, ``[E]`` for w2); ``whole``: each expert's tensor has no intermediate dim and
        is copied whole (the down projection's bias)."""
        param = make_param(shape, dtype, weight_loader=self.weight_loader)
        param.moe_group = group
        param.whole = whole
        param.inter_divisor = inter_divisor
        param.per_shard = per_shard
        held = range(self.first_expert, self.first_expert + self.num_local_experts)
        param.shard_ids = tuple((p, e) for e in held for p in GROUP_PROJECTIONS[group])
        return param

    def local_expert(self, expert: int) -> int | None:
        """This layer's index of global expert ``expert``, or None when another rank holds it."""
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert} out of range (the layer has {self.num_experts})")
        local = expert - self.first_expert
        return local if 0 <= local < self.num_local_experts else None

    def _inter_span(self, param: nn.Parameter) -> tuple[int, int, int]:
        """(start, length, full length) of this rank's slice along a checkpoint tensor's intermediate dim."""
        div = param.inter_divisor
        full = -(-self.intermediate_size // div)
        if self.inter_partition == self.intermediate_size:
            return 0, full, full
        if self.inter_partition % div:
            raise ValueError(f"a tensor-parallel slice of {self.inter_partition} features cuts blocks of {div}")
        size = self.inter_partition // div
        return self.inter_rank * size, size, full

    # ----------------------------------------------------------------------------------- loading
    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        """Per-expert tensors arrive with ``shard_id = (projection, global expert)``; stacked ones
        (``[E, ...]`` over all global experts) with None.  Experts held elsewhere are skipped."""
        if shard_id is None:
            self._load_stacked(param, loaded)
            return
        projection, expert = shard_id
        group, index = PROJECTIONS[projection]
        if group != param.moe_group:
            raise ValueError(f"a {projection} projection cannot load into a {param.moe_group} parameter")
        local = self.local_expert(expert)
        if local is None:
            return
        target = param.data[local]
        if param.whole:
            copy_checked(target, loaded)
            return
        if param.per_shard:
            copy_checked(target.reshape(-1)[index : index + 1], loaded.reshape(1) if loaded.dim() == 0 else loaded)
            return
        dim = INTER_DIM[group] - 1
        start, size, full = self._inter_span(param)
        if loaded.dim() != target.dim() or loaded.shape[dim] != full:
            raise ValueError(f"shape mismatch: checkpoint {tuple(loaded.shape)}, expected dim {dim} of size {full} "
                             f"for a {projection} projection of {tuple(target.shape)} per expert")
        if group == "w13":
            target = target.narrow(dim, index * size, size)
        copy_checked(target, loaded.narrow(dim, start, size))

    def _load_stacked(self, param: nn.Parameter, loaded: Any) -> None:
        if param.per_shard or param.inter_divisor != 1:
            raise ValueError("stacked expert checkpoints are supported for plain weights only")
        if loaded.dim() != param.dim() or loaded.shape[0] != self.num_experts:
            raise ValueError(f"shape mismatch: stacked checkpoint {tuple(loaded.shape)}, expected {self.num_experts} "
                             f"experts of {tuple(param.shape[1:])}")
        loaded = loaded.narrow(0, self.first_expert, self.num_local_experts)
        group = param.moe_group
        dim = INTER_DIM[group]
        start, size, full = self._inter_span(param)
        for index, _ in enumerate(GROUP_PROJECTIONS[group]):
            target = param.data.narrow(dim, index * size, size)
            copy_checked(target, loaded.narrow(dim, index * full + start, size))

    # ----------------------------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        out = self.quant_method.apply(self, x, topk_weights, topk_ids)
        if self.reduce_results and self.tp.world_size > 1:
            out = self.tp.all_reduce(out)
        return out

    def extra_repr(self) -> str:
        return (f"experts={self.num_local_experts}/{self.num_experts} (from {self.first_expert}), hidden={self.hidden_size}, "
                f"inter={self.inter_partition}/{self.intermediate_size}, ep={self.expert_parallel}")


class SparseMoeBlock(nn.Module):
    """Router + routed experts, plus an optional shared expert (an MLP every token takes), optionally
    scaled by ``sigmoid(x wₛᵀ)`` (Qwen2-MoE, Qwen3-Next).  Under tensor parallelism the block all-reduces
    once: the routed experts' and the shared expert's partial sums (its ``down_proj`` row-parallel) add up
    on each rank first."""

    def __init__(self, hidden_size: int, router: RouterConfig, moe_intermediate_size: int, *, host: Host, prefix: str,
                 shared_expert: nn.Module | None = None, shared_expert_gate: bool = False):
        super().__init__()
        self.tp = host.tp
        self.gate = Router(hidden_size, router)
        self.experts = FusedMoE(router.num_experts, hidden_size, moe_intermediate_size, host=host, prefix=f"{prefix}.experts",
                                reduce_results=False)
        if shared_expert is not None:
            shared_expert.down_proj.reduce_results = False  # summed with the experts' partial output below
        self.shared_expert = shared_expert
        self.shared_expert_gate = (
            ReplicatedLinear(hidden_size, 1, host=host, prefix=f"{prefix}.shared_expert_gate") if shared_expert_gate else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        topk_weights, topk_ids = self.gate(x)
        out = self.experts(x, topk_weights, topk_ids)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        if self.tp.world_size > 1:
            out = self.tp.all_reduce(out)
        return out
