"""Placing checkpoint tensors into a model, with a strict coverage check."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from torch import nn

from atom_core.errors import CheckpointError
from atom_core.layers.params import default_weight_loader
from atom_core.loader.mapper import WeightMapper

logger = logging.getLogger(__name__)


def _expected_shards(param: nn.Parameter) -> frozenset:
    return frozenset(getattr(param, "shard_ids", (None,)))


def load_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, Any]],
    mapper: WeightMapper,
    *,
    strict: bool = True,
    skip_param: Any = None,
) -> set[str]:
    """Load ``(checkpoint_name, tensor)`` pairs into ``model``; returns the names of the parameters
    written completely.

    With ``strict``, a checkpoint tensor that maps to no parameter, or a parameter (or shard of a fused
    parameter) that no tensor wrote, is a :class:`CheckpointError` naming them.  ``skip_param``
    (name -> bool) marks parameters this process does not hold (pipeline stages elsewhere).
    """
    params = dict(model.named_parameters())
    written: dict[str, set] = {}
    unconsumed: list[str] = []
    for checkpoint_name, tensor in weights:
        targets = mapper.map(checkpoint_name)
        if targets is None:
            continue
        for target in targets:
            if skip_param is not None and skip_param(target.param):
                continue
            param = params.get(target.param)
            if param is None:
                unconsumed.append(checkpoint_name if target.param == checkpoint_name else f"{checkpoint_name} (as {target.param})")
                continue
            loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                loader(param, tensor, target.shard_id, **dict(target.kwargs))
            except (ValueError, RuntimeError) as err:
                raise CheckpointError(f"cannot load checkpoint tensor {checkpoint_name} into {target.param}: {err}") from err
            written.setdefault(target.param, set()).add(target.shard_id)
    complete = {name for name, shards in written.items() if None in shards or shards >= _expected_shards(params[name])}
    if strict:
        problems = []
        if unconsumed:
            problems.append(f"checkpoint tensors not used by the model: {_listing(unconsumed)}")
        missing = []
        for name, param in params.items():
            if name in complete or (skip_param is not None and skip_param(name)):
                continue
            got = written.get(name)
            if got:
                missing.append(f"{name} (shards {sorted(map(str, _expected_shards(param) - got))} never written)")
            else:
                missing.append(name)
        if missing:
            problems.append(f"model parameters the checkpoint did not provide: {_listing(missing)}")
        if problems:
            raise CheckpointError("; ".join(problems))
    process_after_loading(model)
    return complete


def process_after_loading(model: nn.Module) -> None:
    """Let each layer's quantization method convert its loaded tensors."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)


def _listing(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" ... and {len(names) - limit} more" if len(names) > limit else "")
