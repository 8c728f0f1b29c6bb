"""The ops as ``torch.ops.atom`` custom ops: torch.compile traces a forward through them in one graph, each op
is one opaque node, the fake implementations agree with the real ones (torch.library.opcheck), and a compiled
call returns what the eager call returns (the rotary embeddings, traced as out-of-place torch math, included)."""

import inspect

import pytest
import torch
from torch._functorch.aot_autograd import aot_module_simplified

from atom_kernels import (
    OPS,
    ExpertQuant,
    fp8_block_mm,
    fp8_scaled_mm,
    fused_moe,
    indexer_scores,
    mla_decode,
    mrope,
    mxfp4_mm,
    paged_attention,
    quant_fp8,
    rms_norm,
    rotary_embedding,
    silu_and_mul,
    sparse_mla,
    topk_indices,
    topk_routing,
)
from atom_kernels.formats import quantize_fp8_blocks, quantize_mxfp4
from atom_kernels.library import TRACED

T, H, HEADS, KV_HEADS, HEAD = 7, 64, 4, 2, 16


def _cache(rotary_dim: int, positions: int = 64) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    freqs = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).contiguous()


def _moe_inputs(device, gen, experts=8, inter=32, top_k=2, hidden=H):
    x = torch.randn(T, hidden, generator=gen).to(device)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.1).to(device)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) * 0.1).to(device)
    logits = torch.randn(T, experts, generator=gen).to(device)
    return x, w13, w2, logits, top_k



def test_every_op_with_a_traced_form_is_registered():
    assert set(TRACED) <= set(OPS)
    for name, traced in TRACED.items():
        assert OPS[name].traced is traced


