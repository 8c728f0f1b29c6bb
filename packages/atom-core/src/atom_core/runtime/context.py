"""Per-step metadata the native host's attention reads (set by the runner before each forward)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class StepContext:
    """One forward step over a batch of sequences, each contributing ``query_lens[b]`` new tokens.

    ``slot_mapping[t]``: the KV-cache slot token t writes (negative: a padding token, not written).
    ``block_table[b, j]`` int32: the cache block holding sequence b's tokens ``[j * block_size, (j + 1) *
    block_size)`` (past a sequence's blocks: block 0, which kernels never read for it).
    ``state_slots[b]``: sequence b's slot in the linear-attention state pool (models that have such layers).
    """

    query_lens: list[int]
    seq_lens: list[int]
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    block_size: int
    state_slots: list[int] | None = None
    _masks: dict[int | None, torch.Tensor] = field(default_factory=dict, repr=False)
    _token_index: torch.Tensor | None = field(default=None, repr=False)
    _linear: dict | None = field(default=None, repr=False)
    _paged: tuple[int, torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    _query_start_loc: torch.Tensor | None = field(default=None, repr=False)
    _slot_table: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def decode_over(cls, slot_mapping: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                    state_slots: torch.Tensor, block_size: int, linear: bool) -> StepContext:
        """A decode step (one new token per sequence) whose metadata lives only in the given device tensors, so a
        CUDA graph captured over it replays for new contents: ``block_table [B, width]`` int32 and ``seq_lens [B]``
        int32 for paged attention, ``state_slots [B]`` for linear attention (when ``linear``).  Host-side lengths
        are absent (``seq_lens`` here is empty): :meth:`mask` and :attr:`slot_table` cannot use it."""
        batch = slot_mapping.shape[0]
        ctx = cls(query_lens=[1] * batch, seq_lens=[], slot_mapping=slot_mapping, block_table=block_table,
                  block_size=block_size)
        ctx._paged = (block_size, block_table, seq_lens)
        ctx._query_start_loc = torch.arange(batch + 1, dtype=torch.int32, device=slot_mapping.device)
        if linear:
            ctx._linear = dict(num_decode_tokens=batch, decode_slots=state_slots)
        return ctx

    def _host_lengths(self) -> None:
        if len(self.seq_lens) != self.batch_size:
            raise RuntimeError("this step's lengths live on the device only (a captured decode step)")

    @property
    def slot_table(self) -> torch.Tensor:
        """``[B, max(seq_lens)]`` int64: the slot of sequence b's j-th context token (past its length: a slot of
        block 0, masked by readers), made on the device from the block table."""
        if self._slot_table is None:
            self._host_lengths()
            j = torch.arange(max(self.seq_lens), device=self.block_table.device)
            blocks = self.block_table[:, torch.div(j, self.block_size, rounding_mode="floor")].long()
            self._slot_table = blocks * self.block_size + j % self.block_size
        return self._slot_table

    @property
    def batch_size(self) -> int:
        return len(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    def token_index(self) -> torch.Tensor:
        """Flat index into ``[B * max_query_len]`` of each packed token (for padding/unpadding)."""
        if self._token_index is None:
            width = self.max_query_len
            self._token_index = torch.cat(
                [b * width + torch.arange(n) for b, n in enumerate(self.query_lens)]
            ).to(self.slot_mapping.device)
        return self._token_index

    def paged(self, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(block_table [B, ceil(max_seq_len / block_size)] int32, seq_lens [B] int32)`` for paged kernels over a
        cache of ``block_size`` (another block size than the step's: made from :attr:`slot_table`)."""
        if self._paged is None or self._paged[0] != block_size:
            if block_size == self.block_size:
                table = self.block_table
            else:
                table = torch.div(self.slot_table[:, ::block_size], block_size, rounding_mode="floor").to(torch.int32)
            lens = torch.tensor(self.seq_lens, dtype=torch.int32, device=self.slot_mapping.device)
            self._paged = (block_size, table.contiguous(), lens)
        return self._paged[1], self._paged[2]

    def query_start_loc(self) -> torch.Tensor:
        """``[B + 1]`` int32: sequence b's new tokens are packed tokens ``[query_start_loc[b], query_start_loc[b + 1])``."""
        if self._query_start_loc is None:
            starts = [0]
            for n in self.query_lens:
                starts.append(starts[-1] + n)
            self._query_start_loc = torch.tensor(starts, dtype=torch.int32, device=self.slot_mapping.device)
        return self._query_start_loc

    def mask(self, sliding_window: int | None) -> torch.Tensor:
        """``[B, 1, max_query_len, max_seq_len]`` bool: key j visible to query i of sequence b."""
        self._host_lengths()
        if sliding_window not in self._masks:
            device = self.slot_mapping.device
            seq = torch.tensor(self.seq_lens, device=device)[:, None, None]
            start = seq - torch.tensor(self.query_lens, device=device)[:, None, None]
            q_pos = start + torch.arange(self.max_query_len, device=device)[None, :, None]
            k_pos = torch.arange(max(self.seq_lens), device=device)[None, None, :]
            visible = (k_pos <= q_pos) & (k_pos < seq)
            if sliding_window is not None:
                visible &= q_pos - k_pos < sliding_window
            self._masks[sliding_window] = visible[:, None]
        return self._masks[sliding_window]

    def linear_attention_metadata(self) -> dict:
        """The step's :class:`atom_core.host.LinearAttentionStep` fields other than the pools.

        A batch where every sequence adds one token to an existing context is a decode step; any other
        batch runs every sequence as a prefill (continuing from its state when it has context).
        """
        if self._linear is None:
            if self.state_slots is None:
                raise RuntimeError("this step has no linear-attention state slots")
            device = self.slot_mapping.device
            slots = torch.tensor(self.state_slots, dtype=torch.int64, device=device)
            context = [s - q for s, q in zip(self.seq_lens, self.query_lens)]
            if all(q == 1 for q in self.query_lens) and all(c > 0 for c in context):
                self._linear = dict(num_decode_tokens=len(self.query_lens), decode_slots=slots)
            else:
                cu = [0]
                for q in self.query_lens:
                    cu.append(cu[-1] + q)
                self._linear = dict(
                    num_prefill_tokens=cu[-1], prefill_cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=device),
                    prefill_slots=slots, prefill_has_initial_state=torch.tensor([c > 0 for c in context], device=device),
                )
        return self._linear
