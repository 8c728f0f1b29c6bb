"""Greedy speculative decoding in the native runner: a draft model (the checkpoint's multi-token-prediction layers, or
an EAGLE-3 head from a checkpoint of its own) guesses ``k`` tokens, the target checks them all in one forward, and the
longest prefix it agrees with is kept together with the target's own next token (the bonus), so the output equals
greedy decoding without drafts.

Per sequence, ``P`` positions hold the target's KV and ``pending`` is the token for position ``P``.  A round:

1. draft: the draft layer runs over the positions the target finished since its last run, each with the target's
   hidden state there (EAGLE-3: the ones entering the three target layers it names, concatenated) and the token after
   it (the last one is ``pending``), then ``k - 1`` more single steps on its own guesses (each taking the previous
   step's recycled hidden state); it guesses ``x_1 .. x_k`` for positions ``P + 1 .. P + k``;
2. verify: the target runs over ``[pending, x_1 .. x_k]`` at positions ``P .. P + k``; its greedy tokens ``y_0 .. y_k``;
3. accept: ``n`` = the longest run with ``x_j = y_{j-1}``; ``x_1 .. x_n, y_n`` are emitted, ``P`` becomes
   ``P + n + 1`` and the KV of the rejected positions is discarded (their blocks go back to the allocator).

The draft is built over the target's host, so its layer caches K/V in the same slots as the target for each position;
positions the draft wrote from its own guesses are rewritten from the target's hidden states in the next round.

A hybrid target (Gated DeltaNet layers, :mod:`atom_core.runtime.state_pool`) keeps a recurrent state per sequence that
the verify step advances over every drafted token, accepted or not, and that cannot be truncated like the KV cache:
the states are saved before the verify step, and for a sequence with rejected drafts put back and advanced again over
the accepted tokens only (``pending, x_1 .. x_n``), which also rewrites their KV with the same values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from atom_core import catalog
from atom_core.config import load_hf_config
from atom_core.config_checks import config_file
from atom_core.errors import UsageError
from atom_core.loader import Checkpoint
from atom_core.runtime.context import StepContext
from atom_core.runtime.kv_cache import SequenceSlots, block_rows
from atom_core.runtime.outputs import GenerationOutput
from atom_core.runtime.sampler import SamplingParams, sample
from atom_core.runtime.state_pool import StateSnapshot


@dataclass
class DraftStats:
    """Draft tokens proposed and accepted over a generation (acceptance rate = accepted / proposed)."""

    proposed: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


@dataclass
class _Sequence:
    slots: SequenceSlots
    tokens: list[int]  # prompt + emitted tokens; tokens[P] is the pending token
    hidden: list[torch.Tensor] = field(default_factory=list)  # what the draft reads of the target at [drafted, P)
    drafted: int = 0  # positions before this one went through the draft with the target's hidden state


class SpeculativeDecoder:
    """The draft model of ``runner``'s checkpoint over the runner's host, and the greedy draft-verify loop."""

    def __init__(self, runner: Any, num_draft_tokens: int, draft_dir: str | Path | None = None):
        """``runner``: the :class:`atom_core.runtime.runner.Runner` whose model, host and sequences this decoder uses;
        ``draft_dir``: a separate draft checkpoint (EAGLE-3), None: the draft layers of the target's checkpoint."""
        if num_draft_tokens < 1:
            raise UsageError(f"speculative decoding needs at least 1 draft token, got {num_draft_tokens}")
        if runner.position_rows != 1:
            raise UsageError(f"{runner.spec.name}: speculative decoding takes models with plain (one-row) positions")
        self.runner = runner
        self.num_draft_tokens = num_draft_tokens
        if draft_dir is None:
            self.spec = catalog.draft_for(runner.spec)
            self.model = self.spec.model_class()(runner.hf_config, runner.host)
            self.model.load_weights(Checkpoint(runner.model_dir))
        else:
            draft_config = load_hf_config(draft_dir)
            self.spec = catalog.draft_for(runner.spec, list(getattr(draft_config, "architectures", None) or []),
                                          where=config_file(draft_config))
            checkpoint = Checkpoint(draft_dir)
            self.model = self.spec.model_class()(draft_config, runner.host, target=runner.model,
                                                 checkpoint_names=checkpoint.weight_map)
            self.model.load_weights(checkpoint)
        self.model.eval()
        # the target's hidden states the draft reads: its final ones, or (EAGLE-3) those entering the layers it names
        self.aux_layers = tuple(getattr(self.model, "aux_hidden_state_layers", ()))
        self.stats = DraftStats()

    # ------------------------------------------------------------------------------------- steps
    def _forward(self, model_call: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], seqs: list[SequenceSlots],
                 starts: list[int], tokens: list[list[int]]) -> torch.Tensor:
        """Run ``model_call(input_ids, positions)`` over tokens at positions ``[start, start + len)`` of each
        sequence (growing it when they reach past its slots); attention sees positions ``< start + len``."""
        runner = self.runner
        bs, allocator = runner.block_size, runner.host.kv_cache.allocator
        for seq, start, toks in zip(seqs, starts, tokens):
            if start + len(toks) > seq.length:
                seq.grow(start + len(toks) - seq.length, bs, allocator)
        ends = [start + len(toks) for start, toks in zip(starts, tokens)]

        def slot(seq: SequenceSlots, pos: int) -> int:
            return seq.blocks[pos // bs] * bs + pos % bs

        ctx = StepContext(
            query_lens=[len(t) for t in tokens], seq_lens=ends,
            slot_mapping=torch.tensor([slot(s, p) for s, a, e in zip(seqs, starts, ends) for p in range(a, e)],
                                      dtype=torch.int64, device=runner.device),
            block_table=torch.tensor(block_rows(seqs), dtype=torch.int32, device=runner.device), block_size=bs,
            state_slots=[s.state_slot for s in seqs],
        )
        input_ids = torch.tensor([t for toks in tokens for t in toks], dtype=torch.int64, device=runner.device)
        positions = torch.tensor([p for a, e in zip(starts, ends) for p in range(a, e)], dtype=torch.int64,
                                 device=runner.device)
        runner.host.context = ctx
        try:
            return model_call(input_ids, positions)
        finally:
            runner.host.context = None

    def _target_call(self, input_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's ``(hidden states, what the draft reads at those positions)``: its final hidden states, or
        (EAGLE-3) the ones entering the layers the draft names, concatenated.  The target records them for these
        calls only: its other callers (``Runner.prompt_logits``) get its hidden states alone."""
        model = self.runner.model
        if not self.aux_layers:
            hidden = model(input_ids, positions)
            return hidden, hidden
        model.set_aux_hidden_state_layers(self.aux_layers)
        try:
            hidden, aux = model(input_ids, positions)
        finally:
            model.set_aux_hidden_state_layers(())
        return hidden, torch.cat(aux, dim=-1)

    def _draft_call(self, input_ids: torch.Tensor, positions: torch.Tensor, *, previous: torch.Tensor,
                    step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model(input_ids, positions, previous, step)

    def _draft(self, seqs: list[_Sequence], counts: list[int]) -> list[list[int]]:
        """``counts[b]`` draft tokens for each sequence (none where it is 0)."""
        rows = [b for b, c in enumerate(counts) if c > 0]
        drafts: list[list[int]] = [[] for _ in seqs]
        if not rows:
            return drafts
        batch = [seqs[b] for b in rows]
        starts = [s.drafted for s in batch]
        ends = [s.slots.length for s in batch]  # P: the pending token's position
        previous = torch.cat([torch.cat(s.hidden) for s in batch])
        out, recycled = self._forward(partial(self._draft_call, previous=previous, step=0), [s.slots for s in batch],
                                      starts, [s.tokens[a + 1 : e + 1] for s, a, e in zip(batch, starts, ends)])
        last = torch.tensor([e - a for a, e in zip(starts, ends)], device=out.device).cumsum(0) - 1
        hidden, recycled = out[last], recycled[last]
        for s, e in zip(batch, ends):
            s.drafted, s.hidden = e, []
        for step in range(max(counts[b] for b in rows)):
            guesses = self.model.compute_logits(hidden, step).argmax(dim=-1).tolist()
            for b, g in zip(rows, guesses):
                if len(drafts[b]) < counts[b]:
                    drafts[b].append(g)
            live = [i for i, b in enumerate(rows) if len(drafts[b]) < counts[b]]
            if not live:
                break
            hidden, recycled = self._forward(partial(self._draft_call, previous=recycled[live], step=step + 1),
                                   [batch[i].slots for i in live], [ends[i] + step for i in live],
                                   [[drafts[rows[i]][-1]] for i in live])
            rows, batch, ends = [rows[i] for i in live], [batch[i] for i in live], [ends[i] for i in live]
        return drafts

    def _replay_accepted(self, saved: StateSnapshot, rows: list[int], seqs: list[_Sequence], starts: list[int]) -> None:
        """Roll the linear-attention states of ``seqs`` (rows ``rows`` of ``saved``, taken before the verify step that
        started at ``starts``) back, then advance them over the tokens they kept: ``tokens[start .. P)``."""
        self.runner.host.state_pool.restore(saved, rows)
        self._forward(self._target_call, [s.slots for s in seqs], starts,
                      [s.tokens[start : s.slots.length] for s, start in zip(seqs, starts)])

    # ------------------------------------------------------------------------------------- generation
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 on_token: Callable[[int, int], None] | None = None) -> list[GenerationOutput]:
        if params.temperature != 0:
            raise UsageError(f"speculative decoding is greedy only: temperature must be 0, got {params.temperature}")
        runner = self.runner
        k = self.num_draft_tokens
        self.stats = DraftStats()
        prompts = [list(p) for p in prompts]
        runner._ensure_cache(sum(len(p) + params.max_new_tokens + k for p in prompts) + runner.block_size * len(prompts))
        runner._ensure_positions(max(len(p) for p in prompts) + params.max_new_tokens + k)
        outputs = [GenerationOutput(list(p)) for p in prompts]
        seqs = [_Sequence(slots, list(p)) for slots, p in zip(runner._new_sequences(len(prompts)), prompts)]
        allocator = runner.host.kv_cache.allocator

        stop_ids = None if params.ignore_eos else runner.eos_token_ids

        def emit(i: int, token: int, logprob: float) -> bool:
            """Record one token of sequence i; False once it is finished."""
            if on_token is not None:
                on_token(i, token)
            return outputs[i].append(token, logprob, params.max_new_tokens, stop_ids)

        try:
            hidden, for_draft = self._forward(self._target_call, [s.slots for s in seqs], [0] * len(seqs), prompts)
            last = torch.tensor([len(p) for p in prompts], device=hidden.device).cumsum(0) - 1
            tokens, logprobs = sample(runner.model.compute_logits(hidden[last]), params)
            active = []
            for i, (seq, h, token, logprob) in enumerate(zip(seqs, for_draft.split([len(p) for p in prompts]),
                                                             tokens.tolist(), logprobs.tolist())):
                seq.hidden, seq.tokens = [h], seq.tokens + [token]
                if emit(i, token, logprob):
                    active.append(i)
            while active:
                batch = [seqs[i] for i in active]
                # a sequence needing r more tokens drafts at most r - 1: positions stay within the prompt + max_new_tokens
                counts = [min(k, params.max_new_tokens - len(outputs[i].token_ids) - 1) for i in active]
                starts = [s.slots.length for s in batch]  # P, before the draft's own steps grow the sequences
                drafts = self._draft(batch, counts)
                verify = [[s.tokens[p]] + d for s, p, d in zip(batch, starts, drafts)]
                pool = runner.host.state_pool
                saved = pool.save([s.slots.state_slot for s in batch]) if pool is not None else None
                hidden, for_draft = self._forward(self._target_call, [s.slots for s in batch], starts, verify)
                tokens, logprobs = sample(runner.model.compute_logits(hidden), params)
                tokens, logprobs = tokens.tolist(), logprobs.tolist()
                still, offset, rejected = [], 0, []
                for row, (i, seq, start, draft, h) in enumerate(zip(active, batch, starts, drafts,
                                                                    for_draft.split([len(v) for v in verify]))):
                    target = tokens[offset : offset + len(draft) + 1]
                    target_lp = logprobs[offset : offset + len(draft) + 1]
                    offset += len(draft) + 1
                    n = 0
                    while n < len(draft) and draft[n] == target[n]:
                        n += 1
                    self.stats.proposed += len(draft)
                    self.stats.accepted += n
                    going = True
                    for j in range(n + 1):
                        going = emit(i, target[j], target_lp[j])
                        if not going:
                            break
                    seq.tokens += target[: n + 1]
                    seq.hidden.append(h[: n + 1])
                    seq.slots.truncate(start + n + 1, runner.block_size, allocator)
                    if going:
                        still.append(i)
                        if n < len(draft):
                            rejected.append(row)
                if saved is not None and rejected:
                    self._replay_accepted(saved, rejected, [batch[r] for r in rejected], [starts[r] for r in rejected])
                active = still
        finally:
            runner._release([s.slots for s in seqs])
        return outputs

    @torch.inference_mode()
    def draft_logits(self, prompt: Sequence[int], next_token: int) -> torch.Tensor:
        """The draft's logits at every position of ``prompt`` (position p guesses token p + 2, given the target's
        hidden state at p and token p + 1; ``next_token`` follows the prompt): ``[len(prompt), vocab]``."""
        runner = self.runner
        prompt = list(prompt)
        runner._ensure_cache(len(prompt) + runner.block_size)
        runner._ensure_positions(len(prompt))
        (slots,) = runner._new_sequences(1)
        try:
            _, hidden = self._forward(self._target_call, [slots], [0], [prompt])
            out, _ = self._forward(lambda ids, pos: self.model(ids, pos, hidden, 0), [slots], [0],
                                   [prompt[1:] + [next_token]])
            return self.model.compute_logits(out).float()
        finally:
            runner._release([slots])
