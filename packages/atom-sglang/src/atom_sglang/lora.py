"""SGLang's LoRA manager driving ATOM's linear layers (``--enable-lora``, ``--lora-paths``).

SGLang loads, batches and evicts the adapters as it does for its own classes: its memory pool holds each adapter
in a slot of per-layer buffers (A ``[slots, K r, in]``, the K output shards of a fused layer stacked at the
adapter's rank r; B ``[slots, out, r]``, unscaled), and :class:`AtomLinearWithLoRA` (an SGLang
``BaseLayerWithLoRA``) gives each of ATOM's linear layers an :class:`atom_core.lora.LoraSlots` of the pool's
``max_loras_per_batch`` slots at ``max_lora_rank``.  When SGLang reports new contents of a slot
(``on_lora_slots_updated``) the layer copies that slot from the pool into its ``LoraSlots`` at the next step, once
the batch info gives the slot's rank.  The layer adds the delta itself, over any base weight format; each token's
slot and scaling come from the LoRA backend's batch info (segments of requests, each with its slot; a slot of rank
0, SGLang's slot for requests without an adapter, gives ``-1``: the base output).

Refused here, one line each: an SGLang release whose LoRA internals were not checked
(:data:`atom_sglang.compat.LORA_INTERNALS_CHECKED`), tensor parallelism with LoRA, adapters on modules that are not
ATOM linear layers (MoE experts, embeddings, the LM head): :func:`hidden_dims` and the layer hook name them.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from atom_core.errors import UnsupportedConfigError
from atom_core.layers.linear import LinearBase
from atom_core.lora import LoraSlots
from atom_sglang import compat


def adapts(module: Any) -> bool:
    """An ATOM linear layer that applies a LoRA delta in its forward (not latent attention's absorbed kv_b_proj)."""
    return isinstance(module, LinearBase) and module.adapts_in_forward


class BatchTokens:
    """Each token's slot (``token_adapter``, ``-1``: none) and scaling (``token_scale``) for
    :class:`~atom_core.lora.LoraSlots`, from the SGLang LoRA backend's current batch info (None outside a step)."""

    def __init__(self, backend: Any):
        self.backend = backend

    def _slots(self, info: Any) -> torch.Tensor:
        segments = info.num_segments
        slot = torch.repeat_interleave(info.weight_indices[:segments].long(), info.seg_lens[:segments].long())
        if info.permutation is not None:  # segments cover the rows in this order
            slot = torch.empty_like(slot).scatter_(0, info.permutation.long(), slot)
        return slot

    @property
    def token_adapter(self) -> torch.Tensor | None:
        info = self.backend.get_batch_info()
        if info is None:
            return None
        slot = self._slots(info)
        return torch.where(info.lora_ranks.long()[slot] > 0, slot, torch.full_like(slot, -1))

    @property
    def token_scale(self) -> torch.Tensor | None:
        info = self.backend.get_batch_info()
        return None if info is None else info.scalings.float()[self._slots(info)]


@functools.cache
def wrapper_class() -> type:
    """``AtomLinearWithLoRA``, built on first use (it subclasses SGLang's ``BaseLayerWithLoRA``)."""
    base = compat.lora_layer_base()

    class AtomLinearWithLoRA(base):
        """One of ATOM's linear layers under SGLang's LoRA manager (plain, row, column, fused q|k|v and gate|up)."""

        def __init__(self, base_layer: LinearBase, lora_backend: Any):
            super().__init__(base_layer, lora_backend)
            self.tokens = BatchTokens(lora_backend)
            self.slots = lora_backend.max_loras_per_batch
            self.pending: set[int] = set()  # slots whose pool contents changed since they were copied
            self.A_buffer = self.B_buffer = None
            self.forwards_to_layer = True

        def __getattr__(self, name: str) -> Any:
            """The model's own calls (``qkv_proj.split``...) and attributes reach ATOM's layer."""
            try:
                return super().__getattr__(name)
            except AttributeError:
                if not self.__dict__.get("forwards_to_layer") or name.startswith("_"):
                    raise  # SGLang's __init__ asks hasattr(self, ...) before it sets its own attributes
                return getattr(self.base_layer, name)

        def set_lora_info(self, A_buffer: torch.Tensor, B_buffer: torch.Tensor) -> None:
            """The pool's buffers of this layer: A ``[slots, K max_rank, in]``, B ``[slots, out, max_rank]``."""
            self.set_lora = True
            self.A_buffer, self.B_buffer = A_buffer, B_buffer
            shards = len(self.base_layer.out_partitions)
            if A_buffer.shape[1] % shards or B_buffer.shape[1] != sum(self.base_layer.out_partitions):
                raise UnsupportedConfigError(
                    f"{self.base_layer.prefix}: SGLang's LoRA buffers A {tuple(A_buffer.shape)} / B "
                    f"{tuple(B_buffer.shape)} do not fit ATOM's layer ({shards} shards of {self.base_layer.out_partitions})"
                )
            rank = A_buffer.shape[1] // shards
            lora = self.base_layer.lora
            if not isinstance(lora, LoraSlots) or lora.rank != rank:
                self.base_layer.lora = LoraSlots(self.tokens, self.base_layer, self.slots, rank)
            self.pending = set(range(self.slots))

        def on_lora_slots_updated(self, slot_ids: set[int]) -> None:
            self.pending |= set(slot_ids)

        def slice_lora_a_weights(self, A: torch.Tensor) -> torch.Tensor:
            return A  # one rank only (tensor parallelism with LoRA is refused)

        def slice_lora_b_weights(self, B: torch.Tensor) -> torch.Tensor:
            return B

        def _sync(self) -> None:
            """Copy the changed slots this step uses from the pool (their rank is in the batch info; a slot of rank
            0 here is unused or holds no adapter, and its tokens get the base output)."""
            info = self.lora_backend.get_batch_info()
            if not self.pending or info is None or self.A_buffer is None:
                return
            ranks = getattr(info, "lora_ranks_cpu", None)
            ranks = (info.lora_ranks if ranks is None else ranks).tolist()
            lora: LoraSlots = self.base_layer.lora
            layer = self.base_layer
            for slot in [slot for slot in sorted(self.pending) if ranks[slot] > 0]:
                rank = ranks[slot]
                lora.clear(slot)
                for shard in range(len(layer.out_partitions)):
                    a = self.A_buffer[slot, shard * rank : (shard + 1) * rank]
                    b = self.B_buffer[slot, lora.rows[shard] : lora.rows[shard + 1], :rank]
                    lora.write(slot, shard, a, b, f"SGLang LoRA slot {slot}: {layer.prefix}")
                self.pending.discard(slot)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            self._sync()
            return self.base_layer(*args, **kwargs)

    return AtomLinearWithLoRA


def lora_layer(layer: Any, lora_backend: Any, fallback: Any, **kwargs: Any) -> Any:
    """SGLang's ``get_lora_layer`` with ATOM's layers: ATOM's wrapper for an ATOM linear layer, a refusal naming any
    other ATOM module SGLang would wrap, SGLang's own choice (``fallback``) for everything else."""
    if adapts(layer):
        return wrapper_class()(layer, lora_backend)
    if type(layer).__module__.startswith("atom_core."):
        raise UnsupportedConfigError(
            f"SGLang's LoRA: {getattr(layer, 'prefix', '') or type(layer).__name__} is ATOM's "
            f"{type(layer).__name__}: adapters apply to ATOM's linear layers only (attention projections, dense and "
            "shared-expert MLPs), not MoE experts, embeddings or the LM head"
        )
    return fallback(layer, lora_backend, **kwargs)


def hidden_dims(model: Any, module_name: str, layer_idx: int) -> tuple[int, int]:
    """Input and (all shards') output size of ATOM's linear layer ``module_name`` (SGLang's normalized target name:
    ``qkv_proj``, ``gate_up_proj``, ``o_proj``...) in decoder layer ``layer_idx``: the sizes SGLang's LoRA pool
    gives that target.  Refused, naming it, where that layer has no such linear layer (MoE experts, embeddings, the
    LM head)."""
    marker = f".layers.{layer_idx}."
    for name, module in model.named_modules():
        module = getattr(module, "base_layer", module)
        if marker in f".{name}" and name.endswith(f".{module_name}") and adapts(module):
            return module.input_size, sum(module.output_sizes)
    raise UnsupportedConfigError(
        f"{type(model).__name__}: SGLang's LoRA target {module_name!r} is no linear layer of ATOM's model in layer "
        f"{layer_idx}: adapters apply to ATOM's linear layers only (attention projections, dense and shared-expert "
        "MLPs), not MoE experts, embeddings or the LM head"
    )


def prepare(arch: str) -> None:
    """Called as ATOM's class is built: with LoRA on, let SGLang's manager wrap ATOM's layers (or refuse, one line)."""
    if not compat.lora_enabled():
        return
    version = compat.installed_version()
    if not compat.lora_internals_checked(version):
        raise UnsupportedConfigError(
            f"{arch}: SGLang's LoRA (--enable-lora / --lora-paths) with ATOM's class is checked on SGLang "
            f"{', '.join(compat.LORA_INTERNALS_CHECKED)} only (it hooks SGLang's LoRA internals), not {version}; set "
            f"ATOM_TAKE_OVER=none, or leave {arch} out of it, to serve it with SGLang's own class"
        )
    tp = compat.parallel().tp_size
    if tp > 1:
        raise UnsupportedConfigError(
            f"{arch}: SGLang's LoRA with ATOM's class runs on one rank only, not tp_size={tp}; "
            f"set ATOM_TAKE_OVER=none, or leave {arch} out of it, to serve it with SGLang's "
            "own class"
        )
    compat.install_lora_layers(lora_layer)
