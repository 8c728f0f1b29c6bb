"""The Gated DeltaNet layer (the linear-attention layers of Qwen3-Next), built against the host.

    q|k|v|z = in_proj_qkvz(x);  b|a = in_proj_ba(x)
    q|k|v   = silu(causal_conv1d(q|k|v))                   width 4, state: the last 3 inputs per sequence
    o       = gated_delta_rule(q, k, v, gating(a, b))      state: one K x V matrix per value head
    y       = out_proj(rmsnorm(o) · w · silu(z))           per value head

(see :mod:`atom_kernels.gdn` for the recurrence).  The per-sequence conv and SSM states live in the
host's pools.  The part of the layer that reads and writes them, the conv and the delta rule
(:meth:`GatedDeltaNet.mix`), runs through the host (``host.linear_attention_state(...).run``), which hands
it the step's slots (see :class:`atom_core.host.LinearAttentionStep`) and may run it as one opaque op of a
compiled graph; decode tokens go through the fused recurrent kernels, prefill tokens through the chunked ones.

Tensor parallelism splits the key heads (and their value heads) over ranks; every rank holds
``[q | k | v | z]`` and ``[b | a]`` of its own heads (:data:`PROJECTIONS`).  How the checkpoint stores
them is data (a :class:`PackedTensor` per checkpoint tensor), undone at load time by
:class:`GDNProjection`:

* Qwen3-Next (:data:`QWEN3_NEXT_CHECKPOINT`) packs ``in_proj_qkvz`` and ``in_proj_ba`` per key-head
  group (for each key head: its q, k, then its value heads' v, then z; resp. b then a);
* Qwen3.5 (:data:`QWEN3_5_CHECKPOINT`) stores ``in_proj_qkv`` (all q, all k, all v), ``in_proj_z``,
  ``in_proj_b`` and ``in_proj_a``; the weight mapper (:func:`packed_modules`) sends each to its fused
  projection with the checkpoint name as shard id.
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
from atom_kernels.gdn import warm_up_sequence_counts

# fused projection -> its shards in the order a rank holds them, with their size per key head in units of
# the layer's dims (K: key head dim, V: value head dim, G: value heads per key head).
PROJECTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "in_proj_qkvz": (("q", "K"), ("k", "K"), ("v", "GV"), ("z", "GV")),
    "in_proj_ba": (("b", "G"), ("a", "G")),
}


@dataclass(frozen=True)
class PackedTensor:
    """A checkpoint tensor of a GDN layer: the fused projection it loads into and the shards it holds, in
    order — ``grouped``: per key head, that head's rows of every shard in turn; else shard after shard."""

    projection: str
    shards: tuple[str, ...]
    grouped: bool = False


# checkpoint module name (under ``linear_attn``) -> what its tensor holds
QWEN3_NEXT_CHECKPOINT: dict[str, PackedTensor] = {
    "in_proj_qkvz": PackedTensor("in_proj_qkvz", ("q", "k", "v", "z"), grouped=True),
    "in_proj_ba": PackedTensor("in_proj_ba", ("b", "a"), grouped=True),
}
QWEN3_5_CHECKPOINT: dict[str, PackedTensor] = {
    "in_proj_qkv": PackedTensor("in_proj_qkvz", ("q", "k", "v")),
    "in_proj_z": PackedTensor("in_proj_qkvz", ("z",)),
    "in_proj_b": PackedTensor("in_proj_ba", ("b",)),
    "in_proj_a": PackedTensor("in_proj_ba", ("a",)),
}


def packed_modules(checkpoint: dict[str, PackedTensor]) -> dict[str, list[tuple[str, str]]]:
    """:class:`~atom_core.loader.WeightMapper` ``packed`` entries of a checkpoint layout: each tensor named
    other than its projection goes to that projection, with its own name as the shard id."""
    packed: dict[str, list[tuple[str, str]]] = {}
    for name, tensor in checkpoint.items():
        if name != tensor.projection:
            packed.setdefault(tensor.projection, []).append((name, name))
    return packed


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


class GDNProjection(MergedColumnParallelLinear):
    """A fused column-parallel projection (:data:`PROJECTIONS`) loaded from the checkpoint tensors
    ``sources`` describes: shard id (None for a tensor named like the projection) -> :class:`PackedTensor`.
    Each source is cut into its shards (un-interleaving the ``groups`` key-head groups of a grouped one),
    each shard then split over the ranks like any fused shard."""

    def __init__(self, input_size: int, output_sizes: list[int], groups: int, *, shard_ids: list[str],
                 sources: dict[str | None, PackedTensor], **kw: Any):
        self.groups = groups
        self.sources = sources
        super().__init__(input_size, output_sizes, shard_ids=shard_ids, **kw)
        held = sorted(s for source in sources.values() for s in source.shards)
        if held != sorted(self.shard_ids):
            raise CheckpointError(f"{self.prefix}: checkpoint tensors {sorted(map(str, sources))} hold shards {held}, "
                                  f"the projection has {self.shard_ids}")
        if None not in sources:  # the loader's coverage check counts the checkpoint tensors
            for param in self.parameters(recurse=False):
                if param.shard_ids != (None,):
                    param.shard_ids = tuple(sources)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        source = self.sources.get(shard_id)
        if source is None:  # one logical shard
            super().weight_loader(param, loaded, shard_id)
            return
        dim = getattr(param, "output_dim", None)
        if dim is None or getattr(param, "per_shard", False):  # not split along the output features
            for shard in source.shards:
                super().weight_loader(param, loaded, shard)
            return
        groups = self.groups if source.grouped else 1
        rows = [divide(self.output_sizes[self.shard_ids.index(s)], groups * param.out_divisor,
                       f"{self.prefix} shard {s} rows per group") for s in source.shards]
        if loaded.dim() <= dim or loaded.shape[dim] != groups * sum(rows):
            raise ValueError(f"shape mismatch: checkpoint {tuple(loaded.shape)} along dim {dim}, expected "
                             f"{groups} group(s) of {sum(rows)} rows ({', '.join(source.shards)})")
        offset = 0
        for shard, count in zip(source.shards, rows):
            pieces = [loaded.narrow(dim, g * sum(rows) + offset, count) for g in range(groups)]
            part = pieces[0] if groups == 1 else torch.cat([materialize(p) for p in pieces], dim)
            super().weight_loader(param, part, shard)
            offset += count


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
                 checkpoint: dict[str, PackedTensor] = QWEN3_NEXT_CHECKPOINT):
        super().__init__()
        world, rank = host.tp.world_size, host.tp.rank
        H, HV, K, V = cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
        if HV % H:
            raise CheckpointError(f"{prefix}: {HV} value heads are not a multiple of {H} key heads")
        self.num_k_heads = divide(H, world, f"{prefix} linear-attention key heads")
        self.num_v_heads = HV // world
        self.head_k_dim, self.head_v_dim = K, V
        self.conv_dim = cfg.conv_dim(world)

        def projection(name: str) -> GDNProjection:
            shards = PROJECTIONS[name]
            sources = {None if ckpt == name else ckpt: t for ckpt, t in checkpoint.items() if t.projection == name}
            return GDNProjection(cfg.hidden_size, [H * cfg.unit(unit) for _, unit in shards], H,
                                 shard_ids=[shard for shard, _ in shards], sources=sources, host=host,
                                 prefix=f"{prefix}.{name}")

        self.in_proj_qkvz = projection("in_proj_qkvz")
        self.in_proj_ba = projection("in_proj_ba")
        self.conv1d = GDNConv1d([H * K, H * K, HV * V], cfg.conv_kernel, world=world, rank=rank)
        self.A_log = head_param(HV, world, rank)
        self.dt_bias = head_param(HV, world, rank)
        self.norm = GatedRMSNorm(V, cfg.rms_norm_eps)
        self.out_proj = RowParallelLinear(HV * V, cfg.hidden_size, host=host, prefix=f"{prefix}.out_proj")
        conv_shape, ssm_shape = gdn_state_shapes(cfg, world)
        self.state = host.linear_attention_state(prefix, layer_id, conv_shape, ssm_shape, torch.get_default_dtype(),
                                                 self.mix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        qkvz = self.in_proj_qkvz(x)
        core = self.state.run(qkvz[:, : self.conv_dim], self.in_proj_ba(x))
        z = qkvz[:, self.conv_dim :].view(T, self.num_v_heads, self.head_v_dim)
        return self.out_proj(self.norm(core, z).view(T, self.num_v_heads * self.head_v_dim))

    def mix(self, qkv: torch.Tensor, ba: torch.Tensor, step: LinearAttentionStep) -> torch.Tensor:
        """The conv and the delta rule over the step's tokens: ``qkv`` ``[T, conv_dim]`` (before the conv) and
        ``ba`` ``[T, 2 * HV]`` in batch order -> ``[T, HV, V]``; reads and writes the step's states."""
        if step.token_order is None:
            return self._mix(qkv, ba, step)
        order = step.token_order
        out = self._mix(qkv.index_select(0, order), ba.index_select(0, order), step)
        return out.new_zeros(qkv.shape[0], *out.shape[1:]).index_copy_(0, order, out)

    def _mix(self, qkv: torch.Tensor, ba: torch.Tensor, step: LinearAttentionStep) -> torch.Tensor:
        T = qkv.shape[0]
        Hl, HVl, K, V = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        if not (step.num_decode_tokens or step.num_prefill_tokens):  # a host's warm-up, e.g. before states are bound
            self._warm_up(qkv, ba, step)
            return qkv.new_zeros(T, HVl, V)
        b, a = ba[:, :HVl], ba[:, HVl:]
        mixed = self._conv(qkv, step)
        q = mixed[:, : Hl * K].view(T, Hl, K)
        k = mixed[:, Hl * K : 2 * Hl * K].view(T, Hl, K)
        v = mixed[:, 2 * Hl * K :].view(T, HVl, V)
        return self._core(q, k, v, a, b, step)

    def _warm_up(self, qkv: torch.Tensor, ba: torch.Tensor, step: LinearAttentionStep) -> None:
        """Once per process and layer shape: one step of ``n`` decode and ``n`` prefill sequences for each ``n`` of
        :func:`~atom_kernels.gdn.warm_up_sequence_counts` (and one with speculative decodes where the conv pool is a
        rolling buffer), on scratch pools laid out as ``step``'s (which may have no rows yet) and inputs laid out as
        ``qkv`` / ``ba``, so the GDN kernels compile while the host warms up, not on a request.  Skipped when the
        pools' layout is unknown (not ``[slots, ...]`` tensors), where the kernels' torch references run, while
        tracing and inside CUDA-graph capture."""
        conv, ssm, device = step.conv_state, step.ssm_state, qkv.device
        if conv.dim() != 3 or ssm.dim() != 4 or torch.compiler.is_compiling():
            return
        if chunk_gated_delta_rule.plan(device.type)[0] == "reference":  # no compiled kernels to warm (CPU)
            return
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return
        key = (device, qkv.dtype, qkv.stride(), ba.stride(), step.ssm_layout,
               *((tuple(pool.shape[1:]), _stride_order(pool), pool.dtype) for pool in (conv, ssm)))
        if key in _WARMED:
            return
        _WARMED.add(key)
        conv_pool, ssm_pool = _scratch_like(conv, 2, device), _scratch_like(ssm, 2, device)
        gen = torch.Generator(device).manual_seed(0)
        width = self.conv1d.weight.view(self.conv_dim, -1).shape[1]
        # a conv pool wider than width - 1 is a host's speculative rolling buffer (width - 2 + Tq columns): its steps
        # bring up to Tq tokens per decode sequence, through the decode kernels' ragged, accepted-token variants
        speculative = conv.shape[2] - width + 2 if conv.shape[2] > width - 1 else 0
        for n in warm_up_sequence_counts(self.num_v_heads):
            slots = torch.arange(2 * n, device=device, dtype=torch.int32) % 2  # two scratch rows, shared
            prefill_tokens = PREFILL_WARM_UP_TOKENS * n
            prefill = dict(num_prefill_tokens=prefill_tokens, prefill_slots=slots[n:],
                           prefill_has_initial_state=slots[n:] == 1,
                           prefill_cu_seqlens=torch.arange(0, prefill_tokens + 1, PREFILL_WARM_UP_TOKENS, device=device,
                                                           dtype=torch.int32))
            decodes = [dict(num_decode_tokens=n, decode_slots=slots[:n])]
            if speculative:
                decodes.append(dict(
                    num_decode_tokens=n * speculative, decode_slots=slots[:n],
                    decode_ssm_slots=slots[:n, None].expand(n, speculative).contiguous(),
                    num_accepted_tokens=torch.ones(n, device=device, dtype=torch.int32),
                    decode_cu_seqlens=torch.arange(0, n * speculative + 1, speculative, device=device, dtype=torch.int32)))
            for decode in decodes:
                warm = LinearAttentionStep(conv_state=conv_pool, ssm_state=ssm_pool, ssm_layout=step.ssm_layout,
                                           **decode, **prefill)
                T = decode["num_decode_tokens"] + prefill_tokens
                self._mix(_random_rows_like(qkv, T, gen), _random_rows_like(ba, T, gen), warm)

    # ----------------------------------------------------------------------------------- parts
    def _conv(self, x: torch.Tensor, step: LinearAttentionStep) -> torch.Tensor:
        weight = self.conv1d.weight.view(self.conv_dim, -1)
        plain_state = step.conv_state[:, :, : weight.shape[1] - 1]  # all of it unless a rolling buffer
        # a speculative step (num_accepted_tokens) rolls the whole buffer; a plain one shifts its first W - 1 columns
        decode_state = plain_state if step.num_accepted_tokens is None else step.conv_state
        return _by_phase(
            step, x.shape[0], (self.conv_dim,), x,
            decode=lambda rows: causal_conv1d_update(x[rows], weight, None, decode_state, step.decode_slots,
                                                     num_accepted_tokens=step.num_accepted_tokens,
                                                     cu_seqlens=step.decode_cu_seqlens),
            prefill=lambda rows: causal_conv1d(x[rows], weight, None, plain_state, step.prefill_cu_seqlens,
                                               step.prefill_slots, step.prefill_has_initial_state),
        )

    def _core(self, q, k, v, a, b, step: LinearAttentionStep) -> torch.Tensor:
        shared = (self.A_log, self.dt_bias, step.ssm_state)

        def decode(rows):
            slots = step.decode_ssm_slots if step.decode_ssm_slots is not None else step.decode_slots
            return fused_recurrent_gated_delta_rule(q[rows], k[rows], v[rows], a[rows], b[rows], *shared, slots,
                                                    state_layout=step.ssm_layout,
                                                    num_accepted_tokens=step.num_accepted_tokens,
                                                    cu_seqlens=step.decode_cu_seqlens)

        def prefill(rows):
            return chunk_gated_delta_rule(q[rows], k[rows], v[rows], a[rows], b[rows], *shared, step.prefill_cu_seqlens,
                                          step.prefill_slots, step.prefill_has_initial_state, state_layout=step.ssm_layout)

        return _by_phase(step, q.shape[0], (self.num_v_heads, self.head_v_dim), v, decode=decode, prefill=prefill)


# layer-shape keys (see GatedDeltaNet._warm_up) whose kernels this process has compiled
_WARMED: set[tuple] = set()
PREFILL_WARM_UP_TOKENS = 3  # per prefill sequence of a warm-up step: sizes are not specialized, any will do


def _stride_order(pool: torch.Tensor) -> tuple[int, ...]:
    """The dims of ``pool`` from outermost to innermost in memory (by stride; ties keep dim order)."""
    return tuple(sorted(range(pool.dim()), key=lambda d: -pool.stride(d)))


def _random_rows_like(x: torch.Tensor, rows: int, gen: torch.Generator) -> torch.Tensor:
    """Random ``[rows, x.shape[1]]`` with ``x``'s row stride (a slice of a wider projection output, say)."""
    width = max(x.stride(0), x.shape[1])
    return torch.randn(rows, width, generator=gen, device=x.device).to(x.dtype)[:, : x.shape[1]]


def _scratch_like(pool: torch.Tensor, rows: int, device: torch.device) -> torch.Tensor:
    """Zeros ``[rows, *pool.shape[1:]]`` on ``device`` with ``pool``'s dims in the same memory order."""
    return torch.empty_permuted((rows, *pool.shape[1:]), _stride_order(pool), dtype=pool.dtype, device=device).zero_()


def _by_phase(step: LinearAttentionStep, num_tokens: int, row_shape: tuple[int, ...], like: torch.Tensor, *, decode, prefill):
    """Run ``decode`` over the step's decode tokens and ``prefill`` over its prefill tokens; padding rows are zero."""
    nd, npf = step.num_decode_tokens, step.num_prefill_tokens
    parts = []
    if nd:
        parts.append(decode(slice(0, nd)))
    if npf:
        parts.append(prefill(slice(nd, nd + npf)))
    if nd + npf < num_tokens:
        parts.append(like.new_zeros(num_tokens - nd - npf, *row_shape))
    return parts[0] if len(parts) == 1 else torch.cat(parts)
