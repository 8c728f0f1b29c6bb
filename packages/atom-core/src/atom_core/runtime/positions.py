"""Where each token of a sequence sits, for the positions the runner passes the model.

A plain decoder gets one row, ``0 .. n-1``.  An MRoPE model (``model.position_rows == 3``) gets three
rows: its prompt's positions as the model computes them (``model.prompt_positions``), then every later
token ``p`` at ``p + delta`` on all rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PositionPlan:
    rows: int = 1
    prompt: torch.Tensor | None = None  # [rows, prompt length]; None: the running index
    delta: int = 0

    def positions(self, start: int, count: int) -> torch.Tensor:
        """``[rows, count]`` int64 positions of tokens ``start .. start + count - 1``."""
        inside = self.prompt[:, start : start + count] if self.prompt is not None else self.prompt
        done = 0 if inside is None else inside.shape[1]
        after = (torch.arange(start + done, start + count) + self.delta).expand(self.rows, -1)
        return after if inside is None else torch.cat([inside, after], dim=1)
