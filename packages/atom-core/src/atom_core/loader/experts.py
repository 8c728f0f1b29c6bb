"""Checkpoint names of mixture-of-experts weights -> the stacked expert parameters of
:class:`atom_core.layers.moe.FusedMoE`, as data.

Two layouts reach the loader:

* per expert (what the Hub's checkpoints hold and what transformers 5's ``save_pretrained`` writes):
  ``<module>.experts.<i>.<projection>.<tensor>`` with projections ``gate_proj``/``up_proj``/``down_proj``
  (Mixtral: ``w1``/``w3``/``w2``);
* stacked (transformers 5's in-memory layout): ``<module>.experts.gate_up_proj`` ``[E, 2I, H]`` and
  ``<module>.experts.down_proj`` ``[E, H, I]``.

A per-expert tensor goes to ``<module>.experts.<w13|w2>_<tensor>`` (so ``weight`` -> ``w13_weight``,
``weight_scale_inv`` -> ``w13_weight_scale_inv``: quantization methods name their parameters that way)
with the shard ``(projection, expert)``; a stacked tensor goes to its parameter whole (shard None).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from atom_core.loader.mapper import Target, WeightMapper

# checkpoint projection -> (parameter group, projection the layer's loader knows)
PER_EXPERT_PROJECTIONS: Mapping[str, tuple[str, str]] = {
    "gate_proj": ("w13", "gate"), "up_proj": ("w13", "up"), "down_proj": ("w2", "down"),
    "w1": ("w13", "gate"), "w3": ("w13", "up"), "w2": ("w2", "down"),
}
# stacked checkpoint tensor -> parameter
STACKED_TENSORS: Mapping[str, str] = {"gate_up_proj": "w13_weight", "down_proj": "w2_weight"}

_PER_EXPERT = re.compile(r"^(?P<module>(?:.*\.)?experts)\.(?P<expert>\d+)\.(?P<proj>[^.]+)\.(?P<tensor>[^.]+)$")
_STACKED = re.compile(r"^(?P<module>(?:.*\.)?experts)\.(?P<tensor>[^.]+)$")


@dataclass(frozen=True)
class ExpertRule:
    """A :class:`WeightMapper` rule for expert tensors (both layouts)."""

    projections: Mapping[str, tuple[str, str]] = field(default_factory=lambda: dict(PER_EXPERT_PROJECTIONS))
    stacked: Mapping[str, str] = field(default_factory=lambda: dict(STACKED_TENSORS))

    def __call__(self, name: str) -> list[Target] | None:
        match = _PER_EXPERT.match(name)
        if match and match["proj"] in self.projections:
            group, projection = self.projections[match["proj"]]
            return [Target(f"{match['module']}.{group}_{match['tensor']}", (projection, int(match["expert"])))]
        match = _STACKED.match(name)
        if match and match["tensor"] in self.stacked:
            return [Target(f"{match['module']}.{self.stacked[match['tensor']]}")]
        return None


EXPERT_RULE = ExpertRule()


def with_experts(mapper: WeightMapper, *, renames: tuple[tuple[str, str], ...] = (), ignored: tuple[str, ...] = ()) -> WeightMapper:
    """``mapper`` plus the expert rule (checked before its packed-module renames), extra renames and ignores."""
    return dataclasses.replace(
        mapper, renames=(*mapper.renames, *renames), ignored=(*mapper.ignored, *ignored), rules=(EXPERT_RULE, *mapper.rules)
    )
