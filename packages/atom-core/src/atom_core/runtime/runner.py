"""Run an ATOM model natively: load a checkpoint directory, prefill a batch of prompts together, then
decode them step by step over the paged KV cache."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from atom_core import catalog
from atom_core.build import build_model
from atom_core.config import load_hf_config, text_config
from atom_core.errors import CheckpointError, DeviceUnavailableError, UsageError
from atom_core.host import TensorParallel
from atom_core.layers.rotary import grow_position_tables
from atom_core.loader import Checkpoint
from atom_core.lora import LoraSet, attach_adapters, load_adapter
from atom_core.paths import inside, read_json_object
from atom_core.runtime.context import StepContext
from atom_core.runtime.graphs import DecodeGraphs
from atom_core.runtime.host import NativeHost
from atom_core.runtime.kv_cache import SequenceSlots, block_rows
from atom_core.runtime.multimodal import ImageInputs, Prompt, as_prompt
from atom_core.runtime.outputs import GenerationOutput
from atom_core.runtime.positions import PositionPlan
from atom_core.runtime.sampler import SamplingParams, sample
from atom_core.runtime.speculative import SpeculativeDecoder

logger = logging.getLogger(__name__)

GENERATION_CONFIG = "generation_config.json"


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` (None: CUDA when present, else the CPU); a CUDA device this machine does not have is a
    :class:`DeviceUnavailableError` before anything is built on it."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            built = torch.version.cuda is not None or torch.version.hip is not None
            why = "no GPU is visible" if built else "this torch build has no CUDA"
            raise DeviceUnavailableError(f"device {str(device)!r} asked for, but {why} (torch {torch.__version__}); "
                                         "run on the CPU instead (--device cpu)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceUnavailableError(f"device {str(device)!r} asked for, but only {torch.cuda.device_count()} "
                                         "GPU(s) are visible")
    return device


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int, max_positions: int | None = None,
                  max_new_tokens: int = 0) -> None:
    """A :class:`UsageError` naming the prompt and token when a prompt is empty, holds an id outside
    ``[0, vocab_size)``, or would run past ``max_positions`` with ``max_new_tokens`` more tokens."""
    if not prompts:
        raise UsageError("no prompts given")
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise UsageError(f"prompt {i} is empty: every prompt needs at least one token")
        bad = next(((pos, t) for pos, t in enumerate(prompt) if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise UsageError(f"prompt {i}: token id {bad[1]} (position {bad[0]}) is outside the model's vocabulary "
                             f"[0, {vocab_size})")
        if max_positions is not None and len(prompt) + max_new_tokens > max_positions:
            raise UsageError(f"prompt {i}: {len(prompt)} prompt tokens + max_new_tokens {max_new_tokens} exceed the "
                             f"model's {max_positions} positions (max_position_embeddings)")


INITIAL_POSITIONS = 8192  # the rotary tables' first size; grown to what a batch needs (never by the config alone)


class Runner:
    def __init__(self, model_dir: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 block_size: int = 16, tp: TensorParallel | None = None, quantization: str | None = None,
                 cuda_graphs: bool | None = None, lora: Mapping[str, str | Path] | None = None,
                 speculative_tokens: int = 0, draft_model: str | Path | None = None):
        """``lora``: adapter name -> peft adapter directory; a prompt picks one by name (``adapters=`` of
        :meth:`generate` and :meth:`prompt_logits`), several in one batch.  Decode steps run eagerly with adapters.
        ``speculative_tokens``: greedy drafts per step from the checkpoint's draft layers, or from the separate draft
        checkpoint ``draft_model`` (an EAGLE-3 head) when given (0: none)."""
        self.model_dir = Path(model_dir)
        self.device = resolve_device(device)
        self.dtype = dtype
        self.block_size = block_size
        self.hf_config = load_hf_config(self.model_dir)
        self.spec = catalog.resolve(self.hf_config)
        self.max_position_embeddings = text_config(self.hf_config).max_position_embeddings
        positions = min(INITIAL_POSITIONS, self.max_position_embeddings)
        with torch.device(self.device), _default_dtype(dtype):
            self.model, self.host = build_model(
                self.hf_config, lambda quant: NativeHost(tp=tp, quant=quant, max_positions=positions),
                spec=self.spec, online=quantization)
        self.model.load_weights(Checkpoint(self.model_dir))
        self.model.eval()
        self.lora: LoraSet | None = None
        if lora:
            self.lora = attach_adapters(self.model, [load_adapter(name, path) for name, path in lora.items()])
            cuda_graphs = False  # the captured decode steps do not read the per-token adapter index
        self.eos_token_ids = _eos_ids(self.hf_config, self.model_dir)
        self.position_rows = self.model.position_rows  # 3: the model wants MRoPE positions
        # decode steps replayed from CUDA graphs per batch bucket: on by default on a GPU (captured, replayed and equal
        # to eager there), off elsewhere; on the CPU, True runs the same padded steps eagerly (what the tests check)
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda"
        self.decode_graphs = DecodeGraphs(self.model, self.host, self.device, self.position_rows) if cuda_graphs else None
        # greedy speculative decoding with the checkpoint's draft layers (built over the same host, before any
        # KV cache is allocated, so the cache holds their layers too)
        self.speculative = None
        if speculative_tokens and self.lora is not None:
            raise UsageError("speculative decoding with LoRA adapters is not supported: the draft layers would run "
                             "without the adapters (give one of speculative_tokens / lora)")
        if draft_model is not None and not speculative_tokens:
            raise UsageError(f"a draft model ({draft_model}) is given but speculative_tokens is 0: give both")
        if speculative_tokens:
            with torch.device(self.device), _default_dtype(dtype):
                self.speculative = SpeculativeDecoder(self, speculative_tokens, draft_model)

    # ------------------------------------------------------------------------------------- steps
    def _ensure_cache(self, slots_needed: int) -> None:
        blocks = -(-slots_needed // self.block_size)
        cache = self.host.kv_cache
        if cache is None or cache.num_blocks < blocks:
            self.host.allocate_kv_cache(blocks, self.block_size, self.dtype, self.device)

    def _ensure_positions(self, longest: int) -> None:
        """Rotary tables covering sequences of ``longest`` tokens (doubled when grown, up to the config's
        max_position_embeddings unless a sequence is longer still)."""
        current = self.host.max_positions
        if longest <= current:
            return
        length = max(longest, min(2 * current, self.max_position_embeddings))
        grow_position_tables(self.model, length)
        self.host.max_positions = length

    def _new_sequences(self, count: int) -> list[SequenceSlots]:
        """Fresh sequences, each with a linear-attention state slot when the model has such layers."""
        seqs = [SequenceSlots() for _ in range(count)]
        pool = self.host.allocate_state_pool(count, self.device)
        if pool is not None:
            for seq in seqs:
                seq.state_slot = pool.allocate()
        return seqs

    def _release(self, seqs: list[SequenceSlots]) -> None:
        self.host.kv_cache.allocator.release([b for s in seqs for b in s.blocks])
        if self.host.state_pool is not None:
            self.host.state_pool.release([s.state_slot for s in seqs])

    def _position_plan(self, prompt: Prompt) -> PositionPlan:
        if self.position_rows == 1:
            return PositionPlan()
        grid = prompt.images.image_grid_thw if prompt.images is not None else None
        positions, delta = self.model.prompt_positions(prompt.token_ids, grid)
        return PositionPlan(rows=self.position_rows, prompt=positions, delta=delta)

    def _multimodal_inputs(self, input_ids: torch.Tensor, images: list[ImageInputs]) -> dict:
        """``forward`` keyword arguments carrying this step's images (the model embeds them)."""
        if catalog.MULTIMODAL not in self.spec.capabilities:
            raise UsageError(f"{self.spec.name} does not take images")
        pixels = torch.cat([im.pixel_values for im in images]).to(self.device)
        grids = torch.cat([im.image_grid_thw for im in images])
        return self.model.multimodal_forward_inputs(input_ids, pixels, grids)

    def _adapter_indices(self, adapters: Sequence[str | None] | None, count: int) -> list[int] | None:
        """Each prompt's adapter index (None: no prompt uses one)."""
        if adapters is None or all(a is None for a in adapters):
            return None
        if len(adapters) != count:
            raise UsageError(f"{len(adapters)} adapter names for {count} prompts: give one per prompt (None for none)")
        if self.lora is None:
            raise UsageError("an adapter is asked for, but the runner was built without LoRA adapters (lora=)")
        return [self.lora.index(a) for a in adapters]

    def _step(self, seqs: list[SequenceSlots], new_tokens: list[list[int]], plans: list[PositionPlan],
              images: list[ImageInputs] | None = None, adapters: list[int] | None = None) -> torch.Tensor:
        """Run the model over each sequence's new tokens; returns hidden states ``[sum(new), H]``."""
        allocator = self.host.kv_cache.allocator
        starts = [s.length for s in seqs]
        slot_mapping = [slot for s, toks in zip(seqs, new_tokens) for slot in s.grow(len(toks), self.block_size, allocator)]
        ctx = StepContext(
            query_lens=[len(t) for t in new_tokens],
            seq_lens=[s.length for s in seqs],
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=self.device),
            block_table=torch.tensor(block_rows(seqs), dtype=torch.int32, device=self.device),
            block_size=self.block_size,
            state_slots=[s.state_slot for s in seqs],
        )
        input_ids = torch.tensor([t for toks in new_tokens for t in toks], dtype=torch.int64, device=self.device)
        positions = torch.cat(
            [plan.positions(start, len(toks)) for plan, start, toks in zip(plans, starts, new_tokens)], dim=1
        ).to(self.device)
        if self.position_rows == 1:
            positions = positions[0]
        kwargs = self._multimodal_inputs(input_ids, images) if images else {}
        self.host.context = ctx
        if adapters is not None:
            self.lora.token_adapter = torch.tensor([i for i, toks in zip(adapters, new_tokens) for _ in toks],
                                                   dtype=torch.int64, device=self.device)
        try:
            return self.model(input_ids, positions, **kwargs)
        finally:
            self.host.context = None
            if self.lora is not None:
                self.lora.token_adapter = None

    def _decode_step(self, seqs: list[SequenceSlots], tokens: list[int], plans: list[PositionPlan]) -> torch.Tensor:
        """One new token per sequence, through the decode graphs: hidden states ``[len(seqs), H]``."""
        allocator = self.host.kv_cache.allocator
        positions = [plan.decode_position(s.length) for plan, s in zip(plans, seqs)]
        slots = [s.grow(1, self.block_size, allocator)[0] for s in seqs]
        return self.decode_graphs.run(seqs, tokens, positions, slots)

    def _graph_step(self, seqs: list[SequenceSlots], new_tokens: list[list[int]], images) -> bool:
        """Whether this step goes through the decode graphs: one token per sequence, each with context."""
        return (self.decode_graphs is not None and not images and self.decode_graphs.handles(len(seqs))
                and all(len(t) == 1 and s.length > 0 for s, t in zip(seqs, new_tokens)))

    @torch.inference_mode()
    def prompt_logits(self, prompts: Sequence[Sequence[int] | Prompt],
                      adapters: Sequence[str | None] | None = None) -> list[torch.Tensor]:
        """Logits at every position of each prompt, all prompts prefilled in one batch (``adapters``: each
        prompt's LoRA adapter name, or None)."""
        prompts = [as_prompt(p) for p in prompts]
        adapter_ids = self._adapter_indices(adapters, len(prompts))
        check_prompts([p.token_ids for p in prompts], text_config(self.hf_config).vocab_size)
        images = [p.images for p in prompts if p.images is not None]
        self._ensure_cache(sum(len(p.token_ids) for p in prompts) + self.block_size * len(prompts))
        self._ensure_positions(max(len(p.token_ids) for p in prompts))
        seqs = self._new_sequences(len(prompts))
        try:
            hidden = self._step(seqs, [p.token_ids for p in prompts], [self._position_plan(p) for p in prompts], images,
                                adapter_ids)
            logits = self.model.compute_logits(hidden).float()
            return list(logits.split([len(p.token_ids) for p in prompts]))
        finally:
            self._release(seqs)

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int] | Prompt], params: SamplingParams | None = None,
                 on_token: Callable[[int, int], None] | None = None,
                 adapters: Sequence[str | None] | None = None) -> list[GenerationOutput]:
        """Generate for every prompt at once; ``on_token(prompt_index, token)`` is called for each token as it is
        sampled (streaming), before the outputs are returned; ``adapters``: each prompt's LoRA adapter name, or
        None."""
        params = params or SamplingParams()
        prompt_inputs = [as_prompt(p) for p in prompts]
        adapter_ids = self._adapter_indices(adapters, len(prompt_inputs))
        prompts = [p.token_ids for p in prompt_inputs]
        if self.speculative is not None:
            if any(p.images is not None for p in prompt_inputs):
                raise UsageError("speculative decoding takes text prompts only: images were given")
            limit = self.model.decoder_config.max_position
            check_prompts(prompts, text_config(self.hf_config).vocab_size, limit, params.max_new_tokens)
            return self.speculative.generate(prompts, params, on_token)
        plans = [self._position_plan(p) for p in prompt_inputs]
        images = [p.images for p in prompt_inputs if p.images is not None]  # all consumed by the prefill step
        limit = self.model.decoder_config.max_position if hasattr(self.model, "decoder_config") else None
        check_prompts(prompts, text_config(self.hf_config).vocab_size, limit, params.max_new_tokens)
        self._ensure_cache(sum(len(p) + params.max_new_tokens for p in prompts) + self.block_size * len(prompts))
        self._ensure_positions(max(len(p) for p in prompts) + params.max_new_tokens)
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        stop_ids = None if params.ignore_eos else self.eos_token_ids
        outputs = [GenerationOutput(list(p)) for p in prompts]
        seqs = self._new_sequences(len(prompts))
        active = list(range(len(prompts)))
        pending = [list(p) for p in prompts]
        try:
            while active:
                step = ([seqs[i] for i in active], [pending[i] for i in active], [plans[i] for i in active])
                if self._graph_step(step[0], step[1], images):
                    hidden = self._decode_step(step[0], [t for (t,) in step[1]], step[2])
                else:
                    hidden = self._step(*step, images, [adapter_ids[i] for i in active] if adapter_ids else None)
                images = None
                if hidden.shape[0] != len(active):  # prompt tokens in this step: each sequence's last token
                    hidden = hidden[torch.tensor([len(pending[i]) for i in active], device=self.device).cumsum(0) - 1]
                tokens, logprobs = sample(self.model.compute_logits(hidden), params, generator)
                tokens, logprobs = torch.stack([tokens.double(), logprobs.double()]).tolist()  # one copy to the host
                still = []
                for i, token, logprob in zip(active, map(int, tokens), logprobs):
                    if on_token is not None:
                        on_token(i, token)
                    if outputs[i].append(token, logprob, params.max_new_tokens, stop_ids):
                        pending[i] = [token]
                        still.append(i)
                active = still
        finally:
            self._release(seqs)
        return outputs


class _default_dtype:
    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def __enter__(self):
        self.previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.previous)


def _eos_ids(hf_config, model_dir: Path) -> set[int]:
    """The end-of-sequence token ids of the config and of ``generation_config.json`` (when present)."""
    ids: set[int] = set()
    for source in (text_config(hf_config), hf_config):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            ids.update(_token_ids(eos, "config.json: eos_token_id", model_dir))
    gen = inside(model_dir, GENERATION_CONFIG)
    if gen.is_file():
        eos = read_json_object(gen).get("eos_token_id")
        if eos is not None:
            ids.update(_token_ids(eos, f"{GENERATION_CONFIG}: eos_token_id", model_dir))
    return ids


def _token_ids(value, field: str, model_dir: Path) -> list[int]:
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise CheckpointError(f"{model_dir}/{field} must be a token id or a list of them, got {value!r}")
    return values
