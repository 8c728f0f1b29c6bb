"""ATOM's Gated DeltaNet layers over SGLang's hybrid linear-attention state.

SGLang recognises a hybrid GDN model by the class of its config (``hybrid_gdn_config``: its own
``Qwen3NextConfig``, ``Qwen3_5*Config``...; other configs are declared with ``register_linear_attn_model``).
For such a model it sizes a mamba state pool from ``config.mamba2_cache_params`` — per request slot and
linear-attention layer one conv state ``[conv_dim, W - 1]`` and one V-major SSM state ``[HV, V, K]`` —
and wraps its attention backend in ``HybridLinearAttnBackend``: full-attention layers (``RadixAttention``)
go to the usual backend, and its linear half (``GDNAttnBackend``) prepares each step's metadata.  ATOM's
layers read that metadata and the pool and run ATOM's kernels (not SGLang's ``RadixLinearAttention``):

    SGLang                                                    atom_core.host.LinearAttentionStep
    req_to_token_pool.mamba2_layer_cache(layer_id).conv[0]    conv_state  [slots, conv_dim, W - 1]
    req_to_token_pool.mamba2_layer_cache(layer_id).temporal   ssm_state   [slots, HV, V, K], "v_major"
    decode:  forward_metadata.mamba_cache_indices             decode_slots (one token per request)
    extend:  forward_metadata.mamba_cache_indices             prefill_slots
             forward_metadata.query_start_loc                 prefill_cu_seqlens
             forward_batch.extend_prefix_lens > 0             prefill_has_initial_state

The slots come from SGLang's own backend metadata, so CUDA-graph replay (static index buffers refreshed in
place, padded rows) behaves as it does for SGLang's layers.  A cached radix prefix reaches ATOM as a
request whose slot SGLang filled from the cache and whose ``extend_prefix_lens`` is positive.  SGLang's breakable
prefill CUDA graphs (its prefill capture on CUDA) capture the layer's projections and run the state step between
the captured segments, at every replay on the replayed batch, as SGLang's own GDN layers do there.

Not supported (refused when the model is built): the ``extra_buffer`` radix-cache strategy (SGLang then
expects the layer to copy intermediate chunk states into tracking slots, which ATOM's chunked kernel does
not expose: use ``--mamba-radix-cache-strategy no_buffer`` or ``--disable-radix-cache``) and speculative
decoding (target-verify steps need SGLang's per-draft-token state buffers).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from atom_core.config import text_config
from atom_core.errors import UnsupportedConfigError
from atom_core.host import LinearAttentionStep
from atom_kernels.gdn import V_MAJOR, ssm_state_shape
from atom_sglang import compat

if TYPE_CHECKING:
    from atom_sglang.host import SGLangHost

SSM_LAYOUT = V_MAJOR  # how SGLang's mamba pool stores the SSM state ("temporal"): [slots, HV, V, K]


class SGLangLinearAttentionState:
    """What :meth:`SGLangHost.linear_attention_state` returns for one GDN layer."""

    ssm_layout = SSM_LAYOUT

    def __init__(self, host: SGLangHost, prefix: str, layer_id: int, conv_shape: tuple[int, ...],
                 ssm_shape: tuple[int, int, int], dtype: torch.dtype, mix: Callable[..., torch.Tensor]):
        self._host = host
        self.prefix = prefix
        self.layer_id = layer_id
        self.conv_shape = tuple(conv_shape)
        self.ssm_shape = ssm_state_shape(SSM_LAYOUT, *ssm_shape)  # per slot, as SGLang stores it
        self._mix = mix
        self._warmed = False
        del dtype  # the pool's dtypes are SGLang's (SGLANG_MAMBA_CONV_DTYPE, mamba_ssm_dtype); the kernels follow them

    def run(self, *inputs: torch.Tensor) -> torch.Tensor:
        if compat.in_breakable_cuda_graph():
            return _mix_between_segments()(self, *inputs)
        return self.mix_now(*inputs)

    def mix_now(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The layer's mix over the step SGLang is running now (read when called: at a graph replay, the replayed
        batch's slots and offsets)."""
        step = self.step()
        if not self._warmed:
            self._warm_up(inputs, step)
        return self._mix(*inputs, step)

    def _warm_up(self, inputs: tuple[torch.Tensor, ...], step: LinearAttentionStep) -> None:
        """SGLang runs no step without tokens (vLLM's profiling run is one), so the first step not being captured
        into a CUDA graph hands the layer an empty one over SGLang's pools first: the layer compiles its kernels
        for every launch class then (atom_core.layers.gdn.GatedDeltaNet._warm_up), not on a later request."""
        if inputs[0].device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return
        self._warmed = True
        empty = LinearAttentionStep(conv_state=step.conv_state, ssm_state=step.ssm_state, ssm_layout=step.ssm_layout)
        self._mix(*(x[:0] for x in inputs), empty)

    def step(self) -> LinearAttentionStep:
        forward_batch = self._host.forward_batch
        if forward_batch is None:
            raise RuntimeError(f"{self.prefix} ran without a ForwardBatch: call the model through its SGLang wrapper's forward")
        backend = compat.linear_attention_backend()
        cache = backend.req_to_token_pool.mamba2_layer_cache(self.layer_id)
        conv, ssm = cache.conv[0], cache.temporal
        if tuple(conv.shape[1:]) != self.conv_shape or tuple(ssm.shape[1:]) != self.ssm_shape:
            raise UnsupportedConfigError(
                f"{self.prefix}: SGLang's mamba pool holds conv {tuple(conv.shape[1:])} / SSM {tuple(ssm.shape[1:])} "
                f"per slot; the layer needs conv {self.conv_shape} / SSM {self.ssm_shape} (V-major)"
            )
        step = LinearAttentionStep(conv_state=conv, ssm_state=ssm, ssm_layout=SSM_LAYOUT)
        mode = forward_batch.forward_mode
        if mode.is_idle():
            return step
        meta = backend.forward_metadata
        slots = meta.mamba_cache_indices
        if mode.is_decode():  # one token per request
            step.num_decode_tokens = slots.shape[0]
            step.decode_slots = slots
        elif mode.is_extend_or_draft_extend_or_mixed() and not mode.is_split_prefill():
            # EXTEND, or MIXED (decode requests ride along as one-token extends after their prefix)
            step.num_prefill_tokens = int(forward_batch.extend_num_tokens)
            step.prefill_cu_seqlens = meta.query_start_loc
            step.prefill_slots = slots
            step.prefill_has_initial_state = forward_batch.extend_prefix_lens > 0
        else:
            raise UnsupportedConfigError(
                f"{self.prefix}: SGLang forward mode {mode.name} (speculative decoding, split prefill, ...) is not "
                "supported by ATOM's GDN layers"
            )
        return step