@pytest.mark.parametrize("name", sorted(TRACED))
def test_traced_form_takes_every_argument_of_the_op(name):
    """A model calls an op the same way eager and compiled: the traced form accepts every parameter of the op's
    reference implementation (its public signature), with the same defaults; an argument the traced form lacks
    would fail only inside a host's compile."""
    traced = inspect.signature(TRACED[name]).parameters
    reference, _ = OPS[name].implementation("reference")
    for param in inspect.signature(reference).parameters.values():
        assert param.name in traced, f"{name}: the traced form lacks the argument {param.name!r}"
        assert traced[param.name].default == param.default, f"{name}: {param.name!r} defaults differ"


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_decoder_block_compiles_into_one_graph_of_atom_ops(backend, rng):
    torch.manual_seed(0)
    x, w13, w2, logits_w, top_k = _moe_inputs("cpu", rng)
    norm_w = torch.rand(H, generator=rng) + 0.5
    qk_w = torch.randn(H, (HEADS + 2 * KV_HEADS) * HEAD, generator=rng) * 0.1
    router = torch.randn(H, w13.shape[0], generator=rng) * 0.1
    cache = _cache(HEAD)
    positions = torch.arange(T) + 3

    def block(h, residual):
        x, residual = rms_norm(h, norm_w, 1e-6, residual)
        qkv = x @ qk_w
        q, k, v = qkv.split([HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=-1)
        q = rms_norm(q.reshape(-1, HEAD), norm_w[:HEAD], 1e-6).view(T, -1)
        k = rms_norm(k.reshape(-1, HEAD), norm_w[:HEAD], 1e-6).view(T, -1)
        q, k = rotary_embedding(positions, q, k, cache, HEAD, True)
        attn = (q[:, : KV_HEADS * HEAD] + k + v) @ qk_w[:, : KV_HEADS * HEAD].T[:, :H]
        weights, ids = topk_routing(attn @ router, top_k)
        moe = fused_moe(attn, w13, w2, weights, ids)
        dense = silu_and_mul(torch.cat((attn, moe), dim=-1))
        return dense + moe, residual

    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward if backend == "eager" else torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    h, residual = x.clone(), torch.randn(T, H, generator=rng)
    want = block(h.clone(), residual.clone())
    got = torch.compile(block, backend=record, fullgraph=True, dynamic=True)(h.clone(), residual.clone())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    # fullgraph: no graph break; Dynamo may restart its analysis once (a float argument specialised), so the
    # graph compiled last is the one that runs
    targets = [str(node.target) for node in graphs[-1].graph.nodes if node.op == "call_function"]
    for op in ("topk_routing", "fused_moe", "silu_and_mul"):
        assert {f"atom.{op}", f"atom.{op}.default"} & set(targets), f"atom::{op} is not a node of the traced graph: {targets}"
    # RMSNorm and the rotary embedding are traced as torch math, which the compiler fuses with its neighbours
    assert not [t for t in targets if "rms_norm" in t or "rotary" in t], targets
    assert any("rsqrt" in t for t in targets), targets


def _opcheck_cases(gen):
    x = torch.randn(T, H, generator=gen)
    x_moe, w13, w2, logits, top_k = _moe_inputs("cpu", gen)
    weights, ids = topk_routing(logits, top_k)
    x_fp8moe, w13_hi, w2_hi, _, _ = _moe_inputs("cpu", gen, experts=4, inter=128, hidden=128)
    w13_fp8, w13_s = (torch.stack(t) for t in zip(*(quantize_fp8_blocks(w) for w in w13_hi)))
    w2_fp8, w2_s = (torch.stack(t) for t in zip(*(quantize_fp8_blocks(w) for w in w2_hi)))
    weights4, ids4 = topk_routing(torch.randn(T, 4, generator=gen), top_k)
    a = torch.randn(T, 256, generator=gen)
    b = torch.randn(96, 256, generator=gen) * 0.1
    b_fp8, b_block_scale = quantize_fp8_blocks(b)
    b_codes, b_mx_scale = quantize_mxfp4(b)
    qa, sa = quant_fp8(a)
    qg, sg = quant_fp8(a, 128)
    b_row = torch.rand(96, 1, generator=gen) + 0.01
    ops = torch.ops.atom
    latent_cache = torch.randn(6, 4, 40, generator=gen)  # 6 blocks of 4 tokens, kv_lora_rank 32 + rope 8
    block_table = torch.tensor([[3, 0, 5, -1], [1, -1, -1, -1], [-1, -1, -1, -1]], dtype=torch.int32)
    mla_args = (torch.randn(3, HEADS, 40, generator=gen), latent_cache, block_table,
                torch.tensor([11, 2, 0], dtype=torch.int32), 40**-0.5, 32)
    # paged K/V: 6 blocks of 4 tokens, 2 kv heads of 16; 3 queries ending a context of 11, 2 of 2, none of 0
    kv_caches = [torch.randn(6, 4, KV_HEADS, HEAD, generator=gen) for _ in range(2)]
    paged_args = (torch.randn(5, HEADS, HEAD, generator=gen), *kv_caches, block_table[:, :3].contiguous(),
                  torch.tensor([11, 2, 0], dtype=torch.int32), torch.tensor([0, 3, 5, 5], dtype=torch.int32),
                  HEAD**-0.5)
    new_kv = [torch.randn(5, KV_HEADS, HEAD, generator=gen) for _ in range(2)]
    return {
        "silu_and_mul": (ops.silu_and_mul, (x,)),
        "topk_routing": (ops.topk_routing, (logits, top_k, "softmax", True, None, 1, 1, 1.0)),
        "fused_moe": (ops.fused_moe, (x_moe, w13, w2, weights, ids, None, None, None, None, None, None, None, None,
                                      "silu")),
        "fused_moe_biased": (ops.fused_moe, (x_moe, w13, w2, weights, ids, None, None, None, None, None, None,
                                             torch.randn(w13.shape[:2], generator=gen) * 0.1,
                                             torch.randn(w2.shape[:2], generator=gen) * 0.1, "swigluoai")),
        "fused_moe_clamped": (ops.fused_moe, (x_moe, w13, w2, weights, ids, None, None, None, None, None, None, None,
                                              None, "silu", 0.05)),
        "fused_moe_fp8": (ops.fused_moe, (x_fp8moe, w13_fp8, w2_fp8, weights4, ids4, None, "fp8-block", w13_s, w2_s,
                                          [128, 128], torch.float8_e4m3fn, None, None, "silu")),
        "quant_fp8": (ops.quant_fp8, (a, None, None)),
        "quant_fp8_groups": (ops.quant_fp8, (a, 128, None)),
        "fp8_scaled_mm": (ops.fp8_scaled_mm, (qa, sa, b_fp8, b_row, None, torch.float32)),
        "fp8_block_mm": (ops.fp8_block_mm, (qg, sg, b_fp8, b_block_scale, [128, 128], None, torch.float32)),
        "mxfp4_mm": (ops.mxfp4_mm, (a, b_codes, b_mx_scale, None, "rows", False)),
        "mla_decode": (ops.mla_decode, mla_args),
        "indexer_scores": (ops.indexer_scores, (torch.randn(3, HEADS, 16, generator=gen), torch.randn(3, HEADS, generator=gen),
                                                torch.randn(6, 4, 16, generator=gen), block_table,
                                                torch.tensor([0, 0, -1], dtype=torch.int32),
                                                torch.tensor([9, 10, -1], dtype=torch.int32), 0.25)),
        "topk_indices": (ops.topk_indices, (torch.randn(3, 20, generator=gen), 6)),
        "sparse_mla": (ops.sparse_mla, (mla_args[0], latent_cache, torch.tensor([[3, 7, -1], [0, -1, -1], [-1, -1, -1]],
                                                                               dtype=torch.int32), 40**-0.5, 32)),
        "paged_attention": (ops.paged_attention, (*paged_args, None, torch.randn(HEADS, generator=gen), None, None,
                                                  None)),
        "paged_attention_window_cap": (ops.paged_attention, (*paged_args, 4, None, 10.0, None, None)),
        "reshape_and_cache": (ops.reshape_and_cache, (*new_kv, *(c.clone() for c in kv_caches),
                                                      torch.tensor([3, -1, 9, 0, 22]), None, None)),
    }


@pytest.mark.parametrize("case", list(_opcheck_cases(torch.Generator().manual_seed(0))))
def test_opcheck(case, rng):
    op, args = _opcheck_cases(rng)[case]
    checks = ("test_faketensor", "test_aot_dispatch_dynamic")
    # the schema check compares arguments before and after with arithmetic CPU fp8 tensors do not have; the
    # fp8 ops mutate nothing (the in-place ops' mutations are checked on float inputs)
    fp8 = any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args)
    torch.library.opcheck(op, args, test_utils=checks if fp8 else ("test_schema", *checks))


