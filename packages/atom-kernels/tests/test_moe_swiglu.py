"""Fused MoE with expert biases and gpt-oss' clamped SwiGLU (``activation="swigluoai"``): the reference
against the per-token formula, the Triton kernels (bf16/fp32 and MXFP4 experts) against the reference at odd
sizes, padding slots (experts held elsewhere) and a host-sized token count."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close, randn
from test_moe_quant import GPU_TOL, TOL, quant_to, quantize_experts, to

from atom_kernels import fused_moe


def make_case(gen, tokens, experts, top_k, hidden, inter, dtype, *, global_experts=None):
    """Inputs whose gate/up pre-activations reach past the clamp (|x| > 7) on some elements."""
    total = global_experts or experts
    x = randn(tokens, hidden, gen=gen, dtype=dtype)
    w13 = randn(experts, 2 * inter, hidden, gen=gen, scale=4 * hidden**-0.5)
    w2 = randn(experts, hidden, inter, gen=gen, scale=inter**-0.5)
    b13 = randn(experts, 2 * inter, gen=gen, scale=2.0)
    b2 = randn(experts, hidden, gen=gen)
    weights, ids = torch.topk(torch.randn(tokens, total, generator=gen), top_k)
    return x, w13, w2, b13, b2, weights.softmax(-1), ids.int()


def per_token(x, w13, w2, b13, b2, weights, ids):
    """transformers' GptOssExperts math, one token at a time (w13 rows: gate then up)."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    inter = w2.shape[2]
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate_up = F.linear(x[t].double(), w13[e].double(), b13[e].double())
            gate, up = gate_up[:inter].clamp(max=7.0), gate_up[inter:].clamp(-7.0, 7.0)
            act = (up + 1) * gate * torch.sigmoid(1.702 * gate)
            out[t] += weights[t, j].double() * F.linear(act, w2[e].double(), b2[e].double())
    return out


def test_reference_is_the_gpt_oss_formula(rng):
    x, w13, w2, b13, b2, weights, ids = make_case(rng, 6, 5, 4, 40, 24, torch.float32)
    out = fused_moe.call_backend("reference", x, w13, w2, weights, ids, w13_bias=b13, w2_bias=b2,
                                 activation="swigluoai")
    want = per_token(x, w13, w2, b13, b2, weights, ids)
    assert (F.linear(x, w13.reshape(-1, 40)).abs() > 7).any()  # the clamp is exercised
    assert_close(out.double(), want, tol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens,experts,top_k,hidden,inter,with_map", [
    (1, 4, 4, 72, 40, False), (7, 5, 3, 72, 40, True), (33, 8, 4, 48, 24, False),
])
def test_triton_biases_and_swiglu(device, rng, dtype, tokens, experts, top_k, hidden, inter, with_map):
    x, w13, w2, b13, b2, weights, ids = make_case(rng, tokens, experts, top_k, hidden, inter, dtype,
                                                  global_experts=experts + 2 if with_map else None)
    w13, w2, b13, b2 = (t.to(dtype) for t in (w13, w2, b13, b2))
    emap = None
    if with_map:  # two of the experts are held elsewhere: their pairs contribute nothing
        emap = torch.tensor([0, -1, 1, 2, -1, 3, 4][: experts + 2], dtype=torch.int32)
    kw = dict(w13_bias=b13, w2_bias=b2, activation="swigluoai", expert_map=emap)
    ref = fused_moe.call_backend("reference", x, w13, w2, weights, ids, **kw)
    xd, w13d, w2d, b13d, b2d, wd, idd, md = to(device, x, w13, w2, b13, b2, weights, ids, emap)
    out = fused_moe.call_backend("triton", xd, w13d, w2d, wd, idd, w13_bias=b13d, w2_bias=b2d,
                                 activation="swigluoai", expert_map=md)
    assert_close(out.cpu(), ref, dtype)