@functools.cache
def _mix_between_segments() -> Callable[..., torch.Tensor]:
    """:meth:`SGLangLinearAttentionState.mix_now` as an eager break of SGLang's breakable prefill CUDA graphs.  The
    step's token count, sequence count and metadata tensors are the batch's, so the conv and delta-rule launches
    cannot be replayed from a capture: at every replay the break runs them on the replayed batch (inputs and output
    are the capture's buffers; rows past the batch's tokens are padding and come out zero), as SGLang runs its own
    GDN layers there."""
    return compat.eager_break(SGLangLinearAttentionState.mix_now)


def check_state_plan(hf_config: Any, states: list[SGLangLinearAttentionState], model_name: str) -> None:
    """SGLang's mamba pool plan (its config's ``mamba2_cache_params``) covers exactly the ATOM model's
    linear-attention layers with their shapes, and the server settings are ones these layers support."""
    cfg = text_config(hf_config)
    try:
        params = cfg.mamba2_cache_params
    except AttributeError:
        params = None
    if params is None:
        raise UnsupportedConfigError(
            f"{model_name}: SGLang does not treat this config ({type(cfg).__name__}) as a hybrid linear-attention "
            "model, so it would allocate no state for its linear-attention layers; SGLang recognises configs by "
            "class (hybrid_gdn_config) or by a LinearAttnModelSpec (register_linear_attn_model)"
        )
    layers = [state.layer_id for state in states]
    if list(params.layers) != layers:
        raise UnsupportedConfigError(
            f"{model_name}: SGLang plans linear-attention state for layers {list(params.layers)}, ATOM's model has "
            f"linear-attention layers {layers} (layer_types vs full_attention_interval in config.json disagree?)"
        )
    conv, temporal = tuple(params.shape.conv[0]), tuple(params.shape.temporal)
    for state in states:
        if conv != state.conv_shape or temporal != state.ssm_shape:
            raise UnsupportedConfigError(
                f"{state.prefix}: SGLang sizes its state as conv {conv} / SSM {temporal} per slot; the layer needs "
                f"conv {state.conv_shape} / SSM {state.ssm_shape} (V-major)"
            )
    reason = compat.unsupported_linear_attention_settings()
    if reason is not None:
        raise UnsupportedConfigError(f"{model_name}: {reason}")
