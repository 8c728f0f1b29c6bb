"""The native runner's decode steps replayed from CUDA graphs, one graph per batch-size bucket.

A decode step (every sequence adds one token to a context already cached) has shapes that depend only on the
batch size once the batch is padded up to a bucket and the block table to a fixed width, and ATOM's decode path
reads nothing on the host (paged attention, latent attention's absorbed decode and the linear-attention kernels
take their lengths, block tables and slots from device tensors).  So each (bucket, table width) is captured once,
over static input buffers, and a step copies its inputs into those buffers and replays.  Steps with prompt tokens
or images run eagerly.

Padding rows: token 0 at position 0, KV slot -1 (nothing written), a context of one token in block 0 (attention
reads a cached, finite row, so nothing downstream, MoE routing included, sees undefined values) and
linear-attention slot -1 (no state read or written, output zero).  Rows a smaller batch left behind are
reset to padding on every step.

Off CUDA there is nothing to capture: the same padded step runs eagerly over the same buffers, which is what the
CPU tests check (padding and bookkeeping); the capture itself runs on a GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from atom_core.runtime.context import StepContext
from atom_core.runtime.kv_cache import block_rows

if TYPE_CHECKING:
    from atom_core.runtime.host import NativeHost
    from atom_core.runtime.kv_cache import SequenceSlots

logger = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MIN_TABLE_BLOCKS = 16  # table widths are powers of two from here, so a growing context recaptures rarely


def bucket_for(batch: int) -> int | None:
    """The smallest bucket holding ``batch`` sequences (None: larger than every bucket)."""
    return next((b for b in BUCKETS if b >= batch), None)


def table_width(blocks: int) -> int:
    return max(MIN_TABLE_BLOCKS, 1 << (blocks - 1).bit_length())


@dataclass
class _Static:
    """One (bucket, table width)'s input buffers, the step context built over them, and its graph and output."""

    input_ids: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [rows, B] int64
    slot_mapping: torch.Tensor  # [B] int64
    block_table: torch.Tensor  # [B, width] int32
    seq_lens: torch.Tensor  # [B] int32
    state_slots: torch.Tensor  # [B] int64
    context: StepContext
    graph: torch.cuda.CUDAGraph | None = None
    hidden: torch.Tensor | None = None
    filled: int = 0  # rows the last step wrote (rows past it hold padding)


class DecodeGraphs:
    """Decode steps of ``model`` over ``host``'s KV cache (and state pool), padded to buckets and replayed."""

    def __init__(self, model: torch.nn.Module, host: NativeHost, device: torch.device, position_rows: int):
        self.model, self.host, self.device, self.rows = model, host, device, position_rows
        self.capture = device.type == "cuda"
        self._static: dict[tuple[int, int], _Static] = {}
        self._pool = None
        self._caches: tuple | None = None  # identities of the KV cache, state pool and rotary tables captured over

    def handles(self, batch: int) -> bool:
        return bucket_for(batch) is not None

    def run(self, seqs: list[SequenceSlots], tokens: list[int], positions: list[int], slots: list[int]
            ) -> torch.Tensor:
        """Hidden states ``[len(seqs), hidden]`` of one decode step: sequence i's new token ``tokens[i]`` at position
        ``positions[i]`` (every row's) writes KV slot ``slots[i]`` (already reserved: ``seqs[i].length`` counts
        it).  The step's inputs reach the device in two copies (one int64 block, the int32 block table)."""
        self._check_caches()
        batch = len(seqs)
        width = table_width(max(len(s.blocks) for s in seqs))
        static = self._static.get((bucket_for(batch), width)) or self._build(bucket_for(batch), width)
        columns = torch.tensor([tokens, positions, slots, [s.length for s in seqs], [s.state_slot for s in seqs]],
                               dtype=torch.int64).to(self.device)
        static.input_ids[:batch].copy_(columns[0])
        static.positions[:, :batch].copy_(columns[1].expand(self.rows, -1))
        static.slot_mapping[:batch].copy_(columns[2])
        static.seq_lens[:batch].copy_(columns[3])
        static.state_slots[:batch].copy_(columns[4])
        static.block_table[:batch].copy_(torch.tensor(block_rows(seqs, width), dtype=torch.int32))
        if static.filled > batch:
            _pad(static, batch)
        static.filled = batch
        if static.graph is None:
            static.hidden = self._forward(static)
        else:
            static.graph.replay()
        return static.hidden[:batch]

    # ------------------------------------------------------------------------------------------------- internals
    def _check_caches(self) -> None:
        """Drop every graph when the runner reallocated the KV cache, state pool or rotary tables they were captured
        over."""
        caches = (id(self.host.kv_cache), id(self.host.state_pool), self.host.max_positions)
        if caches != self._caches:
            self._static.clear()
            self._pool = None
            self._caches = caches

    def _build(self, bucket: int, width: int) -> _Static:
        dev, block_size = self.device, self.host.kv_cache.block_size
        static = _Static(
            input_ids=torch.zeros(bucket, dtype=torch.int64, device=dev),
            positions=torch.zeros(self.rows, bucket, dtype=torch.int64, device=dev),
            slot_mapping=torch.full((bucket,), -1, dtype=torch.int64, device=dev),
            block_table=torch.zeros(bucket, width, dtype=torch.int32, device=dev),
            seq_lens=torch.ones(bucket, dtype=torch.int32, device=dev),
            state_slots=torch.full((bucket,), -1, dtype=torch.int64, device=dev),
            context=None,  # type: ignore[arg-type]  (set below, over these buffers)
        )
        static.context = StepContext.decode_over(static.slot_mapping, static.block_table, static.seq_lens,
                                                 static.state_slots, block_size,
                                                 linear=self.host.state_pool is not None)
        if self.capture:
            self._capture(static)
        self._static[(bucket, width)] = static
        return static

    def _forward(self, static: _Static) -> torch.Tensor:
        positions = static.positions[0] if self.rows == 1 else static.positions
        self.host.context = static.context
        try:
            return self.model(static.input_ids, positions)
        finally:
            self.host.context = None

    def _capture(self, static: _Static) -> None:
        """Warm up on a side stream (Triton compiles and picks its configs there), then capture; the buffers hold
        padding only, so neither touches the caches."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            static.hidden = self._forward(static)
        self._pool = graph.pool()
        static.graph = graph
        logger.debug("captured decode graph: batch %d, table width %d", static.input_ids.shape[0],
                     static.block_table.shape[1])


def _pad(static: _Static, batch: int) -> None:
    """Rows ``batch..`` of the buffers back to padding (a larger batch may have left real values there)."""
    static.input_ids[batch:] = 0
    static.positions[:, batch:] = 0
    static.slot_mapping[batch:] = -1
    static.block_table[batch:] = 0
    static.seq_lens[batch:] = 1
    static.state_slots[batch:] = -1
