"""Hybrid (linear-attention) models inside vLLM: vLLM's mamba-state contract over atom-core's GDN layers.

vLLM keeps the per-sequence state of a linear-attention layer in its KV-cache pool, one *block* per
sequence (more under prefix caching), and learns what to allocate from two places:

* the model class (:class:`HybridModel`, with vLLM's ``IsHybrid`` + ``HasInnerState``): the per-block
  state shapes and dtypes from the config alone (``get_mamba_state_shape_from_config`` /
  ``..._dtype_from_config``, used to size pages before the model exists) and the functions that copy a
  block's states for prefix caching (``get_mamba_state_copy_func``);
* each layer (:class:`VllmLinearAttentionState`, a vLLM ``MambaBase`` registered in
  ``static_forward_context`` under the layer's name): the same shapes and dtypes, and its ``mamba_type``,
  which selects vLLM's GDN metadata builder.  vLLM binds the layer's ``(conv, ssm)`` state tensors to it.

Layouts: the SSM state is V-major, ``[blocks, HV, V, K]`` (what vLLM's GDN kernels and copy functions
use); the conv state is as vLLM lays it out (``(width - 1, dim)`` per block by default, see
:func:`atom_vllm.compat.conv_state_dim_first`); atom-core's kernels take either through strides.  The
shapes come from atom-core (:func:`atom_core.layers.gdn.gdn_state_shapes`,
:func:`atom_kernels.gdn.ssm_state_shape`); the dtypes follow vLLM's cache settings
(``mamba_cache_dtype``, ``mamba_ssm_cache_dtype``), as for vLLM's own GDN layers.

Per step, :meth:`VllmLinearAttentionState.step` turns vLLM's ``GDNAttentionMetadata`` (decode tokens
first, then packed prefills; state indices; ``has_initial_state``; ``query_start_loc``) into atom-core's
:class:`~atom_core.host.LinearAttentionStep`.

Under torch.compile the layer's state part (its ``mix``: the conv and the delta rule, which read that metadata in
Python) is one opaque op, ``atom_vllm::linear_attention``, that looks the layer up in vLLM's forward context by
name, as vLLM's own GDN core op does; wherever vLLM splits its graph at its attention ops (piecewise CUDA graphs)
it splits at this op too, so the op runs outside the captured pieces, with each step's metadata, and writes its
result into an output the traced graph allocated before it (the next piece reads it at its captured address).

Speculative decoding (``--speculative-config``, e.g. Qwen3-Next's MTP drafts) follows vLLM's own GDN layers:
the conv state is a rolling buffer ``width - 1 + num_speculative_tokens`` wide and each sequence has
``1 + num_speculative_tokens`` SSM state blocks.  A step's speculative sequences (``spec_state_indices_tensor``,
``spec_query_start_loc``, ``num_accepted_tokens``) are atom-core's decode part: the state after draft token t goes
to block t, the step resumes from the block of the last accepted token, and the conv window starts at the accepted
offset (vLLM rolls back rejected tokens by those offsets alone).  The other sequences of such a step are prefills
(vLLM classifies them so); when they interleave with the speculative ones, ``token_order`` puts the speculative
tokens first.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from atom_core.errors import UnsupportedConfigError
from atom_core.host import LinearAttentionStep
from atom_core.layers.gdn import GDNConfig, gdn_state_shapes
from atom_kernels.gdn import V_MAJOR, ssm_state_shape
from atom_kernels.library import define
from atom_vllm import compat

StateShapes = tuple[tuple[int, ...], tuple[int, ...]]

_LIBRARY = torch.library.Library("atom_vllm", "FRAGMENT")


def _linear_attention_fake(inputs: list[torch.Tensor], out: torch.Tensor, layer_name: str) -> None:
    return None


def _linear_attention_impl(inputs, out, layer_name) -> None:
    from vllm.forward_context import get_forward_context

    out.copy_(get_forward_context().no_compile_layers[layer_name].mix_step(*inputs))


# Writes into ``out``, which the traced graph allocates before the op: vLLM replays its piecewise CUDA graphs with
# the addresses seen at capture, so the piece after this split point reads the op's result from where ``out`` was
# then (a fresh tensor returned from outside the pieces would be read from a stale address). vLLM's own GDN core
# op and attention ops take their outputs the same way.
_linear_attention = define("linear_attention", _linear_attention_fake, _linear_attention_impl, mutates_args=("out",),
                           library=_LIBRARY)
LINEAR_ATTENTION_OP = "atom_vllm::linear_attention"


def num_speculative_tokens(vllm_config: Any) -> int:
    """The draft tokens per step of the engine's speculative config (0 without one)."""
    return getattr(getattr(vllm_config, "speculative_config", None), "num_speculative_tokens", None) or 0


