"""The ops a model calls in its forward, as ``torch.ops.atom`` custom ops for torch.compile.

A host that compiles a model's forward (vLLM's ``@support_torch_compile``, SGLang's ``--enable-torch-compile``)
traces it with Dynamo, which cannot follow an op's Python dispatch and Triton launchers.  While it traces, each
public op (:class:`atom_kernels.dispatch.Op`) calls its ``traced`` form instead: the same call through a custom
op the compiler records as one opaque node, whose fake implementation gives the outputs' shapes and dtypes and
whose real implementation is the op's ordinary dispatch.  Outside compilation an op never goes through here.

RMSNorm, gated RMSNorm and the rotary embeddings are the exceptions: they are traced as their torch math, for the
compiler to fuse (see ``_rms_norm_traced``, ``_rotary_traced``).

Custom-op schemas hold tensors, numbers, strings, dtypes and lists of them, so ops whose public signature
takes other objects (``fused_moe``'s :class:`ExpertQuant`) flatten them; an op that writes an input in place
(``reshape_and_cache``) declares the mutation.
"""

import importlib
import math
from collections.abc import Callable

import torch
from torch import Tensor

from atom_kernels.dispatch import OPS
from atom_kernels.ops.fused_moe import ExpertQuant

NAMESPACE = "atom"
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


def define(name: str, fake: Callable, impl: Callable, mutates_args: tuple[str, ...] = (),
           library: torch.library.Library = _LIBRARY):
    """Register ``<library's namespace>::<name>`` (``atom::<name>`` by default) with ``fake``'s signature (its
    annotations are the schema); returns the ``torch.ops`` handle.  The implementation is registered on the
    dispatcher directly (one kernel for every device, no autograd) rather than through ``torch.library.custom_op``,
    whose Python wrapper costs ~20 µs more per call: that is paid on every op of every layer wherever the host runs
    its compiled graph without a CUDA graph (vLLM's prefill chunks above its largest capture size)."""
    schema = torch.library.infer_schema(fake, mutates_args=mutates_args)
    library.define(name + schema)
    library.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{library.ns}::{name}", fake, lib=library)
    return getattr(getattr(torch.ops, library.ns), name)


def _eager(name: str) -> Callable:
    return OPS[name].eager


# ---- rms_norm: traced as its torch math ------------------------------------------------------------------------
# Under compilation RMSNorm is left to the compiler, as vLLM does with its own: Inductor fuses the residual add,
# the norm and the casts around it into one kernel with its neighbours, where an opaque call is one more launch
# and one more pass over the activations.  Eager calls keep the Triton kernel.
def _rms_norm_traced(x, weight, eps, residual=None, weight_offset=0.0):
    from atom_kernels.ops.rms_norm.reference import rms_norm

    return rms_norm(x, weight, eps, residual, weight_offset)


def _rms_norm_gated_traced(x, z, weight, eps):
    from atom_kernels.ops.rms_norm_gated.reference import rms_norm_gated

    return rms_norm_gated(x, z, weight, eps)


