"""DeepSeek-V4 (``DeepseekV4ForCausalLM``): shared-KV attention over a sliding window plus compressed entries, with
hyper-connections around every block and hash- or top-k-routed experts.

    h = [e, ..., e]                                  hc_mult residual streams of the token embedding  [T, n, H]
    per layer (x = the streams collapsed by the block's hyper-connection, see atom_core.layers.hyper_connection):
        r   = q_norm(wq_a(x));  q = rope(rmsnorm₀(wq_b(r)))      [heads, D], rmsnorm₀: per head, unweighted
        kv  = rope(norm(wkv(x)))                                  [D], one head, both key and value
        o   = Σ_j p_j v_j,  p = softmax([q·v_j · D^-½ for v_j in kv of the last W tokens, then entries | sink])
              without the sink's share; entries: sliding-window layers none; HCA one per m tokens (every one the
              query has passed); CSA one per m tokens pooled over 2m (two series), the indexer's top-k of them
        o   = rope⁻¹(o)  (K = V carries its rope into the output; the rotation back at the query's position)
        y   = wo_b([wo_a,g(o_g) for each of o_groups head groups])
        entry(window) = rope(norm(Σ_j softmax_j(wgate(x_j) + ape_j) ⊙ wkv(x_j)))   at the window's first position
        ffn: experts chosen by tid2eid[token id] (hash_moe) or top-k of sqrtsoftplus(x Wᵣᵀ) + bias (moe),
             weights sqrtsoftplus scores renormalised · routed_scaling_factor; plus one shared expert
    out = norm(hc_head(h))

Rope rotates the *last* ``qk_rope_head_dim`` features of each head in adjacent pairs; sliding-window layers use the
``main`` rope parameters, CSA / HCA layers (and their compressors and indexer) the ``compress`` ones.  The host
caches the window, the compressor's projections and the entries (:class:`atom_core.host.CompressedAttentionSpec`).
The multi-token-prediction layers (``mtp.*``) are skipped at load.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.config import text_config
from atom_core.errors import CheckpointError, UnsupportedConfigError
from atom_core.host import CompressedAttentionSpec, CompressedIndexerSpec, Host
from atom_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from atom_core.layers.hyper_connection import HyperConnection, HyperHead, unweighted_rms_norm
from atom_core.layers.linear import ReplicatedLinear
from atom_core.layers.moe import FusedMoE
from atom_core.layers.norm import RMSNorm
from atom_core.layers.params import copy_checked, make_param, materialize
from atom_core.layers.rotary import get_rope, table_length
from atom_core.loader import WeightMapper
from atom_core.loader.experts import with_experts
from atom_core.models.base import CausalLM
from atom_core.models.deepseek_v32 import Fp32Linear

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
MLP_TYPES = ("hash_moe", "moe")
SCORES = {"sqrtsoftplus": lambda x: F.softplus(x).sqrt(), "sigmoid": torch.sigmoid}

# checkpoint names (DeepSeek's published ones, and the "model."-prefixed ones transformers' save_pretrained writes)
# -> this file's modules
RENAMES = (
    (r"^layers\.", "model.layers."),
    (r"^embed\.weight$", "model.embed_tokens.weight"),
    (r"^norm\.weight$", "model.norm.weight"),
    (r"^hc_head_(fn|base|scale)$", r"model.hc_head.hc_\1"),
    (r"^head\.weight$", "lm_head.weight"),
    (r"\.hc_(attn|ffn)_(fn|base|scale)$", r".\1_hc.\2"),
    (r"\.ffn\.gate\.bias$", ".ffn.gate.e_score_correction_bias"),
)
MTP_NAMES = (r"(^|\.)mtp\.",)


@dataclasses.dataclass(frozen=True)
class V4Dims:
    """What DeepSeek-V4's layers read from its config, checked once."""

    hidden_size: int
    vocab_size: int
    num_heads: int
    head_dim: int
    rope_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    eps: float
    max_position: int
    rope: dict[str, dict[str, Any]]  # "main" (sliding-window layers), "compress" (CSA / HCA layers)
    layer_types: tuple[str, ...]
    mlp_layer_types: tuple[str, ...]
    compress_rates: dict[str, int]
    index_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    scoring: str
    routed_scaling_factor: float
    swiglu_limit: float

    @classmethod
    def from_hf(cls, text: Any) -> V4Dims:
        n = text.num_hidden_layers
        layer_types, mlp_types = tuple(text.layer_types or ()), tuple(text.mlp_layer_types or ())
        if len(layer_types) != n or any(t not in (SLIDING, CSA, HCA) for t in layer_types):
            raise UnsupportedConfigError(f"config.json layer_types {list(layer_types)}: one of {SLIDING}, {CSA}, {HCA} "
                                         f"per layer ({n})")
        if len(mlp_types) != n or any(t not in MLP_TYPES for t in mlp_types):
            raise UnsupportedConfigError(f"config.json mlp_layer_types {list(mlp_types)}: one of {MLP_TYPES} per layer")
        rates = dict(text.compress_rates or {})
        for t in set(layer_types) - {SLIDING}:
            if not isinstance(rates.get(t), int) or rates[t] <= 0:
                raise UnsupportedConfigError(f"config.json compress_rates[{t!r}] must be a positive integer, "
                                             f"got {rates.get(t)!r}")
        rope = dict(text.rope_parameters or {})
        if not all(isinstance(rope.get(k), dict) for k in ("main", "compress")):
            raise UnsupportedConfigError("config.json rope_parameters must hold 'main' and 'compress' settings")
        heads, head_dim, groups = text.num_attention_heads, text.head_dim, text.o_groups
        rope_dim = int(head_dim * text.partial_rotary_factor)
        if rope_dim % 2 or not 0 < rope_dim <= min(head_dim, text.index_head_dim):
            raise UnsupportedConfigError(f"config.json partial_rotary_factor gives a rope dim of {rope_dim}: it must be "
                                         f"even and within head_dim {head_dim} and index_head_dim {text.index_head_dim}")
        if (heads * head_dim) % groups:
            raise UnsupportedConfigError(f"config.json o_groups {groups} does not divide {heads} heads of {head_dim}")
        if not text.swiglu_limit > 0:
            raise UnsupportedConfigError(f"config.json swiglu_limit must be positive, got {text.swiglu_limit!r}")
        if text.scoring_func not in SCORES:
            raise UnsupportedConfigError(f"config.json scoring_func {text.scoring_func!r}: one of {', '.join(SCORES)}")
        return cls(text.hidden_size, text.vocab_size, heads, head_dim, rope_dim, text.q_lora_rank, groups,
                   text.o_lora_rank, text.sliding_window, text.rms_norm_eps, text.max_position_embeddings,
                   {k: rope[k] for k in ("main", "compress")}, layer_types, mlp_types, rates, text.index_n_heads,
                   text.index_head_dim, text.index_topk, text.hc_mult, text.hc_sinkhorn_iters, text.hc_eps,
                   text.n_routed_experts, text.num_experts_per_tok, text.moe_intermediate_size, text.scoring_func,
                   text.routed_scaling_factor, text.swiglu_limit)


