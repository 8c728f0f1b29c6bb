"""The SGLang host: what an ATOM model gets when SGLang builds it.

* ``attention`` -> SGLang's :class:`RadixAttention` (its KV cache, its attention backend), wrapped so the
  model calls it as ``attn(q, k, v)``; latent attention (``mla=``) gets one in the absorbed form over SGLang's
  latent KV pool (:mod:`atom_sglang.latent`), sparse latent attention one over SGLang's DSA pool
  (:mod:`atom_sglang.sparse`);
* ``linear_attention_state`` -> the layer's slots in SGLang's mamba state pool (hybrid models; see
  :mod:`atom_sglang.linear_attention`);
* ``tp`` -> SGLang's tensor-parallel group;
* ``quant`` -> ATOM's own parse of the checkpoint's ``quantization_config``.

Per-step metadata: the wrapper publishes SGLang's ``ForwardBatch`` on the host (:attr:`SGLangHost.forward_batch`)
before it calls the model and clears it afterwards; the attention modules read it from there.  It is a
plain attribute, not a ``ContextVar``: torch.compile cannot trace ``ContextVar.get`` (SGLang keeps its
own graph-visible flags in plain slots for the same reason).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from atom_core.errors import UnsupportedConfigError
from atom_sglang import compat
from atom_sglang.latent import SGLangLatentAttention, latent_attention
from atom_sglang.linear_attention import SGLangLinearAttentionState
from atom_sglang.radix_view import RadixAttentionView
from atom_sglang.sparse import sparse_latent_attention


class SGLangTP:
    """:class:`atom_core.host.TensorParallel` over an SGLang ``GroupCoordinator``."""

    def __init__(self, group: Any):
        self.group = group

    @property
    def rank(self) -> int:
        return self.group.rank_in_group

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(x)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return self.group.all_gather(x, dim=dim)


class SGLangAttention(RadixAttentionView, nn.Module):
    """``forward(q, k, v) -> out`` over SGLang's RadixAttention, with this step's ForwardBatch taken from
    the host.  ``q``: ``[T, heads * head_dim]``; ``k``/``v``: ``[T, kv_heads * head_dim]``; ``out``:
    ``[T, heads * head_dim]``."""

    def __init__(self, host: SGLangHost, attn: nn.Module, sinks: torch.Tensor | None = None):
        super().__init__()
        self._host = [host]  # a list keeps the host out of the module tree
        self.attn = attn  # a child, so SGLang finds every RadixAttention in the model
        self._sinks = [sinks]  # the model owns the parameter; keep it out of this module's parameters

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        forward_batch = self._host[0].forward_batch
        if forward_batch is None:
            raise RuntimeError(
                f"attention layer {self.attn.layer_id} ran without a ForwardBatch: call the model through its "
                "SGLang wrapper's forward, which publishes it"
            )
        sinks = self._sinks[0]
        kwargs = {}
        if sinks is not None:
            check_takes_sinks(compat.attention_backend(), self.attn.layer_id)
            kwargs["sinks"] = sinks
        out = self.attn(q, k, v, forward_batch, **kwargs)
        return out.reshape(q.shape[0], -1)


_TAKES_SINKS: dict[type, bool] = {}


def check_takes_sinks(backend: Any, layer_id: int) -> None:
    """An :class:`UnsupportedConfigError` when SGLang's attention ``backend`` cannot apply attention sinks: its
    ``forward_extend`` / ``forward_decode`` take no ``sinks`` argument (by name or ``**kwargs``), as SGLang's
    torch-native backend (rather than failing inside it with a TypeError, or ignoring them)."""
    kind = type(backend)
    if kind not in _TAKES_SINKS:
        def takes(fn: Any) -> bool:
            params = inspect.signature(fn).parameters.values()
            return any(p.name == "sinks" or p.kind is p.VAR_KEYWORD for p in params)

        _TAKES_SINKS[kind] = all(takes(getattr(kind, name)) for name in ("forward_extend", "forward_decode"))
    if not _TAKES_SINKS[kind]:
        raise UnsupportedConfigError(
            f"attention layer {layer_id} has attention sinks (gpt-oss), which SGLang's {kind.__name__} does not "
            "apply: serve it with a backend that does (--attention-backend triton or fa3)"
        )


class SGLangHost:
    """Builds an ATOM model's framework-facing layers out of SGLang's."""

    def __init__(self, quant: Any = None, tp: Any = None, layer_offset: int = 0):
        self.tp = tp if tp is not None else SGLangTP(compat.tp_group())
        # subtracted from a model's layer ids: a draft's layers are numbered from 0 in its own KV pool
        self.layer_offset = layer_offset
        self.quant = quant
        self.forward_batch: Any = None  # published by the wrapper around each forward
        self.sparse_selection: tuple[Any, torch.Tensor] | None = None  # (ForwardBatch, its top-k) of the last indexer
        self.attention_sinks_dtype = torch.float32  # its attention backends read sinks in fp32
        self.attention_layers: list[SGLangAttention | SGLangLatentAttention] = []
        self.linear_attention_states: list[SGLangLinearAttentionState] = []

    def attention(self, prefix: str, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                  *, sliding_window: int | None = None, sinks: torch.Tensor | None = None, mla: Any = None) -> nn.Module:
        layer_id -= self.layer_offset
        if mla is not None:
            build = latent_attention if mla.sparse is None else sparse_latent_attention
            layer = build(self, prefix, layer_id, num_heads, scale, mla, sliding_window=sliding_window, sinks=sinks)
            self.attention_layers.append(layer)
            return layer
        radix = compat.radix_attention_class()(
            num_heads, head_dim, scale,
            num_kv_heads=num_kv_heads,
            layer_id=layer_id,
            sliding_window_size=radix_window(sliding_window),
            quant_config=None,
            prefix=prefix,
        )
        layer = SGLangAttention(self, radix, sinks)
        self.attention_layers.append(layer)
        return layer

    def linear_attention_state(self, prefix: str, layer_id: int, conv_shape, ssm_shape, dtype,
                               mix) -> SGLangLinearAttentionState:
        """The layer's per-request state in SGLang's mamba pool (see :mod:`atom_sglang.linear_attention`)."""
        state = SGLangLinearAttentionState(self, prefix, layer_id, conv_shape, ssm_shape, dtype, mix)
        self.linear_attention_states.append(state)
        return state

    def sliding_window(self) -> int | None:
        """The one window SGLang's attention metadata is planned for (its exclusive convention), or None."""
        windows = {layer.attn.sliding_window_size for layer in self.attention_layers} - {-1, None}
        if len(windows) > 1:
            raise UnsupportedConfigError(
                f"layers use different sliding windows {sorted(windows)}; SGLang plans one window per model"
            )
        return windows.pop() if windows else None


def radix_window(sliding_window: int | None) -> int:
    """ATOM (transformers) counts the query itself in its window: key j is visible to query i when
    ``0 <= i - j < w``.  SGLang's ``sliding_window_size`` excludes it (``i - j <= w'``), so ``w' = w - 1``;
    -1 means full attention."""
    return -1 if sliding_window is None else sliding_window - 1
