"""Rotary position embeddings and their scalings.

The inverse frequencies follow transformers' ``ROPE_INIT_FUNCTIONS`` for each ``rope_type``; the
scaling's attention factor (YaRN's mscale) is folded into the cos/sin cache, as transformers
folds it into cos/sin.
"""

from __future__ import annotations

import json
import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from atom_core.errors import UnsupportedConfigError
from atom_kernels import mrope, rotary_embedding


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _default(p: dict[str, Any], dim: int) -> tuple[torch.Tensor, float]:
    return _base_inv_freq(p["rope_theta"], dim), 1.0


def _linear(p: dict[str, Any], dim: int) -> tuple[torch.Tensor, float]:
    return _base_inv_freq(p["rope_theta"], dim) / p["factor"], 1.0


def _llama3(p: dict[str, Any], dim: int) -> tuple[torch.Tensor, float]:
    inv_freq = _base_inv_freq(p["rope_theta"], dim)
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(p: dict[str, Any], dim: int, max_position: int) -> tuple[torch.Tensor, float]:
    base, old_len = p["rope_theta"], p["original_max_position_embeddings"]
    factor = p.get("factor") or max_position / old_len
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (1.0 / pos_freqs) * extrapolation_weight
    return inv_freq, float(attention_factor)


INV_FREQ: dict[str, Callable[..., tuple[torch.Tensor, float]]] = {
    "default": lambda p, dim, max_pos: _default(p, dim),
    "linear": lambda p, dim, max_pos: _linear(p, dim),
    "llama3": lambda p, dim, max_pos: _llama3(p, dim),
    "yarn": _yarn,
}


def inv_freq_and_scaling(rope: dict[str, Any], rotary_dim: int, max_position: int) -> tuple[torch.Tensor, float]:
    rope_type = rope.get("rope_type", "default")
    if rope_type not in INV_FREQ:
        raise UnsupportedConfigError(f"rope_type {rope_type!r} is not supported; supported: {', '.join(INV_FREQ)}")
    return INV_FREQ[rope_type](rope, rotary_dim, max_position)


def cos_sin_cache(inv_freq: torch.Tensor, max_position: int, scaling: float = 1.0) -> torch.Tensor:
    """``[max_position, rotary_dim]`` fp32: ``cos`` then ``sin`` of ``position · inv_freq``."""
    freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :].float()
    return torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1)


_CACHES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def shared_cos_sin_cache(rope: dict[str, Any], rotary_dim: int, max_position: int, device: torch.device,
                         length: int | None = None) -> torch.Tensor:
    """One cos/sin cache of ``length`` positions (default ``max_position``) per (rope settings, rotary_dim,
    max_position, length, device), shared by every layer that asks for it (a 262k-position cache is 128 MiB; one
    per layer would waste GiBs).  ``max_position`` is the config's ``max_position_embeddings`` (YaRN's default
    factor reads it); ``length`` how many positions the table covers."""
    length = max_position if length is None else length
    key = (json.dumps(rope, sort_keys=True, default=str), rotary_dim, max_position, length, str(device))
    cache = _CACHES.get(key)
    if cache is None:
        with torch.device("cpu"):  # computed on the CPU as transformers does, then moved
            inv_freq, scaling = inv_freq_and_scaling(rope, rotary_dim, max_position)
            cache = cos_sin_cache(inv_freq, length, scaling).to(device)
        _CACHES[key] = cache
    return cache


def table_length(host: Any, max_position: int) -> int:
    """How many positions a model's rotary tables cover when built for ``host``: the host's ``max_positions`` (the
    longest sequence it will run now: the native runner grows it, :func:`grow_position_tables`) when it has one,
    else ``max_position`` (the config's ``max_position_embeddings``)."""
    bound = getattr(host, "max_positions", None)
    return max_position if bound is None else min(max_position, bound)


def grow_position_tables(model: nn.Module, length: int) -> None:
    """Rebuild every rotary table of ``model`` shorter than ``length`` positions to cover ``length``."""
    for module in model.modules():
        if isinstance(module, RotaryEmbedding) and module.cos_sin_cache.shape[0] < length:
            module.cos_sin_cache = shared_cos_sin_cache(module.rope, module.rotary_dim, module.max_position,
                                                        module.cos_sin_cache.device, length)