class TrailingRope(nn.Module):
    """Rotates the last ``dim`` features of each head in adjacent pairs (``x [T, n, D]``, positions ``[T]``)."""

    def __init__(self, dim: int, rope: dict[str, Any], max_position: int, host: Host):
        super().__init__()
        self.dim = dim
        self.rotary = get_rope(dim, dim, max_position, rope, is_neox=False, length=table_length(host, max_position))

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        tokens, heads, width = x.shape
        tail = x[..., width - self.dim:].reshape(tokens, heads * self.dim).contiguous()
        tail, _ = self.rotary(positions, tail, None)
        return torch.cat([x[..., :width - self.dim], tail.view(tokens, heads, self.dim)], dim=-1)

    def inverse(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The rotation back (by ``-position``), fp32 math."""
        width = x.shape[-1]
        cos, sin = self.rotary.cos_sin_cache[positions].chunk(2, dim=-1)
        cos, sin = cos[:, None], sin[:, None]
        tail = x[..., width - self.dim:].float()
        even, odd = tail[..., 0::2], tail[..., 1::2]
        back = torch.stack([even * cos + odd * sin, odd * cos - even * sin], dim=-1).flatten(-2)
        return torch.cat([x[..., :width - self.dim], back.to(x.dtype)], dim=-1)


class Compressor(nn.Module):
    """Projects each token (``project``) and pools a window of them into one entry (``pool``, called by the host,
    see :class:`atom_core.host.CompressedAttentionSpec`).  With ``overlap`` (CSA) each token projects two series:
    the first half of its features joins the next window's entry, the second half its own window's."""

    def __init__(self, hidden_size: int, head_dim: int, rate: int, overlap: bool, eps: float, rope: TrailingRope, *,
                 host: Host, prefix: str):
        super().__init__()
        self.head_dim, self.rate, self.overlap = head_dim, rate, overlap
        self.raw_dim = head_dim * (2 if overlap else 1)
        self.wkv = ReplicatedLinear(hidden_size, self.raw_dim, bias=False, host=host, prefix=f"{prefix}.wkv")
        self.wgate = ReplicatedLinear(hidden_size, self.raw_dim, bias=False, host=host, prefix=f"{prefix}.wgate")
        self.ape = make_param((rate, self.raw_dim), torch.float32)  # a bias per position within the window
        self.norm = RMSNorm(head_dim, eps)
        self.rope = rope

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.wkv(x), self.wgate(x)

    def pool(self, kv: torch.Tensor, gate: torch.Tensor, valid: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """``[N, head_dim]`` entries of the windows whose ``L`` tokens' projections are ``kv``, ``gate``
        ``[N, L, raw_dim]`` (``valid`` ``[N, L]``), rotated at their first positions ``start`` ``[N]``."""
        m, d, width = self.rate, self.head_dim, kv.shape[1]
        gate = gate + self.ape[torch.arange(width, device=gate.device) % m]
        if self.overlap:  # the previous window's first series, then this window's second
            kv = torch.cat([kv[:, :m, :d], kv[:, m:, d:]], dim=1)
            gate = torch.cat([gate[:, :m, :d], gate[:, m:, d:]], dim=1)
        gate = gate.masked_fill(~valid[..., None], float("-inf"))
        pooled = (kv * gate.softmax(dim=1, dtype=torch.float32).to(kv.dtype)).sum(dim=1)
        return self.rope(start.clamp(min=0), self.norm(pooled.contiguous())[:, None])[:, 0]


class Indexer(nn.Module):
    """The CSA layer's lightning indexer: queries from the q LoRA activation, index keys pooled by its own
    compressor, per-head weights."""

    def __init__(self, dims: V4Dims, rope: TrailingRope, *, host: Host, prefix: str):
        super().__init__()
        self.heads, self.head_dim = dims.index_heads, dims.index_head_dim
        self.wq_b = ReplicatedLinear(dims.q_lora_rank, self.heads * self.head_dim, bias=False, host=host,
                                     prefix=f"{prefix}.wq_b")
        self.weights_proj = Fp32Linear(dims.hidden_size, self.heads)
        self.compressor = Compressor(dims.hidden_size, self.head_dim, dims.compress_rates[CSA], True, dims.eps, rope,
                                     host=host, prefix=f"{prefix}.compressor")
        self.rope = rope

    def forward(self, positions: torch.Tensor, x: torch.Tensor, q_resid: torch.Tensor):
        q = self.rope(positions, self.wq_b(q_resid).view(x.shape[0], self.heads, self.head_dim))
        kv, gate = self.compressor.project(x)
        return q, kv, gate, self.weights_proj(x) * self.heads**-0.5


class GroupedLinear(nn.Module):
    """``groups`` independent projections of equal slices: ``x [T, G, I] -> [T, G, O]`` (weight ``[G·O, I]``)."""

    def __init__(self, in_per_group: int, out_per_group: int, groups: int):
        super().__init__()
        self.groups = groups
        self.weight = make_param((groups * out_per_group, in_per_group), torch.get_default_dtype())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("tgi,goi->tgo", x, self.weight.view(self.groups, -1, x.shape[-1]))


class V4Attention(nn.Module):
    def __init__(self, dims: V4Dims, layer_id: int, *, host: Host, prefix: str):
        super().__init__()
        kind = dims.layer_types[layer_id]
        self.heads, self.head_dim, self.groups, self.eps = dims.num_heads, dims.head_dim, dims.o_groups, dims.eps
        self.rope = TrailingRope(dims.rope_dim, dims.rope["main" if kind == SLIDING else "compress"], dims.max_position,
                                 host)
        hidden, width = dims.hidden_size, dims.num_heads * dims.head_dim
        self.wq_a = ReplicatedLinear(hidden, dims.q_lora_rank, bias=False, host=host, prefix=f"{prefix}.wq_a")
        self.q_norm = RMSNorm(dims.q_lora_rank, dims.eps)
        self.wq_b = ReplicatedLinear(dims.q_lora_rank, width, bias=False, host=host, prefix=f"{prefix}.wq_b")
        self.wkv = ReplicatedLinear(hidden, dims.head_dim, bias=False, host=host, prefix=f"{prefix}.wkv")
        self.norm = RMSNorm(dims.head_dim, dims.eps)
        self.wo_a = GroupedLinear(width // dims.o_groups, dims.o_lora_rank, dims.o_groups)
        self.wo_b = ReplicatedLinear(dims.o_groups * dims.o_lora_rank, hidden, bias=False, host=host,
                                     prefix=f"{prefix}.wo_b")
        self.attn_sink = make_param((dims.num_heads,), host.attention_sinks_dtype)
        spec = None
        if kind != SLIDING:
            rate = dims.compress_rates[kind]
            self.compressor = Compressor(hidden, dims.head_dim, rate, kind == CSA, dims.eps, self.rope, host=host,
                                         prefix=f"{prefix}.compressor")
            index_spec = None
            if kind == CSA:
                self.indexer = Indexer(dims, self.rope, host=host, prefix=f"{prefix}.indexer")
                index_spec = CompressedIndexerSpec(dims.index_head_dim, dims.index_topk, dims.index_head_dim**-0.5,
                                                   self.indexer.compressor.raw_dim, self.indexer.compressor)
            spec = CompressedAttentionSpec(rate, kind == CSA, self.compressor.raw_dim, self.compressor, index_spec)
        self.attn = host.attention(f"{prefix}.attn", layer_id, dims.num_heads, 1, dims.head_dim, dims.head_dim**-0.5,
                                   sliding_window=dims.sliding_window, sinks=self.attn_sink, compressed=spec)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        tokens = x.shape[0]
        q_resid = self.q_norm(self.wq_a(x))
        q = unweighted_rms_norm(self.wq_b(q_resid).view(tokens, self.heads, self.head_dim), self.eps)
        q = self.rope(positions, q)
        kv = self.rope(positions, self.norm(self.wkv(x))[:, None])[:, 0]
        if hasattr(self, "compressor"):
            index = self.indexer(positions, x, q_resid) if hasattr(self, "indexer") else None
            o = self.attn(q, kv, self.compressor.project(x), index)
        else:
            o = self.attn(q.reshape(tokens, -1), kv, kv).view(tokens, self.heads, self.head_dim)
        o = self.rope.inverse(positions, o)
        return self.wo_b(self.wo_a(o.reshape(tokens, self.groups, -1)).flatten(1))


def tid2eid_loader(num_experts: int):
    """Loads a hash router's token -> experts table, refusing expert ids outside ``[0, num_experts)``."""

    def load(param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        table = materialize(loaded)
        if table.numel() and (int(table.min()) < 0 or int(table.max()) >= num_experts):
            raise CheckpointError(f"tid2eid holds expert ids outside [0, {num_experts})")
        copy_checked(param.data, table)

    return load


class V4Router(nn.Module):
    """``(weights, ids)`` of each token's experts: ``tid2eid[token]`` (hash) or the top-k of the scores plus the
    correction bias; weights are the chosen scores renormalised, times ``routed_scaling_factor``."""

    def __init__(self, dims: V4Dims, hashed: bool):
        super().__init__()
        self.top_k, self.scale, self.score = dims.top_k, dims.routed_scaling_factor, SCORES[dims.scoring]
        self.weight = make_param((dims.num_experts, dims.hidden_size), torch.get_default_dtype())
        if hashed:
            self.tid2eid = make_param((dims.vocab_size, dims.top_k), torch.int64,
                                      weight_loader=tid2eid_loader(dims.num_experts))
        else:
            self.e_score_correction_bias = make_param((dims.num_experts,), torch.float32)

    def forward(self, x: torch.Tensor, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.score(F.linear(x, self.weight))
        if hasattr(self, "tid2eid"):
            ids = self.tid2eid[input_ids]
        else:
            ids = torch.topk(scores + self.e_score_correction_bias, self.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        return weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * self.scale, ids.to(torch.int32)


class ClampedMLP(nn.Module):
    """The shared expert: ``w2(silu(min(w1 x, limit)) · clamp(w3 x, ±limit))``."""

    def __init__(self, hidden_size: int, intermediate_size: int, limit: float, *, host: Host, prefix: str):
        super().__init__()
        self.limit = limit
        self.w1 = ReplicatedLinear(hidden_size, intermediate_size, bias=False, host=host, prefix=f"{prefix}.w1")
        self.w3 = ReplicatedLinear(hidden_size, intermediate_size, bias=False, host=host, prefix=f"{prefix}.w3")
        self.w2 = ReplicatedLinear(intermediate_size, hidden_size, bias=False, host=host, prefix=f"{prefix}.w2")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x).clamp(max=self.limit)) * self.w3(x).clamp(-self.limit, self.limit))


class V4MoE(nn.Module):
    def __init__(self, dims: V4Dims, layer_id: int, *, host: Host, prefix: str):
        super().__init__()
        self.gate = V4Router(dims, dims.mlp_layer_types[layer_id] == "hash_moe")
        self.experts = FusedMoE(dims.num_experts, dims.hidden_size, dims.moe_intermediate_size, host=host,
                                prefix=f"{prefix}.experts", swiglu_limit=dims.swiglu_limit)
        self.shared_experts = ClampedMLP(dims.hidden_size, dims.moe_intermediate_size, dims.swiglu_limit, host=host,
                                         prefix=f"{prefix}.shared_experts")

    def forward(self, x: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x, input_ids)
        return self.experts(x, weights, ids) + self.shared_experts(x)


class V4DecoderLayer(nn.Module):
    def __init__(self, dims: V4Dims, layer_id: int, *, host: Host, prefix: str):
        super().__init__()
        hc = dict(sinkhorn_iters=dims.hc_sinkhorn_iters, eps=dims.hc_eps, norm_eps=dims.eps)
        self.attn_hc = HyperConnection(dims.hc_mult, dims.hidden_size, **hc)
        self.attn_norm = RMSNorm(dims.hidden_size, dims.eps)
        self.attn = V4Attention(dims, layer_id, host=host, prefix=f"{prefix}.attn")
        self.ffn_hc = HyperConnection(dims.hc_mult, dims.hidden_size, **hc)
        self.ffn_norm = RMSNorm(dims.hidden_size, dims.eps)
        self.ffn = V4MoE(dims, layer_id, host=host, prefix=f"{prefix}.ffn")

    def forward(self, positions: torch.Tensor, h: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        post, comb, x = self.attn_hc(h)
        h = HyperConnection.merge(h, self.attn(positions, self.attn_norm(x)), post, comb)
        post, comb, x = self.ffn_hc(h)
        return HyperConnection.merge(h, self.ffn(self.ffn_norm(x), input_ids), post, comb)


class V4Model(nn.Module):
    def __init__(self, dims: V4Dims, *, host: Host, prefix: str):
        super().__init__()
        self.streams = dims.hc_mult
        self.embed_tokens = VocabParallelEmbedding(dims.vocab_size, dims.hidden_size, host=host)
        self.layers = nn.ModuleList(V4DecoderLayer(dims, i, host=host, prefix=f"{prefix}.layers.{i}")
                                    for i in range(len(dims.layer_types)))
        self.hc_head = HyperHead(dims.hc_mult, dims.hidden_size, eps=dims.hc_eps, norm_eps=dims.eps)
        self.norm = RMSNorm(dims.hidden_size, dims.eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        e = self.embed_tokens(input_ids)
        h = e[:, None].expand(-1, self.streams, -1).contiguous()
        for layer in self.layers:
            h = layer(positions, h, input_ids)
        return self.norm(self.hc_head(h))


class DeepseekV4ForCausalLM(CausalLM):
    weight_mapper = with_experts(WeightMapper(), renames=RENAMES, ignored=MTP_NAMES)

    def __init__(self, hf_config: Any, host: Host, prefix: str = ""):
        super().__init__(hf_config, host)
        if host.tp.world_size > 1:
            raise UnsupportedConfigError("DeepSeek-V4 runs on one rank only (no tensor parallelism yet)")
        self.config = hf_config
        self.dims = V4Dims.from_hf(text_config(hf_config))
        self.model = V4Model(self.dims, host=host, prefix=f"{prefix}.model" if prefix else "model")
        self.lm_head = ParallelLMHead(self.dims.vocab_size, self.dims.hidden_size, host=host)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        if input_ids is None or inputs_embeds is not None:
            raise UnsupportedConfigError("DeepSeek-V4 takes token ids, not embeddings: its hash-routed layers read them")
        return self.model(input_ids, positions)
