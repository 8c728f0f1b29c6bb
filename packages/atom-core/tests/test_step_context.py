"""The native runner's step metadata (runtime/context.py, kv_cache.block_rows): everything a step's attention
reads is made from the sequences' blocks on the device, with no per-token work on the host."""

from __future__ import annotations

import pytest
import torch

from atom_core.runtime.context import StepContext
from atom_core.runtime.kv_cache import BlockAllocator, SequenceSlots, block_rows
from atom_core.runtime.positions import PositionPlan

BLOCK = 4


def sequences(lengths: list[int]) -> list[SequenceSlots]:
    """Sequences of these lengths whose blocks interleave (allocated round-robin), so block ids are not in order."""
    allocator = BlockAllocator(64)
    seqs = [SequenceSlots() for _ in lengths]
    for pos in range(max(lengths)):
        for s, n in zip(seqs, lengths):
            if pos < n:
                s.grow(1, BLOCK, allocator)
    return seqs


def context(seqs: list[SequenceSlots], query_lens: list[int]) -> StepContext:
    return StepContext(query_lens=query_lens, seq_lens=[s.length for s in seqs],
                       slot_mapping=torch.zeros(sum(query_lens), dtype=torch.int64),
                       block_table=torch.tensor(block_rows(seqs), dtype=torch.int32), block_size=BLOCK)


def test_slot_table_is_each_tokens_slot():
    seqs = sequences([9, 3, 13, 1])
    ctx = context(seqs, [2, 1, 5, 1])
    table = ctx.slot_table
    assert table.shape == (4, 13) and table.dtype == torch.int64
    for b, s in enumerate(seqs):
        want = [s.blocks[j // BLOCK] * BLOCK + j % BLOCK for j in range(s.length)]
        assert table[b, : s.length].tolist() == want
        assert (table[b, len(s.blocks) * BLOCK:] < BLOCK).all()  # past its blocks: slots of block 0, in the cache


def test_paged_is_the_block_table_and_other_block_sizes_come_from_slots():
    seqs = sequences([9, 3, 13])
    ctx = context(seqs, [1, 1, 1])
    table, lens = ctx.paged(BLOCK)
    assert table.tolist() == [s.blocks + [0] * (4 - len(s.blocks)) for s in seqs]
    assert lens.tolist() == [9, 3, 13]
    halves, _ = ctx.paged(BLOCK // 2)  # a cache of half-size blocks: block j holds tokens [2j, 2j + 2)
    for b, s in enumerate(seqs):
        slots = ctx.slot_table[b, : s.length : BLOCK // 2]
        assert halves[b, : len(slots)].tolist() == (slots // (BLOCK // 2)).tolist()


def test_mask_spans_the_longest_sequence():
    seqs = sequences([5, 2])
    mask = context(seqs, [2, 1]).mask(None)  # [B, 1, max_query_len, max_seq_len]
    assert mask.shape == (2, 1, 2, 5)
    assert mask[0, 0, 0].tolist() == [True, True, True, True, False]  # query at position 3 of 5
    assert mask[0, 0, 1].tolist() == [True] * 5
    assert mask[1, 0, 0].tolist() == [True, True, False, False, False]


def test_device_only_steps_refuse_host_reads():
    seqs = sequences([3, 2])
    ctx = StepContext.decode_over(torch.zeros(2, dtype=torch.int64), torch.tensor(block_rows(seqs), dtype=torch.int32),
                                  torch.tensor([3, 2], dtype=torch.int32), torch.full((2,), -1), BLOCK, linear=False)
    with pytest.raises(RuntimeError, match="device only"):
        _ = ctx.slot_table
    with pytest.raises(RuntimeError, match="device only"):
        ctx.mask(None)


def test_decode_position_is_past_the_prompt():
    assert PositionPlan().decode_position(7) == 7
    plan = PositionPlan(rows=3, prompt=torch.zeros(3, 5, dtype=torch.int64), delta=-2)
    assert plan.decode_position(5) == 3 and plan.decode_position(9) == 7
    assert plan.positions(9, 1)[:, 0].tolist() == [7, 7, 7]
    with pytest.raises(ValueError, match="inside the prompt"):
        plan.decode_position(4)
