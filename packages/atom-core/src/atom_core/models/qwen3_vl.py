"""Qwen3-VL: the Qwen3 dense decoder with interleaved multimodal rotary positions, fed by a vision tower.

    image embeddings, deepstack features = visual(pixels)               (qwen3_vl_vision)
    h = embed(ids), image placeholder rows replaced by the image embeddings
    for each layer i:
        h = h + o_proj(attn(mrope(q_norm(q)), mrope(k_norm(k)), v))      positions [3, T]: time, height, width
        h = h + down_proj(silu(gate) · up)
        h[image rows] += deepstack features i                           for the first len(deepstack) layers
    logits = lm_head(rmsnorm(h))

The q/k RMSNorm and the rotation run as one kernel (``atom_kernels.mrope`` with norm weights).
Prompt positions come from :mod:`atom_core.mrope_positions`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from atom_core.config import DecoderConfig
from atom_core.host import Host
from atom_core.layers.embedding import ParallelLMHead
from atom_core.loader import WeightMapper
from atom_core.loader.mapper import TIED_LM_HEAD
from atom_core.models.base import CausalLM
from atom_core.models.llama import DENSE_MAPPER, Attention, AttentionOptions, DecoderLayer, DecoderModel
from atom_core.models.qwen3_vl_vision import VisionModel
from atom_core.mrope_positions import mrope_positions


@dataclass
class Deepstack:
    """Visual features added to the residual stream after the first decoder layers (DeepStack): after
    layer ``i``, rows ``token_index`` (``[V]``) gain ``embeds[i]`` (``[V, hidden]``).  Without
    ``token_index``, ``embeds[i]`` covers every token of the step (``[T, hidden]``, zero at text rows): the
    fixed-shape form a CUDA-graph host keeps in a persistent buffer."""

    token_index: torch.Tensor | None
    embeds: torch.Tensor  # [num_deepstack_layers, V or T, hidden]

    def add_to(self, residual: torch.Tensor, layer: int) -> torch.Tensor:
        if self.token_index is None:
            return residual + self.embeds[layer]
        return residual.index_add(0, self.token_index, self.embeds[layer])


class MRopeAttention(Attention):
    """Qwen3 attention whose per-head q/k RMSNorm runs inside the multimodal rotary kernel."""

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q, k = self.rotary_emb(positions, q, k, self.q_norm, self.k_norm)
        return self.o_proj(self.attn(q, k, v))


class VLDecoderLayer(DecoderLayer):
    attention_class = MRopeAttention


class VLTextModel(DecoderModel):
    layer_class = VLDecoderLayer

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None, deepstack: Deepstack | None = None) -> torch.Tensor:
        h = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)
        residual = None
        for i, layer in enumerate(self.layers):
            h, residual = layer(positions, h, residual)
            if deepstack is not None and i < deepstack.embeds.shape[0]:
                residual = deepstack.add_to(residual, i)
        h, _ = self.norm(h, residual)
        return h


class Qwen3VLModel(nn.Module):
    """The checkpoint's ``model``: ``visual`` and ``language_model``."""

    def __init__(self, hf_config: Any, cfg: DecoderConfig, *, host: Host, prefix: str):
        super().__init__()
        self.visual = VisionModel(hf_config.vision_config, host=host, prefix=f"{prefix}.visual")
        options = AttentionOptions(qkv_bias=cfg.attention_bias, o_bias=cfg.attention_bias, qk_norm=True)
        self.language_model = VLTextModel(cfg, options, host=host, prefix=f"{prefix}.language_model")


_MAPPER = dataclasses.replace(DENSE_MAPPER, renames=((r"\.patch_embed\.proj\.", ".patch_embed."),))
_TIED_MAPPER = dataclasses.replace(_MAPPER, tied=TIED_LM_HEAD)


