"""What generation returns per prompt."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationOutput:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None

    def append(self, token: int, logprob: float, max_new_tokens: int, stop_ids: set[int] | None) -> bool:
        """Record one sampled token; False once the output is finished (a token of ``stop_ids``: "stop"; the
        ``max_new_tokens``-th token: "length"; ``stop_ids`` None: the end-of-sequence tokens are ignored)."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        if stop_ids is not None and token in stop_ids:
            self.finish_reason = "stop"
        elif len(self.token_ids) >= max_new_tokens:
            self.finish_reason = "length"
        return self.finish_reason is None
