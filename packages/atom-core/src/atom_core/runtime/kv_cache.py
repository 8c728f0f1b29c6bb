"""A paged KV cache: fixed-size blocks of slots, handed to sequences as they grow."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class BlockAllocator:
    def __init__(self, num_blocks: int):
        self.free = list(range(num_blocks - 1, -1, -1))

    def allocate(self) -> int:
        if not self.free:
            raise RuntimeError("KV cache out of blocks")
        return self.free.pop()

    def release(self, blocks: list[int]) -> None:
        self.free.extend(reversed(blocks))


@dataclass
class SequenceSlots:
    """The blocks one sequence holds and how many of its slots are filled (and its linear-attention
    state slot, -1 when the model has no such layers)."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0
    state_slot: int = -1

    def grow(self, new_tokens: int, block_size: int, allocator: BlockAllocator) -> list[int]:
        """Reserve slots for ``new_tokens`` more tokens; returns their slot ids."""
        slots = []
        for pos in range(self.length, self.length + new_tokens):
            if pos // block_size >= len(self.blocks):
                self.blocks.append(allocator.allocate())
            slots.append(self.blocks[pos // block_size] * block_size + pos % block_size)
        self.length += new_tokens
        return slots

    def truncate(self, length: int, block_size: int, allocator: BlockAllocator) -> None:
        """Drop the slots of positions ``>= length``; blocks no longer used go back to ``allocator``."""
        keep = -(-length // block_size)
        allocator.release(self.blocks[keep:])
        del self.blocks[keep:]
        self.length = length


def block_rows(seqs: list[SequenceSlots], width: int | None = None) -> list[list[int]]:
    """Each sequence's blocks padded with block 0 to ``width`` (default: the most any of them holds): the rows of
    a block table."""
    width = max(len(s.blocks) for s in seqs) if width is None else width
    return [s.blocks + [0] * (width - len(s.blocks)) for s in seqs]


class KVCache:
    """Per attention layer, K and V of shape ``[num_blocks, block_size, *shape]``, their ``(k, v)`` shapes as the
    layer declares them (``(kv_heads, head_dim)`` each; latent attention caches one latent as K).  Slot
    ``block * block_size + offset`` is ``cache[block, offset]``."""

    def __init__(self, layer_shapes: list[tuple[tuple[int, ...], tuple[int, ...]]], num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.layers = [
            (torch.zeros(num_blocks, block_size, *k_shape, dtype=dtype, device=device),
             torch.zeros(num_blocks, block_size, *v_shape, dtype=dtype, device=device))
            for k_shape, v_shape in layer_shapes
        ]
        self.allocator = BlockAllocator(num_blocks)
