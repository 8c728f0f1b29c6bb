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

    def decode_position(self, start: int) -> int:
        """The position (every row's) of the token at index ``start``, past the prompt: a decode step's."""
        if self.prompt is not None and start < self.prompt.shape[1]:
            raise ValueError(f"token {start} is inside the prompt ({self.prompt.shape[1]} tokens): not a decode step")
        return start + self.delta

    def positions(self, start: int, count: int) -> torch.Tensor:
        """``[rows, count]`` int64 positions of tokens ``start .. start + count - 1``."""
        in_prompt = 0 if self.prompt is None else max(0, min(count, self.prompt.shape[1] - start))
        after = (torch.arange(start + in_prompt, start + count) + self.delta).expand(self.rows, -1)
        if in_prompt == 0:
            return after
        return torch.cat([self.prompt[:, start : start + in_prompt], after], dim=1)
