"""Qwen3-VL's vision tower: images (and video frames) -> embeddings in the language model's width.

    x  = patch_embed(pixels) + bilinear(pos_embed grid -> image grid)      one row per 16x16x2 patch
    for each block:                                                         attention within each frame,
        x = x + proj(attn(rope2d(q), rope2d(k), v))   q, k, v = qkv(layernorm(x))        2-D rotary on (row, col)
        x = x + fc2(gelu(fc1(layernorm(x))))
        (deepstack blocks also emit merger_j(x))
    out = merger(x): layernorm, 2x2 neighbouring patches concatenated, fc1, gelu, fc2

Patches arrive (from the image processor) in spatial-merge-block order: the ``m x m`` patches that merge
into one language-model token are consecutive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.host import Host
from atom_core.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from atom_core.layers.norm import LayerNorm
from atom_core.layers.params import copy_checked, make_param, materialize
from atom_core.layers.rotary import cos_sin_cache
from atom_kernels import mrope

ACTIVATIONS = {
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "gelu": F.gelu,
    "silu": F.silu,
}


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    num_position_embeddings: int
    deepstack_indexes: tuple[int, ...]
    hidden_act: str
    rope_theta: float
    layer_norm_eps: float = 1e-6  # the blocks' and the mergers' LayerNorms

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_hf(cls, vc: Any) -> VisionConfig:
        rope = getattr(vc, "rope_parameters", None) or {}
        return cls(
            depth=vc.depth, hidden_size=vc.hidden_size, intermediate_size=vc.intermediate_size,
            num_heads=vc.num_heads, in_channels=vc.in_channels, patch_size=vc.patch_size,
            temporal_patch_size=vc.temporal_patch_size, spatial_merge_size=vc.spatial_merge_size,
            out_hidden_size=vc.out_hidden_size, num_position_embeddings=vc.num_position_embeddings,
            deepstack_indexes=tuple(getattr(vc, "deepstack_visual_indexes", None) or ()),
            hidden_act=vc.hidden_act, rope_theta=float(rope.get("rope_theta", 10000.0)),
        )


class PatchEmbed(nn.Module):
    """A Conv3d whose kernel equals its stride, applied to pre-cut patches: one linear map per patch.
    The checkpoint's ``[hidden, C, T, P, P]`` kernel is stored flattened ``[hidden, C*T*P*P]``."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        in_features = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
        self.weight = make_param((cfg.hidden_size, in_features), torch.get_default_dtype(),
                                 weight_loader=self.load_kernel)
        self.bias = make_param((cfg.hidden_size,), torch.get_default_dtype())

    def load_kernel(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        kernel = materialize(loaded)
        if kernel.shape[0] != param.shape[0] or kernel[0].numel() != param.shape[1]:
            raise ValueError(f"patch kernel {tuple(kernel.shape)} does not flatten to {tuple(param.shape)}")
        copy_checked(param.data, kernel.reshape(param.shape))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return F.linear(pixel_values.to(self.weight.dtype), self.weight, self.bias)


def merge_block_order(grid: torch.Tensor, merge: int) -> torch.Tensor:
    """``[h, w, ...]`` -> ``[h*w, ...]`` in spatial-merge-block order (each ``merge x merge`` block contiguous)."""
    h, w = grid.shape[:2]
    blocks = grid.reshape(h // merge, merge, w // merge, merge, *grid.shape[2:])
    return blocks.transpose(1, 2).reshape(h * w, *grid.shape[2:])


class LearnedPositionGrid(nn.Module):
    """A square table of learned position embeddings, resampled bilinearly (corners aligned) to each
    image's patch grid."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.side = int(cfg.num_position_embeddings**0.5)
        self.merge = cfg.spatial_merge_size
        self.weight = make_param((cfg.num_position_embeddings, cfg.hidden_size), torch.get_default_dtype())

    def forward(self, grid_thw: Sequence[Sequence[int]]) -> torch.Tensor:
        table = self.weight.float().view(self.side, self.side, -1).permute(2, 0, 1)[None]
        out = []
        for t, h, w in grid_thw:
            resampled = F.interpolate(table, size=(h, w), mode="bilinear", align_corners=True)[0].permute(1, 2, 0)
            out.append(merge_block_order(resampled, self.merge).repeat(t, 1))
        return torch.cat(out).to(self.weight.dtype)


class VisionRotary(nn.Module):
    """2-D rotary over each head: the first half of the frequencies rotate by the patch's row, the second
    half by its column (the same frequencies for both).  Runs as the MRoPE kernel with chunked sections
    ``(d/4, d/4, 0)`` over positions ``(row, col, col)`` and a cache of the frequencies repeated twice."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.merge = cfg.spatial_merge_size
        quarter = self.head_dim // 4
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, 2 * quarter, 2, dtype=torch.float32) / (2 * quarter)))
        self.register_buffer("inv_freq", torch.cat([inv_freq, inv_freq]), persistent=False)
        self.register_buffer("cos_sin_cache", torch.empty(0, self.head_dim), persistent=False)
        self.section = (quarter, quarter, 0)

    def positions(self, grid_thw: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
        """``[3, patches]``: (row, col, col) of every patch, in merge-block order, repeated per frame."""
        rows = []
        for t, h, w in grid_thw:
            row, col = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
            rc = merge_block_order(torch.stack([row, col], dim=-1), self.merge).repeat(t, 1)
            rows.append(rc)
        rc = torch.cat(rows).T
        return torch.stack([rc[0], rc[1], rc[1]]).to(device)

    def prepare(self, grid_thw: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
        """This batch's positions, growing the cos/sin cache (host side, from the grid sizes) if needed."""
        longest = max(max(h, w) for _, h, w in grid_thw)
        if self.cos_sin_cache.shape[0] < longest:
            self.cos_sin_cache = cos_sin_cache(self.inv_freq.cpu(), longest).to(device)
        return self.positions(grid_thw, device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        return mrope(positions, q, k, self.cos_sin_cache, self.head_dim, self.section, False)


class VisionAttention(nn.Module):
    """Bidirectional attention within each frame's patches."""

    def __init__(self, cfg: VisionConfig, *, host: Host, prefix: str):
        super().__init__()
        self.qkv = QKVParallelLinear(cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_heads, bias=True,
                                     host=host, prefix=f"{prefix}.qkv")
        self.proj = RowParallelLinear(cfg.hidden_size, cfg.hidden_size, bias=True, host=host, prefix=f"{prefix}.proj")
        self.num_heads, self.head_dim = self.qkv.num_heads, cfg.head_dim

    def forward(self, x: torch.Tensor, positions: torch.Tensor, frame_lens: list[int], rotary: VisionRotary):
        q, k, v = self.qkv.split(self.qkv(x))
        q, k = rotary(positions, q, k)
        out = []
        for qf, kf, vf in zip(*(t.split(frame_lens) for t in (q, k, v))):
            qf, kf, vf = (t.view(-1, self.num_heads, self.head_dim).transpose(0, 1) for t in (qf, kf, vf))
            out.append(F.scaled_dot_product_attention(qf, kf, vf).transpose(0, 1).reshape(qf.shape[1], -1))
        return self.proj(torch.cat(out))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig, *, host: Host, prefix: str):
        super().__init__()
        self.linear_fc1 = ColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size], bias=True, host=host,
                                               prefix=f"{prefix}.linear_fc1")
        self.linear_fc2 = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, bias=True, host=host,
                                            prefix=f"{prefix}.linear_fc2")
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig, *, host: Host, prefix: str):
        super().__init__()
        self.norm1 = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.norm2 = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.attn = VisionAttention(cfg, host=host, prefix=f"{prefix}.attn")
        self.mlp = VisionMLP(cfg, host=host, prefix=f"{prefix}.mlp")

    def forward(self, x, positions, frame_lens, rotary):
        x = x + self.attn(self.norm1(x), positions, frame_lens, rotary)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """``m x m`` neighbouring patches -> one language-model token: layernorm (per patch, or over the
    concatenation when ``norm_after_merge``), concatenate, fc1, GELU, fc2."""

    def __init__(self, cfg: VisionConfig, *, norm_after_merge: bool, host: Host, prefix: str):
        super().__init__()
        self.merged = cfg.hidden_size * cfg.spatial_merge_size**2
        self.norm_after_merge = norm_after_merge
        self.norm = LayerNorm(self.merged if norm_after_merge else cfg.hidden_size, cfg.layer_norm_eps)
        self.linear_fc1 = ColumnParallelLinear(self.merged, [self.merged], bias=True, host=host,
                                               prefix=f"{prefix}.linear_fc1")
        self.linear_fc2 = RowParallelLinear(self.merged, cfg.out_hidden_size, bias=True, host=host,
                                            prefix=f"{prefix}.linear_fc2")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.view(-1, self.merged)) if self.norm_after_merge else self.norm(x).view(-1, self.merged)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionModel(nn.Module):
    """``deepstack=False``: a tower without deepstack blocks whatever the config says (Qwen3.5's; config
    classes derived from Qwen3-VL's, such as SGLang's, default ``deepstack_visual_indexes`` to [8, 16, 24])."""

    def __init__(self, hf_vision_config: Any, *, host: Host, prefix: str, deepstack: bool = True):
        super().__init__()
        cfg = self.config = VisionConfig.from_hf(hf_vision_config)
        if not deepstack:
            cfg = self.config = replace(cfg, deepstack_indexes=())
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed = LearnedPositionGrid(cfg)
        self.rotary = VisionRotary(cfg)
        self.blocks = nn.ModuleList(
            VisionBlock(cfg, host=host, prefix=f"{prefix}.blocks.{i}") for i in range(cfg.depth)
        )
        self.merger = PatchMerger(cfg, norm_after_merge=False, host=host, prefix=f"{prefix}.merger")
        self.deepstack_merger_list = nn.ModuleList(
            PatchMerger(cfg, norm_after_merge=True, host=host, prefix=f"{prefix}.deepstack_merger_list.{j}")
            for j in range(len(cfg.deepstack_indexes))
        )

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``pixel_values [patches, C*T*P*P]``, ``grid_thw [n, 3]`` -> (``[patches / m², out_hidden]``,
        one such tensor per deepstack block)."""
        grids = [tuple(g) for g in torch.as_tensor(grid_thw).tolist()]
        x = self.patch_embed(pixel_values) + self.pos_embed(grids).to(pixel_values.device)
        positions = self.rotary.prepare(grids, x.device)
        frame_lens = [h * w for t, h, w in grids for _ in range(t)]
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = block(x, positions, frame_lens, self.rotary)
            if i in self.config.deepstack_indexes:
                deepstack.append(self.deepstack_merger_list[self.config.deepstack_indexes.index(i)](x))
        return self.merger(x), deepstack
