"""Kimi-K2.5's vision tower (MoonViT) and its patch merger: images -> embeddings in the language model's width.

    x = patch_embed(pixels) + bicubic(pos_emb grid -> image grid) (+ a sinusoid per frame of a multi-frame clip)
    for each block (attention over each clip's patches, its frames together):
        x = x + proj(attn(rope2d(q), rope2d(k), v))      q, k, v = qkv(layernorm(x))
        x = x + fc2(gelu_tanh(fc1(layernorm(x))))
    x = final_layernorm(x)
    merged = each k x k block of patches, averaged over the clip's frames       (k = merge_kernel_size)
    out = mm_projector(merged): layernorm per patch, the k·k patches concatenated, fc1, gelu, fc2

Patches arrive (from Kimi's image processor) in raster order, ``[3, P, P]`` each.  The patch embedding, the
blocks and the merger are Qwen3-VL's (:mod:`atom_core.models.qwen3_vl_vision`); the position grid, the 2-D
rotary and the temporal pooling are Kimi's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.errors import UnsupportedConfigError
from atom_core.host import Host
from atom_core.layers.norm import LayerNorm
from atom_core.layers.params import make_param
from atom_core.models.qwen3_vl_vision import PatchEmbed, VisionBlock, VisionConfig, merge_block_order
from atom_kernels import rotary_embedding

LAYER_NORM_EPS = 1e-5


def _field(vc: Any, *names: str, default: Any = None) -> Any:
    """The first of ``names`` the vision config has (transformers' spelling, then the Hub's remote-code one)."""
    for name in names:
        value = getattr(vc, name, None)
        if value is not None:
            return value
    return default


def vision_config(hf_config: Any) -> tuple[VisionConfig, int, int]:
    """(the tower's :class:`VisionConfig`, position grid side, frames of the temporal table) of a Kimi-K2.5 config."""
    vc = hf_config.vision_config
    merge = tuple(_field(vc, "merge_kernel_size", default=(2, 2)))
    if merge[0] != merge[1]:
        raise UnsupportedConfigError(f"vision_config.merge_kernel_size {list(merge)}: only square merges are supported")
    side = _field(vc, "pos_emb_height", "init_pos_emb_height", default=64)
    if _field(vc, "pos_emb_width", "init_pos_emb_width", default=side) != side:
        raise UnsupportedConfigError("vision_config: the learned position grid must be square (pos_emb_height == width)")
    rope = _field(vc, "rope_parameters", default={}) or {}
    cfg = VisionConfig(
        depth=_field(vc, "num_hidden_layers", "vt_num_hidden_layers"),
        hidden_size=_field(vc, "hidden_size", "vt_hidden_size"),
        intermediate_size=_field(vc, "intermediate_size", "vt_intermediate_size"),
        num_heads=_field(vc, "num_attention_heads", "vt_num_attention_heads"),
        in_channels=3, patch_size=vc.patch_size, temporal_patch_size=1, spatial_merge_size=merge[0],
        out_hidden_size=hf_config.get_text_config().hidden_size, num_position_embeddings=side * side,
        deepstack_indexes=(), hidden_act=_field(vc, "hidden_act", default="gelu_pytorch_tanh"),
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        layer_norm_eps=float(getattr(hf_config, "projection_layer_norm_eps", LAYER_NORM_EPS)),
    )
    return cfg, side, _field(vc, "pos_emb_time", "init_pos_emb_time", default=4)


class PositionGrid(nn.Module):
    """A learned ``[side, side, hidden]`` table resampled bicubically (half-pixel centres) to each clip's patch
    grid, in raster order; frame ``f`` of a multi-frame clip also gains row ``f`` of a fixed sin|cos table."""

    def __init__(self, side: int, hidden_size: int, frames: int):
        super().__init__()
        self.weight = make_param((side, side, hidden_size), torch.get_default_dtype())
        inv_freq = 1.0 / (10000 ** (torch.arange(0, hidden_size, 2, dtype=torch.float32) / hidden_size))
        angles = torch.outer(torch.arange(frames, dtype=torch.float32), inv_freq)
        self.register_buffer("frame_table", torch.cat([angles.sin(), angles.cos()], dim=1), persistent=False)

    def forward(self, grid_thw: Sequence[Sequence[int]]) -> torch.Tensor:
        table = self.weight.float().permute(2, 0, 1)[None]
        out = []
        for t, h, w in grid_thw:
            grid = F.interpolate(table, size=(h, w), mode="bicubic", align_corners=False)[0].flatten(1).T
            frames = grid.expand(t, -1, -1)
            if t > 1:
                frames = frames + self.frame_table[:t, None, :]
            out.append(frames.reshape(t * h * w, -1))
        return torch.cat(out).to(self.weight.dtype)


class AxialRotary(nn.Module):
    """2-D rotary over rotary pairs ``(x0, x1), (x2, x3), ...`` of each head (the order of the published q/k rows):
    pair ``2m`` turns by the patch's column · ωₘ, pair ``2m + 1`` by its row · ωₘ, ``ωₘ = θ^(-4m / head_dim)``.
    Runs as :func:`atom_kernels.rotary_embedding` (GPT-J pairs) over a cos/sin table with one row per patch."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim = head_dim
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 4, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("cos_sin_cache", torch.empty(0, head_dim), persistent=False)

    def prepare(self, grid_thw: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
        """This batch's cos/sin table (one row per patch); returns the patches' positions (rows of the table)."""
        cols_rows = []
        for t, h, w in grid_thw:
            row, col = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
            cols_rows.append(torch.stack([col.flatten(), row.flatten()], dim=-1).repeat(t, 1))
        cr = torch.cat(cols_rows).float()
        angles = (cr[:, None, :] * self.inv_freq.cpu()[None, :, None]).flatten(1)  # [patches, head_dim / 2]
        self.cos_sin_cache = torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)
        return torch.arange(cr.shape[0], device=device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        return rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_dim, False)


class KimiVisionTower(nn.Module):
    """``forward(pixel_values [patches, 3, P, P], grid_thw [n, 3])`` -> ``[patches / k², k² · hidden]`` rows in
    merge-block order (the ``k x k`` patches of each merged token consecutive, averaged over the clip's frames)."""

    def __init__(self, cfg: VisionConfig, side: int, frames: int, *, host: Host, prefix: str):
        super().__init__()
        self.config = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.pos_emb = PositionGrid(side, cfg.hidden_size, frames)
        self.rotary = AxialRotary(cfg.head_dim, cfg.rope_theta)
        self.blocks = nn.ModuleList(VisionBlock(cfg, host=host, prefix=f"{prefix}.blocks.{i}") for i in range(cfg.depth))
        self.final_layernorm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        grids = [tuple(g) for g in torch.as_tensor(grid_thw).tolist()]
        x = self.patch_embed(pixel_values.reshape(pixel_values.shape[0], -1))
        x = x + self.pos_emb(grids).to(x.device)
        positions = self.rotary.prepare(grids, x.device)
        clip_lens = [t * h * w for t, h, w in grids]
        for block in self.blocks:
            x = block(x, positions, clip_lens, self.rotary)
        x = self.final_layernorm(x)
        merge, pooled = self.config.spatial_merge_size, []
        for (t, h, w), clip in zip(grids, x.split(clip_lens)):
            frames = clip.view(t, h, w, -1).mean(dim=0)
            pooled.append(merge_block_order(frames, merge))
        return torch.cat(pooled)
