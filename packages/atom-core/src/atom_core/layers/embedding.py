"""Token embedding and LM head, split over tensor parallelism along the vocabulary."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.host import Host
from atom_core.layers.params import copy_checked, make_param


class VocabParallelEmbedding(nn.Module):
    """Each rank holds ``ceil(V / world)`` rows; ids outside a rank's range embed to zero there and
    the all-reduce assembles the full embedding."""

    def __init__(self, vocab_size: int, hidden_size: int, *, host: Host):
        super().__init__()
        self.tp = host.tp
        self.vocab_size = vocab_size
        self.rows_per_rank = -(-vocab_size // self.tp.world_size)
        self.vocab_start = self.tp.rank * self.rows_per_rank
        self.vocab_end = min(self.vocab_start + self.rows_per_rank, vocab_size)
        self.weight = make_param((self.rows_per_rank, hidden_size), torch.get_default_dtype(), weight_loader=self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        if tuple(loaded.shape) != (self.vocab_size, param.shape[1]):
            raise ValueError(f"shape mismatch: checkpoint {tuple(loaded.shape)}, expected {(self.vocab_size, param.shape[1])}")
        rows = self.vocab_end - self.vocab_start
        if rows < self.rows_per_rank:
            param.data[rows:].zero_()
        copy_checked(param.data[:rows], loaded.narrow(0, self.vocab_start, rows))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_end - self.vocab_start)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside[..., None], 0)
        return self.tp.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """``logits = h Wᵀ`` with W split by vocabulary rows; gathered to full vocab on every rank."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight)
        if self.tp.world_size > 1:
            logits = self.tp.all_gather(logits, dim=-1)
        return logits[..., : self.vocab_size]

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight
