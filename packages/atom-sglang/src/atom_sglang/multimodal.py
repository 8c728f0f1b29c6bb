"""SGLang's multimodal model contract around an ATOM multimodal model (images; Qwen3-VL).

SGLang picks a multimodal *processor* by architecture name (``get_mm_processor_cls`` compares each
registered model class's ``__name__`` with ``config.architectures``), and ATOM's generated classes carry
the architecture's name: SGLang's own processor for that architecture (for Qwen3-VL its
``QwenVLImageProcessor``: chat template, the checkpoint's image processor, placeholder expansion and the
MRoPE positions of the prompt) therefore serves ATOM's model unchanged; no processor package is needed.
The processor's output is preprocessing only; the model side is here:

    SGLang                                         ATOM
    pad_input_ids(ids, mm_inputs)               -> SGLang's own padding: each image's placeholder run
                                                   becomes its hash pad values (radix-cache keys)
    general_mm_embed_routine(...)               -> embedding of the step's tokens; for a prefill with images:
      get_image_feature(items)                  -> model.embed_multimodal(pixels, image_grid_thw), per
                                                   image [tokens, hidden * (1 + deepstack layers)]
      separate_deepstack_embeds(features)       -> the embedding part | the deepstack part
      input_deepstack_embeds [T, L * hidden]    -> Deepstack(token_index=None, embeds=[L, T, hidden])
                                                   (the dense, fixed-shape form)
    positions: forward_batch.mrope_positions    -> [3, T] (the wrapper swaps them in; SGLang computes them
                                                   from the processor's positions and deltas)

SGLang's embedding cache, chunked prefill of a prompt split inside an image and the offload of pixel
values all stay SGLang's (they live in ``general_mm_embed_routine``).  Videos are refused: ATOM's
multimodal models take images only.
"""

from __future__ import annotations

from typing import Any

import torch

from atom_core.errors import UnsupportedConfigError
from atom_core.models.qwen3_vl import Deepstack
from atom_sglang import compat

IMAGE = "image"


class SGLangMultimodal:
    """Mixin placed before :class:`~atom_sglang.wrapper.SGLangCausalLM` for catalog entries that take
    images; the ATOM model provides ``embed_multimodal(pixel_values, image_grid_thw)`` and takes a
    ``deepstack`` argument in ``forward`` when its vision tower has deepstack layers."""

    #: what ATOM's model class must define for this mixin (checked when the class is generated)
    REQUIRED = ("embed_multimodal",)

    def __init__(self, config: Any, quant_config: Any = None, prefix: str = ""):
        super().__init__(config, quant_config, prefix)
        # the vision tower's blocks whose features feed the first decoder layers (none: no deepstack)
        visual = getattr(getattr(self.model, "visual", None), "config", None)
        self.deepstack_visual_indexes = list(getattr(visual, "deepstack_indexes", ()) or ())
        self.num_deepstack_embeddings = len(self.deepstack_visual_indexes)
        self.use_deepstack = compat.deepstack_modalities() if self.num_deepstack_embeddings else {}

    # ---------------------------------------------------------------------------- SGLang's hooks
    def pad_input_ids(self, input_ids: Any, mm_inputs: Any) -> Any:
        return compat.pad_multimodal_tokens(input_ids, mm_inputs)

    def get_image_feature(self, items: list[Any]) -> torch.Tensor:
        """All items' image embeddings in prompt order, ``[tokens, hidden * (1 + deepstack layers)]``."""
        weight = self.get_input_embeddings().weight
        if weight.device.type == "cuda":
            # SGLang's Qwen-VL processor may hand pixel values over as CUDA-IPC proxies and leave their
            # reconstruction to the model (single GPU); the item restores them in place.
            device = weight.device.index if weight.device.index is not None else torch.cuda.current_device()
            for item in items:
                item.reconstruct(device)
        pixels = compat.materialize_multimodal_features([item.feature for item in items], device=weight.device,
                                                        dtype=weight.dtype)
        grid = torch.cat([torch.as_tensor(item.image_grid_thw).view(-1, 3) for item in items])
        return torch.cat(self.embed_multimodal(pixels, grid))

    def get_video_feature(self, items: list[Any]) -> torch.Tensor:
        raise UnsupportedConfigError(f"{type(self).__name__}: ATOM's model takes images only, not videos")

    def separate_deepstack_embeds(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.decoder_config.hidden_size
        return features[:, :hidden], features[:, hidden:]

    # ----------------------------------------------------------------------------------- forward
    def _run_model(self, input_ids, positions, forward_batch, input_embeds):
        if input_embeds is not None:  # the request came with its embeddings
            return super()._run_model(input_ids, positions, forward_batch, input_embeds)
        return compat.general_mm_embed_routine(
            input_ids=input_ids, forward_batch=forward_batch, language_model=LanguageModel(self),
            multimodal_model=self, positions=positions, use_deepstack=self.use_deepstack,
        )


class LanguageModel:
    """The ``language_model`` argument of SGLang's ``general_mm_embed_routine``: the token embedding, and a
    call running the ATOM model on the merged embeddings (with the deepstack features SGLang gathered)."""

    def __init__(self, model: Any):
        self._model = model

    def get_input_embeddings(self):
        return self._model.get_input_embeddings()

    def __call__(self, input_ids, forward_batch, input_embeds=None, positions=None, input_deepstack_embeds=None,
                 **kwargs: Any) -> torch.Tensor:
        if kwargs:
            raise UnsupportedConfigError(f"{type(self._model).__name__}: unexpected language-model inputs {sorted(kwargs)}")
        extra = {}  # a model without deepstack layers (Kimi-K2.5) takes no deepstack argument
        if input_deepstack_embeds is not None:
            hidden = self._model.decoder_config.hidden_size
            layers = input_deepstack_embeds.view(input_deepstack_embeds.shape[0], -1, hidden).transpose(0, 1)
            extra["deepstack"] = Deepstack(token_index=None, embeds=layers.to(input_embeds.dtype))
        return self._model.atom_forward(input_ids, positions, input_embeds, **extra)