def test_traced_forms_equal_eager_calls(rng):
    """Each public op, compiled alone, returns what it returns eagerly (quantized ones included)."""
    cases = _opcheck_cases(rng)
    x_moe, w13, w2, weights, ids = cases["fused_moe_fp8"][1][:5]
    quant = ExpertQuant("fp8-block", cases["fused_moe_fp8"][1][7], cases["fused_moe_fp8"][1][8], (128, 128),
                        torch.float8_e4m3fn)
    qg, sg, b_fp8, b_block_scale = cases["fp8_block_mm"][1][:4]
    qa, sa, _, b_row = cases["fp8_scaled_mm"][1][:4]
    a, b_codes, b_mx_scale = cases["mxfp4_mm"][1][:3]
    norm_x, norm_w = cases["silu_and_mul"][1][0], torch.rand(H, generator=rng) + 0.5
    calls = [
        lambda: rms_norm(norm_x, norm_w, 1e-6),
        lambda: rms_norm(norm_x, norm_w, 1e-6, norm_x * 0.5, 1.0)[0],
        lambda: fused_moe(x_moe, w13, w2, weights, ids, quant=quant),
        lambda: fused_moe(*cases["fused_moe_biased"][1][:5], w13_bias=cases["fused_moe_biased"][1][11],
                          w2_bias=cases["fused_moe_biased"][1][12], activation="swigluoai"),
        lambda: fused_moe(*cases["fused_moe_clamped"][1][:5], swiglu_limit=0.05),
        lambda: fp8_block_mm(qg, sg, b_fp8, b_block_scale, (128, 128), None, torch.float32),
        lambda: fp8_scaled_mm(qa, sa, b_fp8, b_row, None, torch.float32),
        lambda: mxfp4_mm(a, b_codes, b_mx_scale, None, layout="rows"),
        lambda: quant_fp8(a, 128)[1],
        lambda: mla_decode(*cases["mla_decode"][1]),
        lambda: indexer_scores(*cases["indexer_scores"][1]),
        lambda: topk_indices(*cases["topk_indices"][1]),
        lambda: sparse_mla(*cases["sparse_mla"][1]),
        lambda: paged_attention(*cases["paged_attention"][1][:7], sinks=cases["paged_attention"][1][8]),
        lambda: paged_attention(*cases["paged_attention"][1][:7], sliding_window=4, soft_cap=10.0),
    ]
    for call in calls:
        torch.testing.assert_close(torch.compile(call, backend="aot_eager", fullgraph=True)(), call())


