"""Which layers a ``quantization_config`` leaves unquantized (``ignore``, ``modules_to_not_convert``,
``ignored_layers``, ``exclude``), mapped through the model's packed (fused) module names.

Checkpoints name layers as the checkpoint stores them (``q_proj``, ``gate_proj``); ATOM fuses some
(``qkv_proj``, ``gate_up_proj``).  A fused layer is excluded when all of its shards are and quantized
when none are; a mix is an error, since one GEMM cannot run two precisions.

A pattern matches a layer name (or any module containing it) when it is

* ``re:<regex>``: ``re.match`` against the dotted name (compressed-tensors' rule);
* a glob with ``*``, ``?`` or ``[``: ``fnmatch`` against the name or one of its ancestors
  (gpt-oss: ``model.layers.*.self_attn``; Quark: ``*.mlp.gate``);
* anything else: a run of whole dotted components of the name (``lm_head``, ``self_attn``,
  ``model.layers.0.mlp.down_proj``), never a bare substring (``proj`` does not match ``o_proj``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from atom_core.errors import UnsupportedQuantizationError

_GLOB_CHARS = frozenset("*?[")


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def matches(name: str, pattern: str) -> bool:
    """Whether ``pattern`` names the module ``name`` or a module that contains it."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if _GLOB_CHARS & set(pattern):
        return any(fnmatch.fnmatchcase(candidate, pattern) for candidate in _ancestors(name))
    return f".{pattern}." in f".{name}."


def matches_any(name: str, patterns: Iterable[str]) -> bool:
    return any(matches(name, p) for p in patterns)


def shard_names(prefix: str, packed: Mapping[str, Sequence[str]]) -> list[str]:
    """The checkpoint module names a model layer is made of: ``...self_attn.qkv_proj`` ->
    ``...self_attn.q_proj``, ``k_proj``, ``v_proj``; an unfused layer is its own name."""
    parent, _, leaf = prefix.rpartition(".")
    sources = packed.get(leaf)
    if not sources:
        return [prefix]
    return [f"{parent}.{source}" if parent else source for source in sources]


def layer_excluded(prefix: str, patterns: Sequence[str], packed: Mapping[str, Sequence[str]]) -> bool:
    """True when ``patterns`` exclude the layer at ``prefix`` (all of its shards, if fused)."""
    if not patterns:
        return False
    names = shard_names(prefix, packed)
    hits = [matches_any(n, patterns) for n in names]
    if all(hits):
        return True
    if any(hits):
        excluded = [n for n, hit in zip(names, hits) if hit]
        kept = [n for n, hit in zip(names, hits) if not hit]
        raise UnsupportedQuantizationError(
            f"{prefix}: the quantization config excludes {excluded} but not {kept}; the shards of a fused "
            "layer must share one precision"
        )
    return False


def layer_selected(prefix: str, targets: Sequence[str], packed: Mapping[str, Sequence[str]]) -> bool:
    """True when ``targets`` (compressed-tensors ``config_groups[*].targets``) select the layer;
    ``Linear`` selects every linear layer.  Mixed shards are an error, as for exclusions."""
    if "Linear" in targets:
        return True
    return layer_excluded(prefix, targets, packed)


def exclusion_patterns(config: Mapping, *keys: str) -> list[str]:
    """The union of the exclusion lists found under ``keys`` (each may be missing or None)."""
    patterns: list[str] = []
    for key in keys:
        value = config.get(key)
        if value:
            if isinstance(value, str):
                value = [value]
            patterns.extend(str(v) for v in value)
    return patterns


# the quantization_config keys that list modules left unquantized (one per scheme family)
EXCLUSION_KEYS = ("ignore", "ignored_layers", "modules_to_not_convert", "exclude")


def in_model_names(config: Mapping, rename: Callable[[str], str]) -> dict:
    """``config`` with the plain module names of its exclusion lists (not ``re:`` or glob patterns) put through
    ``rename``, the model's checkpoint-to-parameter renames: a published list names modules as the checkpoint does
    (Kimi-K2.5: ``language_model.model.layers.0.self_attn.q_a_proj``), while the model's layers know their own names
    (``model.layers.0.self_attn.q_a_proj``).  A name is renamed with a trailing dot, as the start of its tensors'
    names (``<module>.weight``) is."""
    def renamed(pattern: str) -> str:
        if pattern.startswith("re:") or _GLOB_CHARS & set(pattern):
            return pattern
        return rename(f"{pattern}.")[:-1]

    out = dict(config)
    for key in EXCLUSION_KEYS:
        value = config.get(key)
        if value:
            out[key] = [renamed(str(v)) for v in ([value] if isinstance(value, str) else value)]
    return out
