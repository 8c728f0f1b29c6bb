"""Kimi-K2.5 (``KimiK25ForConditionalGeneration``): DeepSeek-V3's text model (latent attention, grouped sigmoid
routing) fed by the MoonViT vision tower and its patch merger (:mod:`atom_core.models.kimi_k25_vision`).

    h = embed(ids), each image's placeholder rows (image_token_id) replaced by mm_projector(vision_tower(pixels))
    then DeepSeek-V3 over h with ordinary 1-D positions (the running index of the expanded prompt)

An image takes ``t·h·w / k²`` placeholder tokens (its patch grid over the ``k x k`` merge), as Kimi's processor
expands them.  Published checkpoints hold the text model under ``language_model.`` and the tower under its own
names (``encoder.blocks.N.wqkv``...); their q/k rows are in rotary-pair order, which the tower's rotary reads as is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from atom_core.config import text_config
from atom_core.host import Host
from atom_core.loader import WeightMapper
from atom_core.loader.experts import with_experts
from atom_core.models.deepseek_v3 import LATENT_MAPPER, DeepseekV3ForCausalLM
from atom_core.models.glm4_moe import RENAMES as MOE_RENAMES
from atom_core.models.glm4_moe import mtp_layer_names
from atom_core.models.kimi_k25_vision import KimiVisionTower, vision_config
from atom_core.models.qwen3_vl_vision import PatchMerger

_BLOCK = r"^vision_tower\.encoder\.blocks\.(\d+)\."
# published name -> ATOM parameter (in order: norm1 -> norm2 before norm0 -> norm1, fc1 before fc0)
RENAMES = (
    (r"^language_model\.model\.", "model."),
    (r"^language_model\.lm_head\.", "lm_head."),
    (_BLOCK + r"norm1\.", r"vision_tower.blocks.\1.norm2."),
    (_BLOCK + r"norm0\.", r"vision_tower.blocks.\1.norm1."),
    (_BLOCK + r"mlp\.fc1\.", r"vision_tower.blocks.\1.mlp.linear_fc2."),
    (_BLOCK + r"mlp\.fc0\.", r"vision_tower.blocks.\1.mlp.linear_fc1."),
    (_BLOCK + r"wqkv\.", r"vision_tower.blocks.\1.attn.qkv."),
    (_BLOCK + r"wo\.", r"vision_tower.blocks.\1.attn.proj."),
    (r"^vision_tower\.encoder\.final_layernorm\.", "vision_tower.final_layernorm."),
    (r"^vision_tower\.patch_embed\.proj\.", "vision_tower.patch_embed."),
    (r"^vision_tower\.patch_embed\.pos_emb\.", "vision_tower.pos_emb."),
    (r"^mm_projector\.pre_norm\.", "mm_projector.norm."),
    (r"^mm_projector\.proj\.0\.", "mm_projector.linear_fc1."),
    (r"^mm_projector\.proj\.2\.", "mm_projector.linear_fc2."),
    *MOE_RENAMES,
)
_TIED = (r"^lm_head\.weight$",)


class KimiK25ForConditionalGeneration(DeepseekV3ForCausalLM):
    weight_mapper = with_experts(LATENT_MAPPER, renames=RENAMES)

    def __init__(self, hf_config: Any, host: Host, prefix: str = ""):
        super().__init__(hf_config, host, prefix)
        cfg, side, frames = vision_config(hf_config)
        at = f"{prefix}." if prefix else ""
        self.vision_tower = KimiVisionTower(cfg, side, frames, host=host, prefix=f"{at}vision_tower")
        self.mm_projector = PatchMerger(cfg, norm_after_merge=False, host=host, prefix=f"{at}mm_projector")
        self.image_token_id = _image_token_id(hf_config)
        self.spatial_merge_size = cfg.spatial_merge_size

    def mapper(self) -> WeightMapper:
        tied = _TIED if self.decoder_config.tie_word_embeddings else ()
        return with_experts(LATENT_MAPPER, renames=RENAMES, ignored=(*tied, *mtp_layer_names(text_config(self.config))))

    # ----------------------------------------------------------------------------------- multimodal
    def embed_multimodal(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> list[torch.Tensor]:
        """One ``[tokens_i, hidden]`` tensor per image (or clip)."""
        embeds = self.mm_projector(self.vision_tower(pixel_values, image_grid_thw))
        grid = torch.as_tensor(image_grid_thw)
        sizes = (grid[:, 1] * grid[:, 2] // self.spatial_merge_size**2).tolist()
        return list(embeds.split(sizes))

    def embed_input_ids(self, input_ids: torch.Tensor, multimodal_embeddings: Sequence[torch.Tensor] | None = None,
                        is_multimodal: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings with the placeholder rows (``is_multimodal``) replaced by the items' embeddings, in order."""
        embeds = self.model.embed_tokens(input_ids)
        if multimodal_embeddings:
            embeds[is_multimodal] = torch.cat(list(multimodal_embeddings)).to(embeds.dtype)
        return embeds

    def multimodal_forward_inputs(self, input_ids: torch.Tensor, pixel_values: torch.Tensor,
                                  image_grid_thw: torch.Tensor) -> dict[str, Any]:
        """``forward`` keyword arguments for a step whose ``input_ids`` hold the placeholders of these images."""
        items = self.embed_multimodal(pixel_values, image_grid_thw)
        return {"inputs_embeds": self.embed_input_ids(input_ids, items, input_ids == self.image_token_id)}


def _image_token_id(hf_config: Any) -> int:
    """transformers' ``image_token_id``, or the Hub config's ``media_placeholder_token_id``."""
    for name in ("image_token_id", "media_placeholder_token_id"):
        value = getattr(hf_config, name, None)
        if value is not None:
            return int(value)
    raise AttributeError("the config names no image placeholder token (image_token_id / media_placeholder_token_id)")