def _qkv_rope_graph(rope, qkv: torch.Tensor, positions: torch.Tensor):
    """(compiled result, eager result, the call targets of the graph AOT autograd hands the compiler) of ``rope``
    applied to q and k split off ``qkv`` (views, as a model's QKV projection gives them)."""
    graphs = []

    def backend(gm, example_inputs):
        def keep(graph, inputs):
            graphs.append(graph)
            return graph.forward

        return aot_module_simplified(gm, example_inputs, fw_compiler=keep)

    def block(qkv, positions):
        q, k, v = qkv.split([HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=-1)
        q, k = rope(positions, q, k)
        return q * 1.0, k * 1.0, v * 1.0

    got = torch.compile(block, backend=backend, fullgraph=True, dynamic=True)(qkv.clone(), positions)
    want = block(qkv.clone(), positions)
    return got, want, [str(node.target) for node in graphs[-1].graph.nodes if node.op == "call_function"]


ROPES = {
    "rotary": lambda positions, q, k: rotary_embedding(positions, q, k, _cache(HEAD), HEAD, True),
    "rotary_partial_gptj": lambda positions, q, k: rotary_embedding(positions, q, k, _cache(HEAD // 2), HEAD, False),
    "mrope_normed": lambda positions, q, k: mrope(positions, q, k, _cache(HEAD), HEAD, (HEAD // 2, 0, 0), False,
                                                  q_weight=torch.linspace(0.5, 1.5, HEAD),
                                                  k_weight=torch.linspace(1.5, 0.5, HEAD), eps=1e-6),
    "mrope_3d": lambda positions, q, k: mrope(torch.stack([positions, positions + 1, positions + 2]), q, k,
                                              _cache(HEAD), HEAD, (4, 2, 2), True),
}


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_rope_of_qkv_views_is_traced_without_copies(rope, rng):
    """q and k are views of the QKV projection's output.  An opaque op rotating them in place makes the compiler
    clone them and scatter the results back (vLLM compiles with auto_functionalized v1: whole extra passes on the
    GPU); the traced rope is out-of-place torch math: no clone, copy or scatter in the graph, eager's values."""
    qkv = torch.randn(T, (HEADS + 2 * KV_HEADS) * HEAD, generator=rng)
    got, want, targets = _qkv_rope_graph(ROPES[rope], qkv, torch.arange(T) + 5)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    copies = [t for t in targets if any(word in t for word in ("clone", "copy", "scatter", "functionalized"))
              and "lift_fresh" not in t]  # (lift_fresh_copy: a constant the MRoPE section table makes)
    assert not copies, targets


def test_rope_of_heads_interleaved_with_a_gate_compiles(rng):
    """Qwen3-Next's q is a view whose heads alternate with their output gates (``[T, heads, 2, D][:, :, 0]``),
    which the traced form rotates as a contiguous copy (in-place on the view, Inductor failed inside vLLM's compile:
    atom-vllm's test_compiled_forward_matches_eager): compiled by Inductor with a symbolic token count, the returned
    q and k are the eager values."""
    weights = [torch.randn(HEAD, generator=rng) for _ in range(2)]

    def attention_inputs(x, positions):
        q_gate, k = x.split([HEADS * 2 * HEAD, KV_HEADS * HEAD], dim=-1)
        q_gate = q_gate.view(x.shape[0], HEADS, 2, HEAD)
        q, gate = q_gate[:, :, 0], q_gate[:, :, 1]
        q, k = mrope(positions, q, k, _cache(HEAD // 2), HEAD, (HEAD // 4, 0, 0), False, q_weight=weights[0],
                     k_weight=weights[1], eps=1e-6, weight_offset=1.0)
        return q.reshape(x.shape[0], -1) * torch.sigmoid(gate.reshape(x.shape[0], -1)), k

    compiled = torch.compile(attention_inputs, fullgraph=True, dynamic=True)
    for tokens in (T, T + 4):
        x = torch.randn(tokens, (2 * HEADS + KV_HEADS) * HEAD, generator=rng)
        positions = torch.arange(tokens) + 2
        for got, want in zip(compiled(x.clone(), positions), attention_inputs(x.clone(), positions)):
            torch.testing.assert_close(got, want)


def test_a_kernel_config_cannot_be_traced(rng):
    from atom_kernels import MoeKernelConfig
    from atom_kernels.ops.fused_moe.configs import CONFIGS

    x, w13, w2, logits, top_k = _moe_inputs("cpu", rng)
    weights, ids = topk_routing(logits, top_k)
    config: MoeKernelConfig = CONFIGS["decode"]
    with pytest.raises(Exception, match="kernel config is for benchmarks"):
        torch.compile(lambda: fused_moe(x, w13, w2, weights, ids, config=config), backend="eager", fullgraph=True)()