class Qwen3VLForConditionalGeneration(CausalLM):
    weight_mapper = _MAPPER
    position_rows = 3  # [3, T] positions: prompt_positions, then index + delta
    mrope_interleaved: ClassVar[bool] = True  # transformers' Qwen3-VL interleaves whatever the config says
    rope_defaults: ClassVar[dict[str, Any]] = {}  # rope parameters transformers assumes when the config omits them
    # the checkpoint's ``model``: ``visual`` and ``language_model`` (Qwen3.5 brings its hybrid decoder)
    model_class: ClassVar[type[nn.Module]] = Qwen3VLModel

    def __init__(self, hf_config: Any, host: Host, prefix: str = ""):
        super().__init__(hf_config, host)
        self.config = hf_config
        cfg = DecoderConfig.from_hf(hf_config)
        cfg = dataclasses.replace(cfg, rope={**self.rope_defaults, **cfg.rope, "mrope_interleaved": self.mrope_interleaved})
        self.decoder_config = cfg
        self.model = self.model_class(hf_config, cfg, host=host, prefix=f"{prefix}.model" if prefix else "model")
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, host=host)
        if cfg.tie_word_embeddings:
            self.lm_head.tie_to(self.model.language_model.embed_tokens)
        self.image_token_id = hf_config.image_token_id
        self.video_token_id = hf_config.video_token_id
        self.spatial_merge_size = self.model.visual.config.spatial_merge_size

    def mapper(self) -> WeightMapper:
        return _TIED_MAPPER if self.decoder_config.tie_word_embeddings else _MAPPER

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None, deepstack: Deepstack | None = None) -> torch.Tensor:
        return self.model.language_model(input_ids, positions, inputs_embeds, deepstack)

    # ----------------------------------------------------------------------------------- multimodal
    def prompt_positions(self, token_ids: Sequence[int], image_grid_thw: torch.Tensor | None = None,
                         video_grid_thw: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
        """``([3, len(token_ids)]`` positions, decode delta) of one prompt."""
        return mrope_positions(token_ids, image_token_id=self.image_token_id, video_token_id=self.video_token_id,
                               spatial_merge_size=self.spatial_merge_size, image_grid_thw=image_grid_thw,
                               video_grid_thw=video_grid_thw)

    def embed_multimodal(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> list[torch.Tensor]:
        """One tensor per image, ``[tokens_i, hidden * (1 + deepstack layers)]``: its embeddings, then its
        deepstack features, concatenated along the last dim (one tensor per item, as hosts cache them)."""
        embeds, deepstack = self.model.visual(pixel_values, image_grid_thw)
        merged = torch.cat([embeds, *deepstack], dim=-1)
        sizes = (torch.as_tensor(image_grid_thw).prod(-1) // self.spatial_merge_size**2).tolist()
        return list(merged.split(sizes))

    def embed_input_ids(self, input_ids: torch.Tensor, multimodal_embeddings: Sequence[torch.Tensor] | None = None,
                        is_multimodal: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings with the multimodal placeholder rows (``is_multimodal``) replaced by the items'
        embeddings, in order."""
        embeds = self.model.language_model.embed_tokens(input_ids)
        if multimodal_embeddings:
            hidden = embeds.shape[-1]
            embeds[is_multimodal] = torch.cat(list(multimodal_embeddings))[:, :hidden].to(embeds.dtype)
        return embeds

    def deepstack_inputs(self, multimodal_embeddings: Sequence[torch.Tensor] | None, is_multimodal: torch.Tensor,
                         *, dense: bool = False) -> Deepstack | None:
        """The deepstack part of the items' embeddings, placed at the placeholder rows (``dense``: as
        ``[layers, T, hidden]`` over all the step's tokens)."""
        if not multimodal_embeddings or not self.model.visual.config.deepstack_indexes:
            return None
        hidden = self.decoder_config.hidden_size
        features = torch.cat(list(multimodal_embeddings))[:, hidden:]
        embeds = features.view(features.shape[0], -1, hidden).transpose(0, 1)
        if dense:
            full = embeds.new_zeros(embeds.shape[0], is_multimodal.shape[0], hidden)
            full[:, is_multimodal] = embeds
            return Deepstack(token_index=None, embeds=full)
        return Deepstack(token_index=is_multimodal.nonzero().view(-1), embeds=embeds)

    def multimodal_forward_inputs(self, input_ids: torch.Tensor, pixel_values: torch.Tensor,
                                  image_grid_thw: torch.Tensor) -> dict[str, Any]:
        """``forward`` keyword arguments for a step whose ``input_ids`` hold the placeholders of these images."""
        is_image = input_ids == self.image_token_id
        items = self.embed_multimodal(pixel_values, image_grid_thw)
        return {"inputs_embeds": self.embed_input_ids(input_ids, items, is_image),
                "deepstack": self.deepstack_inputs(items, is_image)}
