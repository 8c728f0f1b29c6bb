"""The Gated DeltaNet layer (the linear-attention layers of Qwen3-Next), built against the host.

    q|k|v|z = in_proj_qkvz(x);  b|a = in_proj_ba(x)
    q|k|v   = silu(causal_conv1d(q|k|v))                   width 4, state: the last 3 inputs per sequence
    o       = gated_delta_rule(q, k, v, gating(a, b))      state: one K x V matrix per value head
    y       = out_proj(rmsnorm(o) · w · silu(z))           per value head

(see :mod:`atom_kernels.gdn` for the recurrence).  The per-sequence conv and SSM states live in the
host's pools; :meth:`GatedDeltaNet.forward` gets them, with the step's slots, from
``host.linear_attention_state(...).step()`` (see :class:`atom_core.host.LinearAttentionStep`): decode
tokens go through the fused recurrent kernels, prefill tokens through the chunked ones.

Tensor parallelism splits the key heads (and their value heads) over ranks.  Qwen3-Next's checkpoint
packs ``in_proj_qkvz`` and ``in_proj_ba`` per key-head group (for each key head: its q, k, then its
value heads' v, then z; resp. b then a); :class:`GroupedPackedLinear` undoes that packing at load time,
declared as data (:data:`QWEN3_NEXT_PACKING`), so every rank holds ``[q | k | v | z]`` of its own heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from atom_core.config import text_config
from atom_core.errors import CheckpointError
from atom_core.host import Host, LinearAttentionStep
from atom_core.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from atom_core.layers.params import copy_checked, divide, make_param, materialize
from atom_kernels import (
    causal_conv1d,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    rms_norm_gated,
)

# projection -> the pieces each key-head group holds in the checkpoint, in order, with their size in
# units of the layer's dims (K: key head dim, V: value head dim, G: value heads per key head).
QWEN3_NEXT_PACKING: dict[str, tuple[tuple[str, str], ...]] = {
    "in_proj_qkvz": (("q", "K"), ("k", "K"), ("v", "GV"), ("z", "GV")),
    "in_proj_ba": (("b", "G"), ("a", "G")),
}


@dataclass(frozen=True)
class GDNConfig:
    """What a Gated DeltaNet layer reads from its config."""

    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    rms_norm_eps: float

    @classmethod
    def from_hf(cls, hf_config: Any) -> GDNConfig:
        cfg = text_config(hf_config)
        return cls(
            hidden_size=cfg.hidden_size, num_k_heads=cfg.linear_num_key_heads, num_v_heads=cfg.linear_num_value_heads,
            head_k_dim=cfg.linear_key_head_dim, head_v_dim=cfg.linear_value_head_dim,
            conv_kernel=cfg.linear_conv_kernel_dim, rms_norm_eps=cfg.rms_norm_eps,
        )

    @property
    def groups(self) -> int:
        return self.num_v_heads // self.num_k_heads

    def unit(self, name: str) -> int:
        return {"K": self.head_k_dim, "V": self.head_v_dim, "G": self.groups, "GV": self.groups * self.head_v_dim}[name]

    def conv_dim(self, world: int = 1) -> int:
        return (2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim) // world


def gdn_state_shapes(cfg: GDNConfig, tp_world: int = 1) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """Per-sequence ``(conv_shape, ssm_shape)`` of one layer on one of ``tp_world`` ranks, logical
    (``ssm_shape`` K-major: ``(HV, K, V)``): what hosts size their state pools from."""
    heads = divide(cfg.num_v_heads, tp_world, "linear-attention value heads")
    return (cfg.conv_dim(tp_world), cfg.conv_kernel - 1), (heads, cfg.head_k_dim, cfg.head_v_dim)


class GroupedPackedLinear(MergedColumnParallelLinear):
    """A fused column-parallel projection whose checkpoint tensor interleaves its shards per group:
    for each of ``groups`` groups, that group's rows of every shard in shard order.  Loaded with shard
    None it is un-interleaved into the shards, each then split over the ranks like any fused shard."""

    def __init__(self, input_size: int, output_sizes: list[int], groups: int, *, shard_ids: list[str], **kw: Any):
        self.groups = groups
        super().__init__(input_size, output_sizes, shard_ids=shard_ids, **kw)

    def _load_fused(self, param: nn.Parameter, loaded: Any) -> None:
        dim, divisor = param.output_dim, param.out_divisor
        per_group = [divide(size, self.groups * divisor, f"{self.prefix} shard rows per group") for size in self.output_sizes]
        tensor = materialize(loaded)
        if tensor.shape[dim] != self.groups * sum(per_group):
            raise ValueError(f"shape mismatch: checkpoint {tuple(tensor.shape)} has {tensor.shape[dim]} rows along dim {dim}, "
                             f"expected {self.groups} groups of {sum(per_group)}")
        grouped = tensor.unflatten(dim, (self.groups, sum(per_group)))
        offset = 0
        for shard_id, rows in zip(self.shard_ids, per_group):
            self.weight_loader(param, grouped.narrow(dim + 1, offset, rows).flatten(dim, dim + 1), shard_id)
            offset += rows


class GDNConv1d(nn.Module):
    """Depthwise conv weight ``[conv_dim, 1, W]`` over q|k|v; each rank holds its heads' channels of each
    of the three parts."""

    def __init__(self, parts: list[int], width: int, *, world: int, rank: int):
        super().__init__()
        self.parts, self.world, self.rank = parts, world, rank
        self.weight = make_param((sum(p // world for p in parts), 1, width), torch.get_default_dtype(),
                                 weight_loader=self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        tensor = materialize(loaded)
        if tuple(tensor.shape) != (sum(self.parts), *param.shape[1:]):
            raise ValueError(f"shape mismatch: checkpoint {tuple(tensor.shape)}, expected {(sum(self.parts), *param.shape[1:])}")
        pieces, offset = [], 0
        for part in self.parts:
            local = part // self.world
            pieces.append(tensor.narrow(0, offset + self.rank * local, local))
            offset += part
        copy_checked(param.data, torch.cat(pieces))


def head_param(num_heads: int, world: int, rank: int) -> nn.Parameter:
    """A per-value-head vector (A_log, dt_bias) split over the ranks like the heads."""
    local = num_heads // world

    def load(param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        tensor = materialize(loaded)
        if tuple(tensor.shape) != (num_heads,):
            raise ValueError(f"shape mismatch: checkpoint {tuple(tensor.shape)}, expected {(num_heads,)}")
        copy_checked(param.data, tensor.narrow(0, rank * local, local))

    return make_param((local,), torch.get_default_dtype(), weight_loader=load)


class GatedRMSNorm(nn.Module):
    """``rmsnorm(x) · w · silu(z)`` over each head's last dim."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = make_param((dim,), torch.get_default_dtype())

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return rms_norm_gated(x, z, self.weight, self.eps)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: GDNConfig, layer_id: int, *, host: Host, prefix: str,
                 packing: dict[str, tuple[tuple[str, str], ...]] = QWEN3_NEXT_PACKING):
        super().__init__()
        world, rank = host.tp.world_size, host.tp.rank
        H, HV, K, V = cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
        if HV % H:
            raise CheckpointError(f"{prefix}: {HV} value heads are not a multiple of {H} key heads")
        self.num_k_heads = divide(H, world, f"{prefix} linear-attention key heads")
        self.num_v_heads = HV // world
        self.head_k_dim, self.head_v_dim = K, V
        self.conv_dim = cfg.conv_dim(world)

        def projection(name: str) -> GroupedPackedLinear:
            pieces = packing[name]
            sizes = [H * cfg.unit(unit) for _, unit in pieces]
            return GroupedPackedLinear(cfg.hidden_size, sizes, H, shard_ids=[shard for shard, _ in pieces], host=host,
                                       prefix=f"{prefix}.{name}")

        self.in_proj_qkvz = projection("in_proj_qkvz")
        self.in_proj_ba = projection("in_proj_ba")
        self.conv1d = GDNConv1d([H * K, H * K, HV * V], cfg.conv_kernel, world=world, rank=rank)
        self.A_log = head_param(HV, world, rank)
        self.dt_bias = head_param(HV, world, rank)
        self.norm = GatedRMSNorm(V, cfg.rms_norm_eps)
        self.out_proj = RowParallelLinear(HV * V, cfg.hidden_size, host=host, prefix=f"{prefix}.out_proj")
        conv_shape, ssm_shape = gdn_state_shapes(cfg, world)
        self.state = host.linear_attention_state(prefix, layer_id, conv_shape, ssm_shape, torch.get_default_dtype())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        Hl, HVl, K, V = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        step = self.state.step()
        qkvz = self.in_proj_qkvz(x)
        ba = self.in_proj_ba(x)
        z = qkvz[:, self.conv_dim :].view(T, HVl, V)
        b, a = ba[:, :HVl], ba[:, HVl:]
        mixed = self._conv(qkvz[:, : self.conv_dim], step)
        q = mixed[:, : Hl * K].view(T, Hl, K)
        k = mixed[:, Hl * K : 2 * Hl * K].view(T, Hl, K)
        v = mixed[:, 2 * Hl * K :].view(T, HVl, V)
        core = self._core(q, k, v, a, b, step)
        return self.out_proj(self.norm(core, z).view(T, HVl * V))

    # ----------------------------------------------------------------------------------- parts
    def _conv(self, x: torch.Tensor, step: LinearAttentionStep) -> torch.Tensor:
        weight = self.conv1d.weight.view(self.conv_dim, -1)
        return _by_phase(
            step, x.shape[0], (self.conv_dim,), x,
            decode=lambda rows: causal_conv1d_update(x[rows], weight, None, step.conv_state, step.decode_slots),
            prefill=lambda rows: causal_conv1d(x[rows], weight, None, step.conv_state, step.prefill_cu_seqlens,
                                               step.prefill_slots, step.prefill_has_initial_state),
        )

    def _core(self, q, k, v, a, b, step: LinearAttentionStep) -> torch.Tensor:
        shared = (self.A_log, self.dt_bias, step.ssm_state)

        def decode(rows):
            slots = step.decode_ssm_slots if step.decode_ssm_slots is not None else step.decode_slots
            return fused_recurrent_gated_delta_rule(q[rows], k[rows], v[rows], a[rows], b[rows], *shared, slots,
                                                    state_layout=step.ssm_layout,
                                                    num_accepted_tokens=step.num_accepted_tokens)

        def prefill(rows):
            return chunk_gated_delta_rule(q[rows], k[rows], v[rows], a[rows], b[rows], *shared, step.prefill_cu_seqlens,
                                          step.prefill_slots, step.prefill_has_initial_state, state_layout=step.ssm_layout)

        return _by_phase(step, q.shape[0], (self.num_v_heads, self.head_v_dim), v, decode=decode, prefill=prefill)


def _by_phase(step: LinearAttentionStep, num_tokens: int, row_shape: tuple[int, ...], like: torch.Tensor, *, decode, prefill):
    """Run ``decode`` over the step's decode tokens and ``prefill`` over its prefill tokens; padding rows are zero."""
    nd, npf = step.num_decode_tokens, step.num_prefill_tokens
    parts = []
    if nd:
        parts.append(decode(slice(0, nd)))
    if npf:
        parts.append(prefill(slice(nd, nd + npf)))
    if nd + npf < num_tokens or not parts:
        parts.append(like.new_zeros(num_tokens - nd - npf, *row_shape))
    return parts[0] if len(parts) == 1 else torch.cat(parts)
