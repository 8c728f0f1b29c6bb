"""Multimodal models inside vLLM: vLLM's ``SupportsMultiModal`` over atom-core's vision models.

vLLM preprocesses images and videos with a *processor* registered on the model class; atom-vllm reuses
the one vLLM registers for its own implementation of the same architecture (its processing info, dummy
inputs and HF-processor wrapper are preprocessing, not modelling), and its placeholder strings, both looked
up when vLLM first asks for them.

What the atom-core model provides (Qwen3-VL's interface, which the multimodal catalog models share):

* ``embed_multimodal(pixel_values, grid_thw) -> [tokens_i, width]`` per item (image, or video: the tower
  takes both), the rows vLLM caches per item and hands back for the placeholder tokens.  vLLM's processors
  name the pixels and their patch grids per modality (:data:`PIXEL_INPUTS`): Qwen-VL's ``pixel_values`` with
  ``image_grid_thw`` and ``pixel_values_videos`` with ``video_grid_thw``; Kimi-K2.5's ``vision_chunk`` modality
  (images and video chunks alike) ``pixel_values`` with ``grid_thws``;
* ``embed_input_ids(input_ids, items, is_multimodal)``: token embeddings with the placeholder rows
  replaced;
* optionally ``deepstack_inputs(items, is_multimodal, dense=True)`` (Qwen3-VL's DeepStack): features added
  to the residual stream after the first layers, placed at the placeholder rows of the step.  vLLM builds
  the embeddings (``embed_input_ids``) for the step's scheduled tokens and then calls ``forward`` with
  ``inputs_embeds`` (possibly padded): the features wait in a persistent buffer between the two calls, as
  vLLM's own Qwen3-VL keeps them, and are cleared after the forward that used them.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from atom_core.errors import AtomError, UnsupportedConfigError
from atom_vllm import compat

logger = logging.getLogger(__name__)

# vLLM's multimodal keyword arguments: pixels -> the names their patch grid has beside them, in the processors of
# every supported release (one of them is present); precomputed embeddings are refused.
PIXEL_INPUTS = {"pixel_values": ("image_grid_thw", "grid_thws"), "pixel_values_videos": ("video_grid_thw",)}
EMBEDDING_INPUTS = ("image_embeds", "video_embeds")


class ProcessorUnavailable(AtomError, ValueError):
    """vLLM's processor for the architecture cannot be imported here.  A ``ValueError``: vLLM's multimodal
    registry then runs the model text-only, with a warning (every supported release)."""


class OwnProcessor:
    """The class attribute ``_processor_factory`` vLLM's multimodal registry reads: the processor vLLM
    registered on its own implementation of the same architecture, looked up on first access (that imports
    vLLM's model module and, through it, transformers' image processors: not needed to inspect, build or
    load the model).  Where that import fails (transformers' Qwen2-VL image processor needs torchvision,
    which has no CPU build beside a CPU torch from PyPI), the model is served text-only, with a warning
    naming the import error."""

    def __get__(self, obj: Any, owner: type) -> Any:
        try:
            own = compat.vllm_own_model_class(owner.atom_spec.name)
        except ImportError as err:
            message = (f"{owner.atom_spec.name}: vLLM's multimodal processor for this architecture does not import "
                       f"here ({err}); ATOM's model runs text-only (images and videos are refused)")
            logger.warning(message)
            raise ProcessorUnavailable(message) from err
        return own._processor_factory


class MultimodalModel:
    """``SupportsMultiModal`` for a wrapper over an atom-core multimodal model (see the module doc).
    Comes before vLLM's interface classes in the wrapper's bases, so their stubs never answer."""

    atom_class: type
    _processor_factory = OwnProcessor()
    _deepstack_buffer: torch.Tensor | None = None
    _deepstack_template: Any = None
    _deepstack_rows = 0  # rows of the buffer holding features for the next forward

    def __init__(self, *, vllm_config: Any, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._model_dtype = vllm_config.model_config.dtype
        self._max_batched_tokens = int(vllm_config.scheduler_config.max_num_batched_tokens)

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        return compat.vllm_own_model_class(cls.atom_spec.name).get_placeholder_str(modality, i)

    def embed_multimodal(self, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        for name in EMBEDDING_INPUTS:
            if kwargs.get(name) is not None:
                raise UnsupportedConfigError(f"{type(self).__name__}: precomputed {name} are not supported by ATOM's "
                                             "model; pass images/videos")
        items: list[torch.Tensor] = []
        for name in kwargs:  # in vLLM's order of modalities
            if name in PIXEL_INPUTS and kwargs[name] is not None:
                pixels, grid = self._pixels_and_grid(kwargs, name)
                items.extend(self.atom_class.embed_multimodal(self, pixels, grid))
        return tuple(items)

    def _pixels_and_grid(self, kwargs: dict[str, Any], name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The pixels under ``name`` (one tensor in the model's dtype; vLLM hands items of different shapes as a
        list) and their ``[items, 3]`` patch grid."""
        grid_name = next((g for g in PIXEL_INPUTS[name] if kwargs.get(g) is not None), None)
        if grid_name is None:
            raise UnsupportedConfigError(f"{type(self).__name__}: {name} came without its patch grid (one of "
                                         f"{', '.join(PIXEL_INPUTS[name])}); got {sorted(kwargs)}")
        pixels = kwargs[name]
        if isinstance(pixels, (list, tuple)):
            pixels = torch.cat(list(pixels))
        grid = kwargs[grid_name]
        if isinstance(grid, (list, tuple)):
            grid = torch.stack([torch.as_tensor(g) for g in grid])
        return pixels.to(self._model_dtype), torch.as_tensor(grid).reshape(-1, 3)

    def embed_input_ids(self, input_ids: torch.Tensor, multimodal_embeddings: Any = None, *,
                        is_multimodal: torch.Tensor | None = None) -> torch.Tensor:
        if is_multimodal is not None:  # placeholder ids may lie outside the vocabulary: embed id 0 there
            input_ids = input_ids.masked_fill(is_multimodal, 0)
        if not multimodal_embeddings:
            return self.atom_class.embed_input_ids(self, input_ids)
        if is_multimodal is None:
            raise UnsupportedConfigError(f"{type(self).__name__}.embed_input_ids: multimodal embeddings without "
                                         "is_multimodal")
        embeds = self.atom_class.embed_input_ids(self, input_ids, multimodal_embeddings, is_multimodal)
        deepstack_inputs = getattr(self, "deepstack_inputs", None)
        if deepstack_inputs is not None:
            self._stash_deepstack(deepstack_inputs(multimodal_embeddings, is_multimodal, dense=True))
        return embeds

    def _stash_deepstack(self, deepstack: Any) -> None:
        if deepstack is None:
            return
        levels, rows, hidden = deepstack.embeds.shape
        buffer = self._deepstack_buffer
        if buffer is None or buffer.shape[1] < rows or buffer.shape[0] != levels:
            capacity = max(rows, self._max_batched_tokens)
            buffer = deepstack.embeds.new_zeros(levels, capacity, hidden)
            self._deepstack_buffer = buffer
        buffer[:, :rows].copy_(deepstack.embeds)
        self._deepstack_template = deepstack
        self._deepstack_rows = rows

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors: Any = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        if not self._deepstack_rows or inputs_embeds is None:
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        rows = inputs_embeds.shape[0]
        if rows < self._deepstack_rows:
            raise UnsupportedConfigError(f"{type(self).__name__}: a forward of {rows} tokens after embeddings of "
                                         f"{self._deepstack_rows}")
        deepstack = dataclasses.replace(self._deepstack_template, embeds=self._deepstack_buffer[:, :rows])
        try:
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, deepstack=deepstack)
        finally:
            self._deepstack_buffer[:, : self._deepstack_rows].zero_()
            self._deepstack_rows = 0
            self._deepstack_template = None



class MRoPEModel:
    """``SupportsMRoPE``: a prompt's ``[3, L]`` positions and decode delta from atom-core
    (:mod:`atom_core.mrope_positions` through the model's ``prompt_positions``), the grids read from vLLM's
    per-item features (in prompt order)."""

    def get_mrope_input_positions(self, input_tokens: list[int], mm_features: list[Any]) -> tuple[torch.Tensor, int]:
        grids: dict[str, list[torch.Tensor]] = {"image": [], "video": []}
        for feature in sorted(mm_features, key=lambda f: f.mm_position.offset):
            if feature.modality not in grids:
                raise UnsupportedConfigError(f"{type(self).__name__}: no MRoPE positions for {feature.modality!r} inputs")
            if feature.data is None:
                raise UnsupportedConfigError(f"{type(self).__name__}: a {feature.modality} item reached MRoPE "
                                             "positions without its data")
            grids[feature.modality].append(torch.as_tensor(feature.data[f"{feature.modality}_grid_thw"].data).view(3))
        stacked = {k: torch.stack(v) if v else None for k, v in grids.items()}
        positions, delta = self.prompt_positions(list(input_tokens), image_grid_thw=stacked["image"],
                                                 video_grid_thw=stacked["video"])
        return positions, int(delta)
