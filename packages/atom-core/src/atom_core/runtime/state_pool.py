"""The native host's per-sequence state of linear-attention (Gated DeltaNet) layers.

Every sequence of a batch holds one *slot* for its whole life; each linear-attention layer has a conv
state pool and an SSM state pool indexed by slot.  A fresh sequence's first step runs as a prefill
without initial state (nothing is read, so slots need no clearing); every later step reads and writes
its slot in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from atom_core.host import LinearAttentionStep
from atom_kernels.gdn import K_MAJOR, ssm_state_shape

if TYPE_CHECKING:
    from atom_core.runtime.host import NativeHost


@dataclass(frozen=True)
class StateSpec:
    """One layer's per-sequence shapes (``ssm_shape`` logical, K-major ``(HV, K, V)``) and dtypes."""

    prefix: str
    conv_shape: tuple[int, ...]
    ssm_shape: tuple[int, int, int]
    conv_dtype: torch.dtype
    ssm_dtype: torch.dtype


class StatePool:
    """Conv and SSM pools of every linear-attention layer, ``num_slots`` slots each, and the free slots."""

    def __init__(self, specs: list[StateSpec], num_slots: int, layout: str, device: torch.device):
        self.num_slots = num_slots
        self.layout = layout
        self.conv = [self._conv_pool(s, num_slots, device) for s in specs]
        self.ssm = [torch.zeros(num_slots, *ssm_state_shape(layout, *s.ssm_shape), dtype=s.ssm_dtype, device=device)
                    for s in specs]
        self.free = list(range(num_slots - 1, -1, -1))

    @staticmethod
    def _conv_pool(spec: StateSpec, num_slots: int, device: torch.device) -> torch.Tensor:
        # stored [slots, W-1, conv_dim] so each tap's channels are contiguous, used as [slots, conv_dim, W-1]
        dim, taps = spec.conv_shape
        return torch.zeros(num_slots, taps, dim, dtype=spec.conv_dtype, device=device).transpose(1, 2)

    def allocate(self) -> int:
        if not self.free:
            raise RuntimeError(f"linear-attention state pool out of slots ({self.num_slots})")
        return self.free.pop()

    def release(self, slots: list[int]) -> None:
        self.free.extend(s for s in reversed(slots) if s >= 0)

    def save(self, slots: list[int]) -> StateSnapshot:
        """A copy of the given slots' conv and SSM states in every layer (to roll a step back with :meth:`restore`);
        indexing with a tensor copies, so the snapshot does not follow the pool."""
        index = torch.tensor(slots, dtype=torch.int64, device=self.ssm[0].device)
        return StateSnapshot(list(slots), [c[index] for c in self.conv], [s[index] for s in self.ssm])

    def restore(self, snapshot: StateSnapshot, rows: list[int]) -> None:
        """Put back the states ``snapshot`` holds for its slots at ``rows`` (indices into ``snapshot.slots``)."""
        index = torch.tensor(rows, dtype=torch.int64, device=self.ssm[0].device)
        slots = torch.tensor([snapshot.slots[r] for r in rows], dtype=torch.int64, device=self.ssm[0].device)
        for pool, saved in zip((*self.conv, *self.ssm), (*snapshot.conv, *snapshot.ssm)):
            pool[slots] = saved[index]


@dataclass
class StateSnapshot:
    """Copies of some slots' states: ``conv[layer][i]`` / ``ssm[layer][i]`` belong to ``slots[i]``."""

    slots: list[int]
    conv: list[torch.Tensor]
    ssm: list[torch.Tensor]


class NativeLinearAttentionState:
    """What :meth:`NativeHost.linear_attention_state` returns: one layer's view of the pool."""

    def __init__(self, host: NativeHost, index: int, mix: Callable[..., torch.Tensor], layout: str = K_MAJOR):
        self._host = host
        self.index = index
        self._mix = mix
        self.ssm_layout = layout

    def run(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self._mix(*inputs, self.step())

    def step(self) -> LinearAttentionStep:
        host = self._host
        ctx = host.context
        if ctx is None or host.state_pool is None:
            raise RuntimeError("linear-attention state used outside a runner step (no StepContext or state pool)")
        meta = ctx.linear_attention_metadata()
        return LinearAttentionStep(conv_state=host.state_pool.conv[self.index], ssm_state=host.state_pool.ssm[self.index],
                                   ssm_layout=self.ssm_layout, **meta)