@pytest.mark.parametrize("tokens,experts,top_k,hidden,inter", [(1, 4, 4, 96, 64), (9, 6, 3, 160, 96)])
def test_triton_mxfp4_biases_and_swiglu(device, rng, tokens, experts, top_k, hidden, inter):
    """hidden 96 / 160: K not a multiple of the kernel's K step (gpt-oss' 2880 is not a multiple of 128)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    x, w13, w2, b13, b2, weights, ids = make_case(rng, tokens, experts, top_k, hidden, inter, dtype)
    q13, q2, quant = quantize_experts(w13, w2, "mxfp4")
    b13, b2 = b13.to(dtype), b2.to(dtype)
    kw = dict(w13_bias=b13, w2_bias=b2, activation="swigluoai")
    ref = fused_moe.call_backend("reference", x, q13, q2, weights, ids, quant=quant, **kw)
    xd, q13d, q2d, b13d, b2d, wd, idd = to(device, x, q13, q2, b13, b2, weights, ids)
    out = fused_moe.call_backend("triton", xd, q13d, q2d, wd, idd, quant=quant_to(device, quant), w13_bias=b13d,
                                 w2_bias=b2d, activation="swigluoai")
    assert_close(out.cpu(), ref, tol=(TOL if device.type == "cpu" else GPU_TOL)[("mxfp4", dtype)])


def test_host_sized_batch_on_the_dispatch_path(rng):
    """8192 tokens (a host's prefill chunk) through the dispatcher: every token's output is the formula's."""
    x, w13, w2, b13, b2, weights, ids = make_case(rng, 8192, 8, 4, 32, 16, torch.float32)
    out = fused_moe(x, w13, w2, weights, ids, w13_bias=b13, w2_bias=b2, activation="swigluoai")
    rows = torch.randint(0, 8192, (64,), generator=rng)
    want = per_token(x[rows], w13, w2, b13, b2, weights[rows], ids[rows])
    assert_close(out[rows].double(), want, tol=1e-6)


def test_bad_activation_and_bias_shapes_are_named(rng):
    x, w13, w2, b13, b2, weights, ids = make_case(rng, 2, 4, 2, 32, 16, torch.float32)
    with pytest.raises(ValueError, match="activation 'gelu'"):
        fused_moe.call_backend("reference", x, w13, w2, weights, ids, activation="gelu")
    with pytest.raises(ValueError, match="w2_bias"):
        fused_moe.call_backend("reference", x, w13, w2, weights, ids, w2_bias=b2[:, :5])


def per_token_clamped_silu(x, w13, w2, weights, ids, limit):
    """DeepSeek-V4's experts (transformers' DeepseekV4Experts), one token at a time."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    inter = w2.shape[2]
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate_up = F.linear(x[t].double(), w13[e].double())
            gate, up = gate_up[:inter].clamp(max=limit), gate_up[inter:].clamp(-limit, limit)
            out[t] += weights[t, j].double() * F.linear(F.silu(gate) * up, w2[e].double())
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_limit_reference_and_triton(device, rng, dtype):
    """``swiglu_limit`` with silu: the reference is DeepSeek-V4's formula and the Triton kernel equals it."""
    x, w13, w2, _, _, weights, ids = make_case(rng, 7, 5, 3, 72, 40, torch.float32)
    limit = 2.0
    assert (F.linear(x, w13.reshape(-1, 72)).abs() > limit).any()  # the clamp is exercised
    ref32 = fused_moe.call_backend("reference", x, w13, w2, weights, ids, swiglu_limit=limit)
    assert_close(ref32.double(), per_token_clamped_silu(x, w13, w2, weights, ids, limit), tol=1e-6)
    assert (ref32 - fused_moe.call_backend("reference", x, w13, w2, weights, ids)).abs().max() > 1e-2
    x, w13, w2 = (t.to(dtype) for t in (x, w13, w2))
    ref = fused_moe.call_backend("reference", x, w13, w2, weights, ids, swiglu_limit=limit)
    xd, w13d, w2d, wd, idd = to(device, x, w13, w2, weights, ids)
    out = fused_moe.call_backend("triton", xd, w13d, w2d, wd, idd, swiglu_limit=limit)
    assert_close(out.cpu(), ref, dtype)


def test_swiglu_limit_goes_with_silu_only(rng):
    x, w13, w2, b13, b2, weights, ids = make_case(rng, 2, 4, 2, 32, 16, torch.float32)
    with pytest.raises(ValueError, match="swiglu_limit"):
        fused_moe.call_backend("reference", x, w13, w2, weights, ids, activation="swigluoai", swiglu_limit=3.0)
