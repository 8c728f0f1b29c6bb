"""Greedy and temperature/top-p sampling, with the log-probability of each chosen token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_core.errors import UsageError


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise UsageError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0 or self.temperature == float("inf"):  # NaN fails too
            raise UsageError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top_p must be in (0, 1], got {self.top_p}")


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches ``top_p`` (the top token always)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative - sorted_logits.softmax(dim=-1) >= top_p  # mass before this token already enough
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None):
    """``logits [B, V]`` -> (token ids ``[B]``, their log-probabilities under the model ``[B]``)."""
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    if params.temperature == 0:
        tokens = logits.argmax(dim=-1)
    else:
        probs = torch.softmax(top_p_filter(logits / params.temperature, params.top_p), dim=-1)
        tokens = torch.multinomial(probs.cpu(), 1, generator=generator).view(-1).to(logits.device)
    return tokens, logprobs.gather(-1, tokens[:, None]).view(-1)
