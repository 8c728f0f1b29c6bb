"""LoRA deltas in ATOM's linear layers, several adapters in one batch.

:func:`attach_adapters` gives every linear layer some adapter targets a :class:`LoraDelta` (``layer.lora``), which
the layer adds to its base output: ``y += (x Aᵀ ⊙ mask) Bᵀ``.  The adapters' A matrices are stacked into one
``shrink [R, in]`` and their (scaled) B matrices into one ``expand [out, R]``, column block per (adapter, shard):
a fused layer (q|k|v, gate|up) places each checkpoint module's B at its shard's output rows.  ``mask[t, c]`` keeps
column ``c`` for token ``t`` only when ``c`` belongs to the adapter that token uses (:attr:`LoraSet.token_adapter`,
``-1``: none), so each token gets its own adapter's delta and a token without one gets exactly the base output.
Two GEMMs of width ``R`` (the sum of the ranks) per layer: no per-token Python loop, no host synchronisation.

The delta is computed in float32 over any base weight format (the base layer's quantization method is untouched)
and added in the output's dtype.  Under tensor parallelism a column-parallel layer keeps its rank's rows of B, a
row-parallel layer its rank's columns of A: its partial delta joins the partial product before the all-reduce.

:class:`LoraSlots` is the same delta for a host's adapter manager: ``slots`` fixed places of rank ``rank`` each,
written and cleared one at a time as the host loads and evicts adapters, the per-token slot index read from the
host (``-1``: none).  A host that keeps B unscaled gives each token's scaling as ``tokens.token_scale`` ``[T]``
float32 (absent or None: B is written scaled).

Only :class:`~atom_core.layers.linear.LinearBase` layers take adapters; a target that maps elsewhere (MoE experts,
a router, embeddings, the LM head) is refused with a message naming the module.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from atom_core.errors import CheckpointError, UnsupportedConfigError, UsageError
from atom_core.layers.linear import LinearBase
from atom_core.lora.adapter import LoraAdapter

NO_ADAPTER = -1


class LoraSet:
    """The adapters a model serves (index = position in :attr:`names`) and, for the current step, the adapter
    each token uses: :attr:`token_adapter` ``[T]`` int64, ``-1`` for none; None outside a step (no delta)."""

    def __init__(self, names: Sequence[str]):
        self.names = list(names)
        self.token_adapter: torch.Tensor | None = None

    def index(self, name: str | None) -> int:
        if name is None:
            return NO_ADAPTER
        if name not in self.names:
            loaded = ", ".join(self.names) or "none"
            raise UsageError(f"adapter {name!r} is not loaded (loaded: {loaded})")
        return self.names.index(name)


class LoraDelta(nn.Module):
    """The stacked adapters of one linear layer (float32 buffers, not parameters: the base checkpoint's loader
    and coverage check never see them)."""

    def __init__(self, lora_set: LoraSet, shrink: torch.Tensor, expand: torch.Tensor, column_adapter: torch.Tensor):
        super().__init__()
        self.lora_set = [lora_set]  # a list keeps the shared set out of the module tree
        self.register_buffer("shrink", shrink, persistent=False)
        self.register_buffer("expand", expand, persistent=False)
        self.register_buffer("column_adapter", column_adapter, persistent=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        token_adapter = self.lora_set[0].token_adapter
        if token_adapter is None:
            return y
        x2 = x.reshape(-1, x.shape[-1]).float()
        if token_adapter.shape[0] != x2.shape[0]:
            raise RuntimeError(f"LoRA: {token_adapter.shape[0]} token adapter indices for {x2.shape[0]} tokens")
        mask = token_adapter[:, None] == self.column_adapter[None, :]
        delta = ((x2 @ self.shrink.t()) * mask) @ self.expand.t()
        token_scale = getattr(self.lora_set[0], "token_scale", None)
        if token_scale is not None:  # a host that scales B per step (SGLang) rather than when it is written
            delta = delta * token_scale[:, None]
        return y + delta.to(y.dtype).reshape(y.shape)

    def extra_repr(self) -> str:
        return f"rank_total={self.shrink.shape[0]}, adapters={self.column_adapter.unique().numel()}"


class LoraSlots(LoraDelta):
    """``slots`` adapter places of rank ``rank`` per output shard of ``layer``, zero until written: slot ``s``, shard
    ``k`` owns columns ``[(s K + k) rank, + rank)`` of ``shrink``/``expand`` (``K`` the layer's shards), so one slot's
    adapter may target any subset of a fused layer's shards.  ``tokens.token_adapter`` gives each token's slot."""

    def __init__(self, tokens, layer: LinearBase, slots: int, rank: int):
        shards = len(layer.out_partitions)
        total = slots * shards * rank
        device = next(layer.parameters()).device
        shrink = torch.zeros(total, layer.input_source()[1], device=device)
        expand = torch.zeros(sum(layer.out_partitions), total, device=device)
        column_adapter = torch.arange(slots, device=device).repeat_interleave(shards * rank)
        super().__init__(tokens, shrink, expand, column_adapter)
        self.layer = [layer]  # a list keeps the layer (this module's parent) out of the module tree
        self.rank = rank
        self.rows = [0]
        for size in layer.out_partitions:
            self.rows.append(self.rows[-1] + size)

    def _columns(self, slot: int, shard: int) -> slice:
        start = (slot * len(self.layer[0].out_partitions) + shard) * self.rank
        return slice(start, start + self.rank)

    def write(self, slot: int, shard: int, a: torch.Tensor, b: torch.Tensor, where: str) -> None:
        """Place the full-size ``a [r, in]`` and (scaled) ``b [out, r]`` of shard ``shard`` in ``slot`` (this rank's
        part of them under tensor parallelism); the shard's previous contents are replaced."""
        a, b = _rank_slices(self.layer[0], shard, a, b, where)
        if a.shape[0] > self.rank or b.shape[1] != a.shape[0]:
            raise CheckpointError(f"{where}: rank {a.shape[0]} (lora_B {tuple(b.shape)}) does not fit the "
                                  f"{self.rank} of each slot")
        cols = self._columns(slot, shard)
        rank = a.shape[0]
        self.shrink[cols] = 0
        self.expand[:, cols] = 0
        self.shrink[cols.start:cols.start + rank] = a.to(self.shrink)
        self.expand[self.rows[shard]:self.rows[shard + 1], cols.start:cols.start + rank] = b.to(self.expand)

    def clear(self, slot: int) -> None:
        """Zero every shard of ``slot``: its tokens get the base output."""
        for shard in range(len(self.layer[0].out_partitions)):
            cols = self._columns(slot, shard)
            self.shrink[cols] = 0
            self.expand[:, cols] = 0


def _target_layer(model: nn.Module, adapter: LoraAdapter, module: str) -> tuple[LinearBase, int]:
    """The linear layer and shard index a checkpoint module's adapter applies to."""
    where = f"adapter {adapter.name} ({adapter.path}): module {module!r}"
    targets = model.mapper().map(f"{module}.weight")
    if not targets or len(targets) != 1:
        raise UnsupportedConfigError(f"{where} is not a weight of {type(model).__name__} ATOM can adapt")
    param, shard_id = targets[0].param, targets[0].shard_id
    layer_name = param.rpartition(".")[0]
    try:
        layer = model.get_submodule(layer_name)
    except AttributeError:
        raise UnsupportedConfigError(f"{where} names no module of {type(model).__name__}") from None
    if not isinstance(layer, LinearBase):
        kind = "an MoE expert" if "experts" in layer_name.split(".") else f"a {type(layer).__name__}"
        raise UnsupportedConfigError(f"{where} is {kind}: LoRA is supported on ATOM's linear layers only (attention "
                                     "projections, dense and shared-expert MLPs)")
    if not layer.adapts_in_forward:
        raise UnsupportedConfigError(f"{where}: its weight is read by the attention itself (latent attention's "
                                     "absorbed projection), so a LoRA delta there would never apply")
    if shard_id is None and len(layer.shard_ids) > 1:
        raise UnsupportedConfigError(f"{where} targets the fused {layer_name} as a whole: adapters on a fused module "
                                     "are supported per checkpoint module only")
    return layer, layer.shard_ids.index(shard_id) if shard_id is not None else 0


def _rank_slices(layer: LinearBase, index: int, a: torch.Tensor, b: torch.Tensor, where: str):
    """This rank's part of ``(A, B)`` for shard ``index`` of ``layer``."""
    _, _, full_out = layer.shard_source(index)
    if a.shape[1] != layer.input_size or b.shape[0] != full_out:
        raise CheckpointError(f"{where}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not fit the layer "
                              f"({layer.input_size} inputs, {full_out} outputs)")
    start, size, _ = layer.shard_source(index)
    b = b.narrow(0, start, size)
    in_start, in_size, _ = layer.input_source()
    return a.narrow(1, in_start, in_size), b


def attach_adapters(model: nn.Module, adapters: Sequence[LoraAdapter]) -> LoraSet:
    """Give ``model``'s linear layers the deltas of ``adapters`` (adapter ``i`` is index ``i`` of the returned set)."""
    names = [a.name for a in adapters]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise UsageError(f"adapter name {duplicate!r} is given twice")
    lora_set = LoraSet(names)
    blocks: dict[LinearBase, list[tuple[int, int, torch.Tensor, torch.Tensor]]] = {}
    for i, adapter in enumerate(adapters):
        for module, (a, b) in adapter.modules.items():
            layer, index = _target_layer(model, adapter, module)
            a, b = _rank_slices(layer, index, a, b, f"adapter {adapter.name}: module {module!r}")
            blocks.setdefault(layer, []).append((i, index, a, b * adapter.scaling))
    for layer, entries in blocks.items():
        device = next(layer.parameters()).device
        rows = [0]
        for size in layer.out_partitions:
            rows.append(rows[-1] + size)
        total = sum(a.shape[0] for _, _, a, _ in entries)
        expand = torch.zeros(rows[-1], total)
        column_adapter = torch.empty(total, dtype=torch.int64)
        col = 0
        for i, index, a, b in entries:
            expand[rows[index]:rows[index + 1], col:col + a.shape[0]] = b
            column_adapter[col:col + a.shape[0]] = i
            col += a.shape[0]
        shrink = torch.cat([a for _, _, a, _ in entries])
        layer.lora = LoraDelta(lora_set, shrink.to(device), expand.to(device), column_adapter.to(device))
    return lora_set