# ---- silu_and_mul ---------------------------------------------------------------------------------------------
def _silu_and_mul_fake(x: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


_silu_and_mul = define("silu_and_mul", _silu_and_mul_fake, lambda x: _eager("silu_and_mul")(x))


# ---- rotary embeddings: traced as their torch math, out of place ------------------------------------------------
# The eager ops rotate q and k in place, and q and k are views of the QKV projection's output.  Traced as an opaque
# op mutating views, the compiler functionalizes the mutation: it clones q and k and scatters the results back into
# the projection's output (vLLM compiles with auto_functionalized v1), passes vLLM's own graph does not have.  So
# the traced form is the reference's out-of-place math, which Inductor fuses with the norms and the split of q, k
# and v, as it does vLLM's own rotary embedding; every caller takes the returned q and k.
def _rotary_traced(positions, q, k, cos_sin_cache, head_size, is_neox=True):
    from atom_kernels.ops.rotary_embedding.reference import rotated

    return rotated(positions, q, k, cos_sin_cache, head_size, is_neox)


def _mrope_traced(positions, q, k, cos_sin_cache, head_size, mrope_section, interleaved=False, *, q_weight=None,
                  k_weight=None, eps=1e-6, weight_offset=0.0):
    from atom_kernels.ops.mrope.reference import rotated

    return rotated(positions, q, k, cos_sin_cache, head_size, mrope_section, interleaved, q_weight=q_weight,
                   k_weight=k_weight, eps=eps, weight_offset=weight_offset)


# ---- mixture of experts ------------------------------------------------------------------------------------------
def _topk_routing_fake(router_logits: Tensor, top_k: int, scoring: str, renormalize: bool,
                       correction_bias: Tensor | None, n_group: int, topk_group: int,
                       routed_scaling_factor: float) -> tuple[Tensor, Tensor]:
    tokens = router_logits.shape[0]
    return (router_logits.new_empty((tokens, top_k), dtype=torch.float32),
            router_logits.new_empty((tokens, top_k), dtype=torch.int32))


def _topk_routing_impl(router_logits, top_k, scoring, renormalize, correction_bias, n_group, topk_group,
                       routed_scaling_factor):
    return _eager("topk_routing")(router_logits, top_k, scoring=scoring, renormalize=renormalize,
                                  correction_bias=correction_bias, n_group=n_group, topk_group=topk_group,
                                  routed_scaling_factor=routed_scaling_factor)


_topk_routing = define("topk_routing", _topk_routing_fake, _topk_routing_impl)


def _topk_routing_traced(router_logits, top_k, *, scoring="softmax", renormalize=True, correction_bias=None,
                         n_group=1, topk_group=1, routed_scaling_factor=1.0):
    return _topk_routing(router_logits, top_k, scoring, renormalize, correction_bias, n_group, topk_group,
                         routed_scaling_factor)


def _fused_moe_fake(hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                    expert_map: Tensor | None, quant_format: str | None, w13_scale: Tensor | None,
                    w2_scale: Tensor | None, block_shape: list[int] | None, act_dtype: torch.dtype | None,
                    w13_bias: Tensor | None, w2_bias: Tensor | None, activation: str,
                    swiglu_limit: float | None = None) -> Tensor:
    return hidden.new_empty(hidden.shape)


def _fused_moe_impl(hidden, w13, w2, topk_weights, topk_ids, expert_map, quant_format, w13_scale, w2_scale,
                    block_shape, act_dtype, w13_bias, w2_bias, activation, swiglu_limit=None):
    quant = None
    if quant_format is not None:
        quant = ExpertQuant(quant_format, w13_scale, w2_scale, tuple(block_shape) if block_shape else None, act_dtype)
    return _eager("fused_moe")(hidden, w13, w2, topk_weights, topk_ids, expert_map=expert_map, quant=quant,
                               w13_bias=w13_bias, w2_bias=w2_bias, activation=activation, swiglu_limit=swiglu_limit)


_fused_moe = define("fused_moe", _fused_moe_fake, _fused_moe_impl)


def _fused_moe_traced(hidden, w13, w2, topk_weights, topk_ids, *, expert_map=None, quant=None, config=None,
                      w13_bias=None, w2_bias=None, activation="silu", swiglu_limit=None):
    if config is not None:
        raise ValueError("fused_moe: a kernel config is for benchmarks; it cannot be traced by torch.compile")
    biases = (w13_bias, w2_bias, activation, swiglu_limit)
    if quant is None:
        return _fused_moe(hidden, w13, w2, topk_weights, topk_ids, expert_map, None, None, None, None, None, *biases)
    block = list(quant.block_shape) if quant.block_shape is not None else None
    return _fused_moe(hidden, w13, w2, topk_weights, topk_ids, expert_map, quant.format, quant.w13_scale,
                      quant.w2_scale, block, quant.act_dtype, *biases)


# ---- quantized linear layers -----------------------------------------------------------------------------------
def _quant_fp8_fake(x: Tensor, group_size: int | None, static_scale: Tensor | None) -> tuple[Tensor, Tensor]:
    groups = 1 if group_size is None else math.ceil(x.shape[-1] / group_size)
    return (x.new_empty(x.shape, dtype=torch.float8_e4m3fn),
            x.new_empty((*x.shape[:-1], groups), dtype=torch.float32))


_quant_fp8 = define("quant_fp8", _quant_fp8_fake,
                    lambda x, group_size, static_scale: _eager("quant_fp8")(x, group_size, static_scale))


def _quant_fp8_traced(x, group_size=None, static_scale=None):
    return _quant_fp8(x, group_size, static_scale)


def _fp8_scaled_mm_fake(a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor, bias: Tensor | None,
                        out_dtype: torch.dtype) -> Tensor:
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


_fp8_scaled_mm = define("fp8_scaled_mm", _fp8_scaled_mm_fake,
                        lambda a, a_scale, b, b_scale, bias, out_dtype:
                        _eager("fp8_scaled_mm")(a, a_scale, b, b_scale, bias, out_dtype))


def _fp8_scaled_mm_traced(a, a_scale, b, b_scale, bias=None, out_dtype=torch.bfloat16):
    return _fp8_scaled_mm(a, a_scale, b, b_scale, bias, out_dtype)


def _fp8_block_mm_fake(a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor, block_size: list[int],
                       bias: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


_fp8_block_mm = define("fp8_block_mm", _fp8_block_mm_fake,
                       lambda a, a_scale, b, b_scale, block_size, bias, out_dtype:
                       _eager("fp8_block_mm")(a, a_scale, b, b_scale, tuple(block_size), bias, out_dtype))


def _fp8_block_mm_traced(a, a_scale, b, b_scale, block_size=(128, 128), bias=None, out_dtype=torch.bfloat16):
    return _fp8_block_mm(a, a_scale, b, b_scale, list(block_size), bias, out_dtype)


def _mxfp4_mm_fake(x: Tensor, w: Tensor, w_scale: Tensor, bias: Tensor | None, layout: str,
                   static_weights: bool) -> Tensor:
    return x.new_empty((x.shape[0], w.shape[0]))


_mxfp4_mm = define("mxfp4_mm", _mxfp4_mm_fake,
                   lambda x, w, w_scale, bias, layout, static_weights:
                   _eager("mxfp4_mm")(x, w, w_scale, bias, layout=layout, static_weights=static_weights))


def _mxfp4_mm_traced(x, w, w_scale, bias=None, layout="rows", static_weights=False):
    return _mxfp4_mm(x, w, w_scale, bias, layout, static_weights)


# ---- attention ---------------------------------------------------------------------------------------------
def _mla_decode_fake(q: Tensor, cache: Tensor, block_table: Tensor, seq_lens: Tensor, scale: float,
                     kv_lora_rank: int) -> Tensor:
    return q.new_empty((q.shape[0], q.shape[1], kv_lora_rank))


_mla_decode = define("mla_decode", _mla_decode_fake,
                     lambda q, cache, block_table, seq_lens, scale, kv_lora_rank:
                     _eager("mla_decode")(q, cache, block_table, seq_lens, scale, kv_lora_rank))


def _mla_decode_traced(q, cache, block_table, seq_lens, scale, kv_lora_rank):
    return _mla_decode(q, cache, block_table, seq_lens, scale, kv_lora_rank)


# ---- DeepSeek sparse attention ---------------------------------------------------------------------------
def _indexer_scores_fake(q: Tensor, weights: Tensor, k_cache: Tensor, block_table: Tensor, token_seq: Tensor,
                         token_pos: Tensor, scale: float) -> Tensor:
    return q.new_empty((q.shape[0], block_table.shape[1] * k_cache.shape[1]), dtype=torch.float32)


_indexer_scores = define("indexer_scores", _indexer_scores_fake,
                         lambda q, weights, k_cache, block_table, token_seq, token_pos, scale:
                         _eager("indexer_scores")(q, weights, k_cache, block_table, token_seq, token_pos, scale))


def _topk_indices_fake(scores: Tensor, k: int) -> Tensor:
    return scores.new_empty((scores.shape[0], k), dtype=torch.int32)


_topk_indices = define("topk_indices", _topk_indices_fake, lambda scores, k: _eager("topk_indices")(scores, k))


def _sparse_mla_fake(q: Tensor, cache: Tensor, slots: Tensor, scale: float, kv_lora_rank: int,
                     sinks: Tensor | None = None) -> Tensor:
    return q.new_empty((q.shape[0], q.shape[1], kv_lora_rank))


_sparse_mla = define("sparse_mla", _sparse_mla_fake,
                     lambda q, cache, slots, scale, kv_lora_rank, sinks=None:
                     _eager("sparse_mla")(q, cache, slots, scale, kv_lora_rank, sinks))


def _paged_attention_fake(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
                          query_start_loc: Tensor, scale: float, sliding_window: int | None, sinks: Tensor | None,
                          soft_cap: float | None, k_scale: Tensor | None, v_scale: Tensor | None) -> Tensor:
    return q.new_empty(q.shape)


_paged_attention = define(
    "paged_attention", _paged_attention_fake,
    lambda q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, sliding_window, sinks, soft_cap,
    k_scale, v_scale: _eager("paged_attention")(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale,
                                                sliding_window=sliding_window, sinks=sinks, soft_cap=soft_cap,
                                                k_scale=k_scale, v_scale=v_scale))


def _paged_attention_traced(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, *,
                            sliding_window=None, sinks=None, soft_cap=None, k_scale=None, v_scale=None):
    return _paged_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, sliding_window, sinks,
                            soft_cap, k_scale, v_scale)


def _reshape_and_cache_fake(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor,
                            k_scale: Tensor | None, v_scale: Tensor | None) -> None:
    return None


_reshape_and_cache = define("reshape_and_cache", _reshape_and_cache_fake,
                            lambda k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale:
                            _eager("reshape_and_cache")(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale),
                            mutates_args=("k_cache", "v_cache"))


def _reshape_and_cache_traced(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None):
    _reshape_and_cache(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)


# op name -> its traced form
TRACED: dict[str, Callable] = {
    "rms_norm": _rms_norm_traced,
    "rms_norm_gated": _rms_norm_gated_traced,
    "silu_and_mul": lambda x: _silu_and_mul(x),
    "rotary_embedding": _rotary_traced,
    "mrope": _mrope_traced,
    "topk_routing": _topk_routing_traced,
    "fused_moe": _fused_moe_traced,
    "quant_fp8": _quant_fp8_traced,
    "fp8_scaled_mm": _fp8_scaled_mm_traced,
    "fp8_block_mm": _fp8_block_mm_traced,
    "mxfp4_mm": _mxfp4_mm_traced,
    "mla_decode": _mla_decode_traced,
    "indexer_scores": lambda q, weights, k_cache, block_table, token_seq, token_pos, scale:
        _indexer_scores(q, weights, k_cache, block_table, token_seq, token_pos, scale),
    "topk_indices": lambda scores, k: _topk_indices(scores, k),
    "sparse_mla": lambda q, cache, slots, scale, kv_lora_rank, sinks=None:
        _sparse_mla(q, cache, slots, scale, kv_lora_rank, sinks),
    "paged_attention": _paged_attention_traced,
    "reshape_and_cache": _reshape_and_cache_traced,
}

for _name, _traced in TRACED.items():
    importlib.import_module(f"atom_kernels.ops.{_name}")  # registers the op
    OPS[_name].traced = _traced