def state_shapes(vllm_config: Any) -> StateShapes:
    """Per-block ``(conv_shape, ssm_shape)`` of every linear-attention layer, in vLLM's layout, on one of the
    config's tensor-parallel ranks."""
    hf_config = vllm_config.model_config.hf_config
    tp = vllm_config.parallel_config.tensor_parallel_size
    return vllm_layout(*gdn_state_shapes(GDNConfig.from_hf(hf_config), tp), num_speculative_tokens(vllm_config))


def vllm_layout(conv_shape: tuple[int, ...], ssm_shape: tuple[int, ...], num_spec: int = 0) -> StateShapes:
    """atom-core's logical per-sequence shapes (conv ``(dim, width - 1)``, SSM K-major ``(HV, K, V)``) in the
    layout vLLM allocates: conv as vLLM orients it and ``num_spec`` columns wider (the speculative rolling
    buffer), SSM V-major ``(HV, V, K)``."""
    dim, taps = conv_shape
    taps += num_spec
    conv = (dim, taps) if compat.conv_state_dim_first() else (taps, dim)
    return conv, ssm_state_shape(V_MAJOR, *ssm_shape)


def state_dtypes(vllm_config: Any) -> tuple[torch.dtype, torch.dtype]:
    """``(conv dtype, SSM dtype)``: vLLM's rule for GDN layers (conv in ``mamba_cache_dtype``, "auto" = the
    model's dtype; SSM in ``mamba_ssm_cache_dtype``, "auto" = the conv state's)."""
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator

    cache = vllm_config.cache_config
    return MambaStateDtypeCalculator.gated_delta_net_state_dtype(
        vllm_config.model_config.dtype, cache.mamba_cache_dtype, cache.mamba_ssm_cache_dtype
    )


class HybridModel:
    """vLLM's ``IsHybrid`` classmethods for a wrapper whose atom-core model has Gated DeltaNet layers."""

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: Any) -> StateShapes:
        return state_shapes(vllm_config)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: Any) -> tuple[torch.dtype, torch.dtype]:
        return state_dtypes(vllm_config)

    @classmethod
    def get_mamba_state_copy_func(cls):
        """vLLM's copy functions for a GDN layer's (conv, SSM) states: they act on vLLM's own layouts,
        which are the ones these layers use."""
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateCopyFuncCalculator

        return MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func()


def linear_attention_state(vllm_config: Any, prefix: str, conv_shape, ssm_shape, dtype: torch.dtype,
                           mix) -> nn.Module:
    """The layer :meth:`atom_vllm.host.VllmHost.linear_attention_state` returns (see the module doc)."""
    shapes = vllm_layout(tuple(conv_shape), tuple(ssm_shape), num_speculative_tokens(vllm_config))
    expected = state_shapes(vllm_config)
    if shapes != expected:
        raise UnsupportedConfigError(f"{prefix}: state shapes {shapes} differ from the ones sized from the config "
                                     f"{expected} (the layer and HybridModel.get_mamba_state_shape_from_config disagree)")
    split_graph_at_linear_attention(vllm_config)
    num_v_heads, _, head_v_dim = ssm_shape
    return _layer_class()(vllm_config, prefix, shapes, state_dtypes(vllm_config), mix, (num_v_heads, head_v_dim))


def split_graph_at_linear_attention(vllm_config: Any) -> None:
    """Add ``atom_vllm::linear_attention`` to the engine's graph split points where vLLM splits at its attention
    ops (an empty list: vLLM captures whole graphs only, and the op runs inside them as vLLM's own GDN op does)."""
    splitting_ops = vllm_config.compilation_config.splitting_ops
    if splitting_ops and LINEAR_ATTENTION_OP not in splitting_ops:
        splitting_ops.append(LINEAR_ATTENTION_OP)


@functools.cache
def _layer_class() -> type:
    """:class:`VllmLinearAttentionState`, built on first use (its base, vLLM's ``MambaBase``, imports vLLM)."""
    return type("VllmLinearAttentionState", (_LinearAttentionState, compat.mamba_base_class()),
                {"__module__": __name__, "__doc__": _LinearAttentionState.__doc__})


