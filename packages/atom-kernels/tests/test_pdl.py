"""Programmatic dependent launch (``ops/_pdl.py``): where it is used, and that chains of ATOM kernels that use it
(RMSNorm -> MXFP4 GEMM -> SiLU-and-mul -> MXFP4 GEMM; routing -> MoE align -> expert GEMMs -> sum; torch ops between)
compute in a CUDA graph exactly what the same ops compute one at a time with the host waiting after each (no kernel
reads its input before the previous kernel has finished writing it)."""

import pytest
import torch
from helpers import randn

from atom_kernels import ExpertQuant, formats, fused_moe, mxfp4_mm, rms_norm, silu_and_mul, topk_routing
from atom_kernels.ops._pdl import pdl_keywords, pdl_supported, use_pdl
from atom_kernels.ops.mxfp4_mm import preferred_layout

CUDA = torch.cuda.is_available()


def test_pdl_supported_only_on_nvidia_sm90_and_up():
    assert pdl_supported((9, 0), hip=False, interpreting=False)
    assert pdl_supported((10, 0), hip=False, interpreting=False)
    assert not pdl_supported((8, 0), hip=False, interpreting=False)  # A100: no griddepcontrol
    assert not pdl_supported((9, 4), hip=True, interpreting=False)  # ROCm reports its own "capability"
    assert not pdl_supported((9, 0), hip=False, interpreting=True)
    assert not pdl_supported(None, hip=False, interpreting=False)
    assert not use_pdl(torch.device("cpu"))
    assert pdl_keywords(torch.device("cpu")) == {"PDL": False}  # no launch_pdl keyword when off


def _graph_equals_one_op_at_a_time(chain, x, gen):
    """``chain(sync)`` captured in a CUDA graph gives, replay after replay and after ``x`` changes, what it gives
    with the host synchronizing after every op."""
    expected = chain(sync=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chain(sync=False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain(sync=False)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, expected)
    x.copy_(randn(*x.shape, gen=gen, dtype=x.dtype))  # new input: the first kernel must read it
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, chain(sync=True))
    assert expected.isfinite().all() and not torch.equal(captured, expected)


def _step(t, sync: bool):
    if sync:
        torch.cuda.synchronize()
    return t


def _layer_weights(n, k, gen, layout):
    w, s = formats.quantize_mxfp4(randn(n, k, gen=gen, scale=k**-0.5))
    return (formats.mxfp4_rows_to_lanes(w) if layout == "lanes" else w).cuda(), s.cuda()


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("m", [1, 5, 16])
def test_decode_chain_in_a_cuda_graph_matches_one_op_at_a_time(rng, m):
    hidden, inter, layers = 1024, 1024, 3
    layout = preferred_layout(2 * inter, hidden, torch.device("cuda"))
    weights = [(_layer_weights(2 * inter, hidden, rng, layout), _layer_weights(hidden, inter, rng, layout),
                randn(hidden, gen=rng, dtype=torch.bfloat16, device="cuda")) for _ in range(layers)]
    x = randn(m, hidden, gen=rng, dtype=torch.bfloat16, device="cuda")

    def chain(sync: bool):
        h = x
        for (w13, s13), (w2, s2), gamma in weights:
            normed = _step(rms_norm(h, gamma, 1e-6), sync)
            gate_up = _step(mxfp4_mm(normed, w13, s13, layout=layout, static_weights=True), sync)
            act = _step(silu_and_mul(gate_up), sync)
            h = _step(h + mxfp4_mm(act, w2, s2, layout=layout, static_weights=True), sync)
        return h

    _graph_equals_one_op_at_a_time(chain, x, rng)


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("quant", [None, "mxfp4"])
@pytest.mark.parametrize("tokens", [1, 100])  # 100 tokens x top-4: the multi-kernel MoE align path
def test_moe_chain_in_a_cuda_graph_matches_one_op_at_a_time(rng, tokens, quant):
    experts, top_k, hidden, inter, layers = 16, 4, 256, 128, 2
    params = []
    for _ in range(layers):
        w13 = randn(experts, 2 * inter, hidden, gen=rng, scale=hidden**-0.5)
        w2 = randn(experts, hidden, inter, gen=rng, scale=inter**-0.5)
        if quant == "mxfp4":
            (w13, e13), (w2, e2) = formats.quantize_mxfp4(w13), formats.quantize_mxfp4(w2)
            expert_quant = ExpertQuant("mxfp4", e13.cuda(), e2.cuda())
        else:
            w13, w2, expert_quant = w13.to(torch.bfloat16), w2.to(torch.bfloat16), None
        router = randn(hidden, experts, gen=rng, dtype=torch.bfloat16, device="cuda")
        params.append((router, w13.cuda(), w2.cuda(), expert_quant,
                       randn(hidden, gen=rng, dtype=torch.bfloat16, device="cuda")))
    x = randn(tokens, hidden, gen=rng, dtype=torch.bfloat16, device="cuda")

    def chain(sync: bool):
        h = x
        for router, w13, w2, expert_quant, gamma in params:
            normed = _step(rms_norm(h, gamma, 1e-6), sync)
            weights, ids = _step(topk_routing((normed @ router).float(), top_k), sync)
            h = _step(h + fused_moe(normed, w13, w2, weights, ids, quant=expert_quant), sync)
        return h

    _graph_equals_one_op_at_a_time(chain, x, rng)


@pytest.mark.parametrize("backend", ["aiter", "triton", "reference"])
def test_every_mxfp4_backend_takes_static_weights(backend):
    """The dispatcher passes a call's keywords to the backend's precondition and function: each accepts
    ``static_weights`` (what MXFP4 layers pass), checked on signatures so that it holds off the GPU too."""
    import importlib
    import inspect

    module = importlib.import_module(f"atom_kernels.ops.mxfp4_mm.{backend}")
    for fn in (module.mxfp4_mm, getattr(module, "unsupported", None)):
        if fn is not None:
            inspect.signature(fn).bind("x", "w", "w_scale", None, layout="lanes", static_weights=True)


def test_launch_pdl_is_only_passed_when_on():
    """Triton's ROCm backend has no ``launch_pdl`` option and rejects the keyword even when false, so every launch
    passes it through ``launch_options``, which leaves it out when PDL is off."""
    from pathlib import Path

    import atom_kernels
    from atom_kernels.ops._pdl import launch_options

    assert launch_options(False) == {} and launch_options(True) == {"launch_pdl": True}
    src = Path(atom_kernels.__file__).parent
    direct = [str(p.relative_to(src)) for p in src.rglob("*.py") if p.name != "_pdl.py" and "launch_pdl" in p.read_text()]
    assert not direct, direct
