"""Checkpoint names -> model parameters, declared as data.

A model declares:

* ``renames``: ``(regex, replacement)`` applied in order to every checkpoint name first;
* ``packed``: fused modules and the checkpoint modules they are made of,
  e.g. ``{"qkv_proj": [("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")]}``;
* ``ignored``: regexes of checkpoint tensors that are known extras (``rotary_emb.inv_freq``...);
* ``tied``: regexes of checkpoint tensors that hold a parameter the model shares with another (the LM head of a
  model with ``tie_word_embeddings``: its parameter is the token embedding).  The loader compares such a tensor
  with what the shared parameter got, as transformers does (:func:`atom_core.loader.load.load_weights`);
* ``rules``: callables ``name -> list[Target] | None`` for mappings that need more than a rename
  (expert tensors, for example); the first that answers wins.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

ALWAYS_IGNORED = (r"(^|\.)rotary_emb\.inv_freq$",)
TIED_LM_HEAD = (r"^lm_head\.weight$",)  # ``tied`` of a model whose LM head is its token embedding


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: a parameter, the shard of it, extra loader arguments."""

    param: str
    shard_id: Any = None
    kwargs: tuple[tuple[str, Any], ...] = ()


@dataclass
class WeightMapper:
    renames: Sequence[tuple[str, str]] = ()
    packed: dict[str, Sequence[tuple[str, Any]]] = field(default_factory=dict)
    ignored: Sequence[str] = ()
    tied: Sequence[str] = ()
    rules: Sequence[Callable[[str], list[Target] | None]] = ()

    def __post_init__(self) -> None:
        self._renames = [(re.compile(pattern), repl) for pattern, repl in self.renames]
        self._ignored = [re.compile(p) for p in (*ALWAYS_IGNORED, *self.ignored)]
        self._tied = [re.compile(p) for p in self.tied]
        self._packed = [
            (re.compile(rf"(^|\.){re.escape(source)}\."), f"\\g<1>{fused}.", shard)
            for fused, sources in self.packed.items()
            for source, shard in sources
        ]

    @property
    def packed_modules_mapping(self) -> dict[str, list[str]]:
        """The ``{fused: [sources]}`` form hosts (vLLM, SGLang) expect."""
        return {fused: [source for source, _ in sources] for fused, sources in self.packed.items()}

    def rename(self, name: str) -> str:
        for pattern, repl in self._renames:
            name = pattern.sub(repl, name)
        return name

    def is_ignored(self, name: str) -> bool:
        return any(p.search(name) for p in self._ignored)

    def is_tied(self, checkpoint_name: str) -> bool:
        """Whether the tensor is a tied parameter's copy (``tied``): compared by the loader, not loaded."""
        name = self.rename(checkpoint_name)
        return any(p.search(name) for p in self._tied)

    def map(self, checkpoint_name: str) -> list[Target] | None:
        """The targets of one checkpoint tensor; None when it is a known extra to skip."""
        name = self.rename(checkpoint_name)
        if self.is_ignored(name) or any(p.search(name) for p in self._tied):
            return None
        for rule in self.rules:
            targets = rule(name)
            if targets is not None:
                return targets
        for pattern, repl, shard in self._packed:
            if pattern.search(name):
                return [Target(pattern.sub(repl, name, count=1), shard)]
        return [Target(name)]