class _LinearAttentionState(nn.Module):
    """One Gated DeltaNet layer's state under vLLM: a vLLM ``MambaBase`` layer (vLLM sizes, allocates and
    binds its ``(conv, ssm)`` tensors as ``self.kv_cache``) that is also atom-core's
    :class:`~atom_core.host.LinearAttentionState`.  Holds no parameters."""

    ssm_layout = V_MAJOR

    def __init__(self, vllm_config: Any, prefix: str, shapes: StateShapes, dtypes: tuple[torch.dtype, torch.dtype],
                 mix, row_shape: tuple[int, int]):
        super().__init__()
        self.prefix = prefix
        self._shapes = shapes
        self._dtypes = tuple(dtypes)
        self._mix = mix  # the owning layer's state part (a bound method: not a submodule)
        self._row_shape = list(row_shape)  # mix's output per token: (value heads, value head dim)
        self._conv_dim_first = compat.conv_state_dim_first()
        self.kv_cache = (torch.tensor([]), torch.tensor([]))  # until vLLM binds its blocks
        compat.register_forward_context_layer(vllm_config, prefix, self)

    # -- vLLM's MambaBase
    def get_state_shape(self) -> StateShapes:
        return self._shapes

    def get_state_dtype(self) -> tuple[torch.dtype, ...]:
        return self._dtypes

    @property
    def mamba_type(self):
        return compat.gdn_mamba_type()

    # -- atom-core's LinearAttentionState
    def run(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The layer's ``mix`` over this step; while Dynamo traces, as the opaque op (see the module doc)."""
        if torch.compiler.is_compiling():
            out = inputs[0].new_empty((inputs[0].shape[0], *self._row_shape))
            _linear_attention(list(inputs), out, self.prefix)
            return out
        return self.mix_step(*inputs)

    def mix_step(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self._mix(*inputs, self.step())

    def step(self) -> LinearAttentionStep:
        """This forward step's pools and slots, from vLLM's forward context.  No metadata for this layer
        (vLLM's profiling and warm-up runs) is a step without tokens: the layer outputs zeros."""
        from vllm.forward_context import get_forward_context

        metadata = get_forward_context().attn_metadata
        md = metadata.get(self.prefix) if isinstance(metadata, dict) else None
        conv, ssm = self._pools()
        if md is None or md.num_actual_tokens == 0:  # the layer warms its kernels up on pools laid out as these
            return LinearAttentionStep(conv_state=conv, ssm_state=ssm, ssm_layout=self.ssm_layout)
        if compat.gdn_prefill_checkpoint(md) is not None:  # mid-prefill state checkpoints (prefix caching)
            raise UnsupportedConfigError(f"{self.prefix}: vLLM asked for mid-prefill state checkpoints, which ATOM's "
                                         "GDN kernels do not write; run without prefix caching")
        step = LinearAttentionStep(conv_state=conv, ssm_state=ssm, ssm_layout=self.ssm_layout)
        slots = md.non_spec_state_indices_tensor  # [requests]: decodes first, then prefills (then padding)
        nd, npf = md.num_decodes, md.num_prefills
        if md.num_spec_decodes:  # then no plain decodes (vLLM runs them as prefills)
            self._speculative_part(md, step)
        elif md.num_decode_tokens:
            step.num_decode_tokens = md.num_decode_tokens
            step.decode_slots = slots[:nd]
        if npf:
            step.num_prefill_tokens = md.num_prefill_tokens
            step.prefill_cu_seqlens = md.non_spec_query_start_loc[nd : nd + npf + 1] - md.num_decode_tokens
            step.prefill_slots = slots[nd : nd + npf]
            step.prefill_has_initial_state = md.has_initial_state[nd : nd + npf]
        return step

    def _pools(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(conv [slots, dim, taps], ssm [slots, HV, V, K])``: vLLM's bound blocks as atom-core reads them, or,
        before vLLM binds them (its profiling run), empty pools of the same layout."""
        conv, ssm = self.kv_cache[0], self.kv_cache[1]
        if conv.dim() == 1 and conv.numel() == 0:
            conv = torch.empty(0, *self._shapes[0], dtype=self._dtypes[0])
            ssm = torch.empty(0, *self._shapes[1], dtype=self._dtypes[1])
        return (conv if self._conv_dim_first else conv.transpose(-1, -2)), ssm

    @staticmethod
    def _speculative_part(md, step: LinearAttentionStep) -> None:
        """The speculative sequences as the step's decode part (rows of ``spec_state_indices_tensor``: a
        sequence's ``1 + num_speculative_tokens`` blocks; under a full CUDA graph, padding rows of no tokens)."""
        blocks = md.spec_state_indices_tensor
        step.num_decode_tokens = md.num_spec_decode_tokens
        step.decode_slots = blocks[:, 0]  # the conv buffer lives in the first block
        step.decode_ssm_slots = blocks
        step.num_accepted_tokens = md.num_accepted_tokens
        step.decode_cu_seqlens = md.spec_query_start_loc
        if md.num_prefills:  # the batch interleaves them; without prefills the speculative tokens come first
            step.token_order = torch.cat([md.spec_token_indx, md.non_spec_token_indx])