class RotaryEmbedding(nn.Module):
    """Rotates q and k in place by their positions (NeoX halves or GPT-J pairs; partial rotary).  Its cos/sin
    table covers ``length`` positions (default ``max_position``; :func:`table_length`)."""

    def __init__(self, head_size: int, rotary_dim: int, max_position: int, rope: dict[str, Any], *, is_neox: bool = True,
                 length: int | None = None):
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.is_neox = is_neox
        self.rope, self.max_position = rope, max_position
        cache = shared_cos_sin_cache(rope, rotary_dim, max_position, torch.get_default_device(), length)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor | None,
                q_norm: nn.Module | None = None, k_norm: nn.Module | None = None):
        """Rotate q and k in place; with ``q_norm``/``k_norm`` (:class:`~atom_core.layers.norm.RMSNorm` of
        ``head_size``; Qwen3) normalise each head first.  With NeoX halves both happen in one kernel: a plain
        rotary embedding is an MRoPE whose frequencies all read the first (here the only) position row, and the
        MRoPE kernel fuses the per-head norm and works on q and k where they lie (views of the q|k|v output)."""
        if q_norm is None:
            return rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_size, self.is_neox)
        if self.is_neox:
            return mrope(positions, q, k, self.cos_sin_cache, self.head_size, (self.rotary_dim // 2, 0, 0), False,
                         **_fused_norm(q_norm, k_norm))
        q = q_norm(q.reshape(-1, self.head_size)).view(q.shape)
        k = k_norm(k.reshape(-1, self.head_size)).view(k.shape)
        return rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_size, self.is_neox)

    def extra_repr(self) -> str:
        return f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, neox={self.is_neox}"


def _fused_norm(q_norm: nn.Module, k_norm: nn.Module) -> dict[str, Any]:
    """The per-head RMSNorms of q and k as the MRoPE kernel's arguments (both norms share eps and offset)."""
    return dict(q_weight=q_norm.weight, k_weight=k_norm.weight, eps=q_norm.eps, weight_offset=q_norm.weight_offset)


class MRotaryEmbedding(RotaryEmbedding):
    """Multimodal rotary embedding (NeoX): positions ``[3, T]`` (time, height, width) or ``[T]`` (text),
    each frequency reading the row ``mrope_section`` assigns it — chunked (Qwen2-VL, Qwen2.5-VL) or
    ``mrope_interleaved`` (Qwen3-VL, Qwen3.5).  ``forward`` optionally fuses the per-head q/k RMSNorm that
    precedes the rotation into the same kernel."""

    def __init__(self, head_size: int, rotary_dim: int, max_position: int, rope: dict[str, Any], *,
                 length: int | None = None):
        super().__init__(head_size, rotary_dim, max_position, rope, is_neox=True, length=length)
        self.mrope_section = tuple(int(s) for s in rope["mrope_section"])
        self.interleaved = bool(rope.get("mrope_interleaved", False))
        if sum(self.mrope_section) * 2 != rotary_dim:
            raise UnsupportedConfigError(
                f"mrope_section {list(self.mrope_section)} does not sum to rotary_dim/2 = {rotary_dim // 2}"
            )

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor | None,
                q_norm: nn.Module | None = None, k_norm: nn.Module | None = None):
        """Rotate q and k in place; with ``q_norm``/``k_norm`` (:class:`~atom_core.layers.norm.RMSNorm` of
        ``head_size``) normalise each head first, in the same pass."""
        norm = {} if q_norm is None else _fused_norm(q_norm, k_norm)
        return mrope(positions, q, k, self.cos_sin_cache, self.head_size, self.mrope_section, self.interleaved, **norm)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mrope_section={list(self.mrope_section)}, interleaved={self.interleaved}"


def get_rope(head_size: int, rotary_dim: int, max_position: int, rope: dict[str, Any], *,
             is_neox: bool = True, length: int | None = None) -> RotaryEmbedding:
    """The rotary embedding a config asks for: :class:`MRotaryEmbedding` when its rope parameters carry an
    ``mrope_section``, else :class:`RotaryEmbedding`; its table covers ``length`` positions (default
    ``max_position``)."""
    if rope.get("mrope_section"):
        return MRotaryEmbedding(head_size, rotary_dim, max_position, rope, length=length)
    return RotaryEmbedding(head_size, rotary_dim, max_position, rope, is_neox=is_neox, length=length)
