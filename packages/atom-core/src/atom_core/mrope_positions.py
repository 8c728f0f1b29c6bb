"""Multimodal rotary positions (MRoPE) of a prompt, and the position delta its decode steps use.

Every prompt token gets three positions (time, height, width):

* a text token gets the running index on all three rows;
* the tokens of one vision block (an image, or one frame group of a video) laid out as a
  ``t × h × w`` grid of merged patches (``h``, ``w`` = patch grid / ``spatial_merge_size``) get
  ``time = start + frame``, ``height = start + row``, ``width = start + column``;
* after a block the running index resumes at the block's largest position + 1.

At decode every row of token ``p`` (``p >= len(prompt)``) is ``p + delta`` with
``delta = max(prompt positions) + 1 - len(prompt)``.

This is the computation of transformers' Qwen3-VL / Qwen3.5 ``get_rope_index``: a video's grid
``(t, h, w)`` is split into ``t`` frame groups of ``(1, h, w)``, each its own run of video tokens
(Qwen3-VL's processor separates frame groups with timestamp text).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import torch

from atom_core.errors import AtomError

TEXT, IMAGE, VIDEO = 0, 1, 2


class MultimodalPromptError(AtomError, ValueError):
    """A prompt's placeholder tokens do not match the grids of its images or videos."""


def vision_block_positions(start: int, grid: Sequence[int]) -> torch.Tensor:
    """``[3, t*h*w]`` positions of one block of merged-patch grid ``(t, h, w)`` starting at ``start``."""
    t, h, w = (int(g) for g in grid)
    frame, row, col = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([frame, row, col]).reshape(3, -1) + start


def _runs(token_types: Sequence[int]) -> Iterator[tuple[int, int]]:
    """``(type, length)`` of each maximal run of equal token types."""
    for kind, group in itertools.groupby(token_types):
        yield kind, sum(1 for _ in group)


def _blocks(grid_thw: torch.Tensor | Sequence[Sequence[int]] | None, spatial_merge_size: int, split_frames: bool):
    """Merged-patch grids of the vision blocks, in prompt order."""
    for t, h, w in (torch.as_tensor(grid_thw).tolist() if grid_thw is not None else []):
        frames = [(1, h // spatial_merge_size, w // spatial_merge_size)] * t if split_frames else \
            [(t, h // spatial_merge_size, w // spatial_merge_size)]
        yield from frames


def mrope_positions(
    token_ids: Sequence[int],
    *,
    image_token_id: int,
    video_token_id: int,
    spatial_merge_size: int,
    image_grid_thw: torch.Tensor | Sequence[Sequence[int]] | None = None,
    video_grid_thw: torch.Tensor | Sequence[Sequence[int]] | None = None,
) -> tuple[torch.Tensor, int]:
    """``([3, len(token_ids)]`` int64 positions, decode ``delta``) of one prompt.

    ``image_grid_thw`` / ``video_grid_thw``: ``[n, 3]`` patch grids (before merging) of the prompt's images
    and videos in order, as the model's image/video processor reports them.
    """
    kinds = {image_token_id: IMAGE, video_token_id: VIDEO}
    token_types = [kinds.get(int(tok), TEXT) for tok in token_ids]
    blocks = {
        IMAGE: _blocks(image_grid_thw, spatial_merge_size, split_frames=False),
        VIDEO: _blocks(video_grid_thw, spatial_merge_size, split_frames=True),
    }
    chunks, next_pos = [], 0
    for kind, length in _runs(token_types):
        if kind == TEXT:
            chunk = torch.arange(length).expand(3, -1) + next_pos
        else:
            name = "image" if kind == IMAGE else "video frame group"
            grid = next(blocks[kind], None)
            if grid is None:
                raise MultimodalPromptError(f"the prompt has more {name} placeholder runs than grids were given")
            if length != grid[0] * grid[1] * grid[2]:
                raise MultimodalPromptError(
                    f"a run of {length} {name} placeholder tokens does not match its merged grid {grid} "
                    f"({grid[0] * grid[1] * grid[2]} tokens)"
                )
            chunk = vision_block_positions(next_pos, grid)
        chunks.append(chunk)
        next_pos = int(chunk.max()) + 1
    for kind, remaining in blocks.items():
        if next(remaining, None) is not None:
            raise MultimodalPromptError(f"more {'image' if kind == IMAGE else 'video'} grids than placeholder runs")
    positions = torch.cat(chunks, dim=1) if chunks else torch.zeros(3, 0, dtype=torch.long)
    return positions, next_pos - len(token_ids)


def decode_positions(start: int, count: int, delta: int) -> torch.Tensor:
    """``[3, count]`` positions of tokens ``start .. start+count-1`` generated after the prompt."""
    return (torch.arange(start, start + count) + delta).expand(3, -1)
