"""What generation returns per prompt."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationOutput:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
