"""Gated DeltaNet kernels (chunked prefill, fused decode) against the token-by-token recurrence.

Inputs are fresh random draws of packed sequences of odd lengths (one empty, one of a single token,
some longer than a 64-token chunk), q/k/v as strided views into one packed projection (as the layer
passes them), padding slots, both state layouts and HV/H = 1 and 2.  In the interpreter sizes are small;
the GPU-only test at the end uses the real head dims.
"""


import pytest
import torch
from helpers import assert_close, randn

from atom_kernels import OPS, chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from atom_kernels.gdn import K_MAJOR, STATE_LAYOUTS, V_MAJOR, gating, ssm_state_shape
from atom_kernels.ops.chunk_gated_delta_rule import triton as chunk_triton

GROUPINGS = [(2, 2), (1, 2)]  # (H, HV): HV/H = 1 and 2
# fp32: the chunked WY form and the recurrence differ only in rounding (measured ~1e-6 relative)
FP32_TOL = 2e-5


def draw(rng, device, num_tokens, H, HV, K, V, dtype=torch.float32):
    """q, k, v as views into one packed [T, 2HK + HV V] projection; a, b, A_log, dt_bias."""
    packed = randn(num_tokens, 2 * H * K + HV * V + 3, dtype=dtype, device=device, gen=rng)
    q = packed[:, : H * K].view(num_tokens, H, K)
    k = packed[:, H * K : 2 * H * K].view(num_tokens, H, K)
    v = packed[:, 2 * H * K : 2 * H * K + HV * V].view(num_tokens, HV, V)
    ab = randn(num_tokens, 2 * HV, dtype=dtype, device=device, gen=rng)
    b, a = ab[:, :HV], ab[:, HV:] - 1.0  # strided views too
    A_log = torch.empty(HV).uniform_(0.05, 0.6, generator=rng).log().to(device)
    dt_bias = randn(HV, device=device, gen=rng, scale=0.5)
    return dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias)


def state_pool(rng, device, num_slots, layout, HV, K, V, dtype=torch.float32):
    return randn(num_slots, *ssm_state_shape(layout, HV, K, V), dtype=dtype, device=device, gen=rng, scale=0.3)


def packed(lens, device, extra=0):
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return cu, int(cu[-1]) + extra


def run_both(op, *args, **kwargs):
    """(reference, triton) results of ``op`` on identical copies of the state pool (argument 7)."""
    results = []
    for backend in ("reference", "triton"):
        call = list(args)
        call[7] = args[7].clone()
        out = op.call_backend(backend, *call, **kwargs)
        results.append((out, call[7]))
    return results


# --------------------------------------------------------------------------------------------- decode
@pytest.mark.parametrize("layout", STATE_LAYOUTS)
@pytest.mark.parametrize("H,HV", GROUPINGS)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_decode_matches_reference(device, rng, layout, H, HV, state_dtype):
    K, V, N = 32, 16, 5
    x = draw(rng, device, N, H, HV, K, V)
    pool = state_pool(rng, device, 9, layout, HV, K, V, state_dtype)
    slots = torch.tensor([6, -1, 0, 8, 3], device=device)
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], pool, slots)
    (o_ref, s_ref), (o, s) = run_both(fused_recurrent_gated_delta_rule, *args, state_layout=layout)
    assert_close(o, o_ref, tol=FP32_TOL)
    assert_close(s, s_ref, state_dtype, tol=FP32_TOL if state_dtype == torch.float32 else None)
    assert torch.equal(o[1], torch.zeros_like(o[1])), "padding sequence must output zeros"
    untouched = [i for i in range(9) if i not in (6, 0, 8, 3)]
    assert torch.equal(s[untouched], pool[untouched]), "slots not in the batch must be untouched"


@pytest.mark.parametrize("layout", STATE_LAYOUTS)
def test_speculative_decode_per_token_slots(device, rng, layout):
    """Tq=3 tokens per sequence; the state after token t goes to slots[n, t], the initial state comes from
    slots[n, num_accepted - 1]; a negative write slot is skipped, a negative read slot is padding."""
    H, HV, K, V, N, Tq = 1, 2, 32, 16, 4, 3
    x = draw(rng, device, N * Tq, H, HV, K, V)
    pool = state_pool(rng, device, 16, layout, HV, K, V)
    slots = torch.tensor([[0, 1, 2], [3, 4, -1], [-1, 6, 7], [9, 10, 11]], device=device)
    accepted = torch.tensor([1, 2, 1, 3], device=device)  # reads slots 0, 4, -1 (padding), 11
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], pool, slots)
    (o_ref, s_ref), (o, s) = run_both(fused_recurrent_gated_delta_rule, *args, state_layout=layout,
                                      num_accepted_tokens=accepted)
    assert_close(o, o_ref, tol=FP32_TOL)
    assert_close(s, s_ref, tol=FP32_TOL)
    assert torch.equal(o[6:9], torch.zeros_like(o[6:9])), "padding sequence must output zeros"
    untouched = [5, 6, 7, 8, 12, 13, 14, 15]
    assert torch.equal(s[untouched], pool[untouched])


@pytest.mark.parametrize("layout", STATE_LAYOUTS)
def test_ragged_speculative_decode(device, rng, layout):
    """cu_seqlens: sequences of 3, 1, 0 and 2 tokens over [N, 3] slots; each sequence equals its own uniform
    sequence alone, the one without tokens leaves its slots alone, and rows past the last sequence are zero."""
    H, HV, K, V = 1, 2, 32, 16
    lens = [3, 1, 0, 2]
    cu, T = packed(lens, device, extra=1)
    x = draw(rng, device, T, H, HV, K, V)
    pool = state_pool(rng, device, 12, layout, HV, K, V)
    slots = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]], device=device)
    accepted = torch.tensor([2, 1, 3, 3], dtype=torch.int32, device=device)
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], pool, slots)
    (o_ref, s_ref), (o, s) = run_both(fused_recurrent_gated_delta_rule, *args, state_layout=layout,
                                      num_accepted_tokens=accepted, cu_seqlens=cu)
    assert_close(o, o_ref, tol=FP32_TOL)
    assert_close(s, s_ref, tol=FP32_TOL)
    assert torch.equal(o[-1], torch.zeros_like(o[-1]))
    assert torch.equal(s[[5, 6, 7, 8, 11]], pool[[5, 6, 7, 8, 11]])  # unwritten: past a length, or no tokens
    for n, length in enumerate(lens):
        if not length:
            continue
        rows = slice(int(cu[n]), int(cu[n + 1]))
        one = pool.clone()
        alone = fused_recurrent_gated_delta_rule.call_backend(
            "reference", *(x[name][rows] for name in ("q", "k", "v", "a", "b")), x["A_log"], x["dt_bias"], one,
            slots[n : n + 1], state_layout=layout, num_accepted_tokens=accepted[n : n + 1],
            cu_seqlens=torch.tensor([0, length], dtype=torch.int32, device=device))
        assert_close(o[rows], alone, tol=FP32_TOL)


def test_multi_token_decode_in_place(device, rng):
    """Tq=3 tokens per sequence with one slot each: the state after the last token is written back."""
    H, HV, K, V, N, Tq = 2, 4, 32, 16, 3, 3
    x = draw(rng, device, N * Tq, H, HV, K, V)
    pool = state_pool(rng, device, 4, V_MAJOR, HV, K, V)
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], pool, torch.tensor([3, -1, 0], device=device))
    (o_ref, s_ref), (o, s) = run_both(fused_recurrent_gated_delta_rule, *args, state_layout=V_MAJOR)
    assert_close(o, o_ref, tol=FP32_TOL)
    assert_close(s, s_ref, tol=FP32_TOL)
    assert torch.equal(o[3:6], torch.zeros_like(o[3:6]))


def test_decode_bf16_inputs(device, rng):
    H, HV, K, V, N = 2, 4, 64, 32, 3
    x = draw(rng, device, N, H, HV, K, V, dtype=torch.bfloat16)
    pool = state_pool(rng, device, 4, K_MAJOR, HV, K, V)
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], pool, torch.tensor([2, 0, 3], device=device))
    (o_ref, s_ref), (o, s) = run_both(fused_recurrent_gated_delta_rule, *args)
    assert o.dtype == torch.bfloat16
    assert_close(o, o_ref, torch.bfloat16)
    assert_close(s, s_ref, tol=1e-5)


# --------------------------------------------------------------------------------------------- prefill
PREFILL_LENS = [37, 1, 0, 70, 5]  # one empty sequence, one single token, one across a chunk boundary


@pytest.mark.parametrize("layout", STATE_LAYOUTS)
@pytest.mark.parametrize("H,HV", GROUPINGS)
def test_prefill_matches_reference(device, rng, layout, H, HV):
    K, V = 32, 16
    cu, T = packed(PREFILL_LENS, device, extra=3)  # 3 trailing tokens outside every sequence
    x = draw(rng, device, T, H, HV, K, V)
    pool = state_pool(rng, device, 8, layout, HV, K, V)
    slots = torch.tensor([5, 0, 2, 7, -1], device=device)
    init = torch.tensor([True, False, True, True, True], device=device)  # with and without initial state
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], pool, cu, slots, init)
    (o_ref, s_ref), (o, s) = run_both(chunk_gated_delta_rule, *args, state_layout=layout)
    assert_close(o, o_ref, tol=FP32_TOL)
    assert_close(s, s_ref, tol=FP32_TOL)
    assert torch.equal(o[-3:], torch.zeros_like(o[-3:])), "tokens past cu_seqlens[-1] must be zero"
    assert torch.equal(s[[1, 3, 4, 6]], pool[[1, 3, 4, 6]]), "slots outside the batch must be untouched"


def test_prefill_without_initial_state_ignores_pool(device, rng):
    H, HV, K, V = 1, 2, 32, 16
    cu, T = packed([66, 3], device)
    x = draw(rng, device, T, H, HV, K, V)
    pool = state_pool(rng, device, 3, K_MAJOR, HV, K, V)
    slots = torch.tensor([2, 0], device=device)
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], pool, cu, slots, None)
    (o_ref, s_ref), (o, s) = run_both(chunk_gated_delta_rule, *args)
    assert_close(o, o_ref, tol=FP32_TOL)
    assert_close(s, s_ref, tol=FP32_TOL)
    garbage = pool.clone()
    garbage[[0, 2]] = 1e3  # must not be read
    o2 = chunk_gated_delta_rule.call_backend("triton", *args[:7], garbage, cu, slots, None)
    assert_close(o2, o_ref, tol=FP32_TOL)


def test_prefill_bf16_inputs(device, rng):
    H, HV, K, V = 2, 4, 32, 32
    cu, T = packed([29, 64, 2], device)
    x = draw(rng, device, T, H, HV, K, V, dtype=torch.bfloat16)
    pool = state_pool(rng, device, 3, V_MAJOR, HV, K, V)
    init = torch.tensor([True, False, True], device=device)
    slots = torch.tensor([1, 2, 0], device=device)
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], pool, cu, slots, init)
    (o_ref, s_ref), (o, s) = run_both(chunk_gated_delta_rule, *args, state_layout=V_MAJOR)
    assert o.dtype == torch.bfloat16
    assert_close(o, o_ref, torch.bfloat16)
    assert_close(s, s_ref, torch.bfloat16)


@pytest.mark.parametrize("layout", STATE_LAYOUTS)
def test_prefill_then_decode_equals_recurrence(device, rng, layout):
    """Chunked prefill of each prompt, then two decode steps with the fused kernel: every output equals
    the recurrence over the whole sequence from the same initial state."""
    H, HV, K, V = 1, 2, 32, 16
    prompt_lens, steps = [70, 9], 2
    total = [n + steps for n in prompt_lens]
    cu_full, T_full = packed(total, device)
    x = draw(rng, device, T_full, H, HV, K, V)
    pool = state_pool(rng, device, 4, layout, HV, K, V)
    slots = torch.tensor([3, 1], device=device)
    init = torch.tensor([True, False], device=device)
    names = ["q", "k", "v", "a", "b"]
    ref_pool = pool.clone()
    ref = chunk_gated_delta_rule.call_backend("reference", *(x[n] for n in names), x["A_log"], x["dt_bias"], ref_pool,
                                              cu_full, slots, init, state_layout=layout)
    starts = cu_full[:-1].tolist()
    prompt_rows = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, prompt_lens)]).to(device)
    cu_prompt, _ = packed(prompt_lens, device)
    out_prompt = chunk_gated_delta_rule.call_backend(
        "triton", *(x[n][prompt_rows] for n in names), x["A_log"], x["dt_bias"], pool, cu_prompt, slots, init,
        state_layout=layout)
    assert_close(out_prompt, ref[prompt_rows], tol=FP32_TOL)
    for step in range(steps):
        rows = torch.tensor([s + n + step for s, n in zip(starts, prompt_lens)], device=device)
        out = fused_recurrent_gated_delta_rule.call_backend(
            "triton", *(x[n][rows] for n in names), x["A_log"], x["dt_bias"], pool, slots, state_layout=layout)
        assert_close(out, ref[rows], tol=FP32_TOL)
    assert_close(pool, ref_pool, tol=FP32_TOL)


# Kernel variants selectable by config (bench/gdn.py times them side by side): the shape class's default, the
# fused intra-chunk kernel, its "solve" mode (A through memory + _wu_kernel), the
# product-form diagonal inverse, and key/value slices narrower than the head dims (two slices of K=32 and V=32).
PREFILL_VARIANTS = [
    ({}, (1, 2)),
    ({"intra": "fused"}, (2, 2)),
    ({"intra": "solve"}, (2, 2)),
    ({"intra": "fused", "inverse": "double"}, (1, 2)),
    ({"intra": "fused", "intra_BK": 16}, (2, 2)),
]


@pytest.mark.parametrize("config,grouping", PREFILL_VARIANTS, ids=lambda x: str(x).replace(" ", ""))
def test_prefill_variants_write_every_output(device, rng, monkeypatch, config, grouping):
    """Every variant equals the reference with every ``torch.empty`` poisoned (NaN floats, huge ints): the
    output and all intermediates are fully written before they are read, the tokens past cu_seqlens[-1] are
    zeroed by the kernels (no fill), and odd lengths, an empty sequence and a padding slot are handled."""
    H, HV = grouping
    K, V = 32, 32
    layout = V_MAJOR if H == 1 else K_MAJOR
    cu, T = packed([70, 0, 1, 19], device, extra=5)
    x = draw(rng, device, T, H, HV, K, V)
    pool = state_pool(rng, device, 7, layout, HV, K, V)
    slots = torch.tensor([6, 2, 0, -1], device=device)
    init = torch.tensor([True, True, False, True], device=device)
    args = [x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"]]
    ref_pool = pool.clone()
    o_ref = chunk_gated_delta_rule.call_backend("reference", *args, ref_pool, cu, slots, init, state_layout=layout)

    real_empty = torch.empty

    def poisoned_empty(*shape, **kw):
        t = real_empty(*shape, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(2**30)

    monkeypatch.setattr(torch, "empty", poisoned_empty)
    got_pool = pool.clone()
    o = chunk_triton.chunk_gated_delta_rule(*args, got_pool, cu, slots, init, state_layout=layout, config=config)
    monkeypatch.undo()
    assert torch.isfinite(o).all(), "an output element was never written"
    assert_close(o, o_ref, tol=FP32_TOL)
    assert_close(got_pool, ref_pool, tol=FP32_TOL)
    assert torch.equal(o[-5:], torch.zeros_like(o[-5:])), "tokens past cu_seqlens[-1] must be zero"
    assert torch.equal(got_pool[[1, 3, 4, 5]], pool[[1, 3, 4, 5]]), "slots outside the batch must be untouched"


def test_prefill_config_errors_name_the_knob(rng):
    x = draw(rng, "cpu", 4, 1, 2, 16, 16)
    pool = state_pool(rng, "cpu", 1, K_MAJOR, 2, 16, 16)
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], pool, torch.tensor([0, 4]), torch.tensor([0]))
    for knob in ("intra", "inverse"):
        with pytest.raises(ValueError, match=knob):
            chunk_triton.chunk_gated_delta_rule(*args, config={knob: "nope"})


# --------------------------------------------------------------------------------------------- the spec
def test_reference_matches_transformers_chunked_form(rng):
    """The recurrence (our specification) equals transformers' independent chunked torch implementation."""
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    H, HV, K, V, T = 2, 4, 16, 8, 45
    x = draw(rng, "cpu", T, H, HV, K, V)
    pool = state_pool(rng, "cpu", 2, K_MAJOR, HV, K, V)
    cu = torch.tensor([0, T], dtype=torch.int32)
    ours_pool = pool.clone()
    ours = chunk_gated_delta_rule.call_backend(
        "reference", x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], ours_pool, cu,
        torch.tensor([1]), torch.tensor([True]))
    g, beta = gating(x["a"], x["b"], x["A_log"], x["dt_bias"])
    q, k = (t.repeat_interleave(HV // H, dim=1)[None] for t in (x["q"], x["k"]))
    theirs, final = modeling.torch_chunk_gated_delta_rule(
        q, k, x["v"][None], g=g[None], beta=beta[None], chunk_size=16, initial_state=pool[1:2].clone(),
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert_close(ours, theirs[0], tol=1e-5)
    assert_close(ours_pool[1], final[0], tol=1e-5)
    assert torch.equal(ours_pool[0], pool[0])


def test_ops_are_registered():
    for name in ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
        assert OPS[name].backends == ("aiter", "triton", "reference")


def test_bad_shapes_name_the_tensor(rng):
    x = draw(rng, "cpu", 4, 2, 4, 16, 16)
    pool = state_pool(rng, "cpu", 2, K_MAJOR, 4, 16, 16)
    with pytest.raises(ValueError, match="ssm_state must be"):
        fused_recurrent_gated_delta_rule.call_backend(
            "triton", x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], pool[:, :, :8], torch.arange(4))
    with pytest.raises(ValueError, match="value heads"):
        chunk_gated_delta_rule.call_backend(
            "reference", x["q"][:, :1].expand(4, 3, 16), x["k"][:, :1].expand(4, 3, 16), x["v"], x["a"], x["b"],
            x["A_log"], x["dt_bias"], pool, torch.tensor([0, 4]), torch.tensor([0]))


# --------------------------------------------------------------------------------------------- GPU sizes
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("layout", STATE_LAYOUTS)
def test_real_head_dims_bf16_on_gpu(rng, layout):
    """Qwen3-Next head dims (K=V=128, HV=2H), bf16 activations, fp32 state: prefill then decode."""
    device = "cuda"
    H, HV, K, V = 4, 8, 128, 128
    lens = [300, 1, 77, 640]
    cu, T = packed(lens, device)
    x = draw(rng, device, T, H, HV, K, V, dtype=torch.bfloat16)
    pool = state_pool(rng, device, 6, layout, HV, K, V)
    slots = torch.tensor([4, 0, 5, 2], device=device)
    init = torch.tensor([True, False, True, False], device=device)
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], pool, cu, slots, init)
    (o_ref, s_ref), (o, s) = run_both(chunk_gated_delta_rule, *args, state_layout=layout)
    assert_close(o, o_ref, torch.bfloat16)
    assert_close(s, s_ref, tol=2e-2)
    y = draw(rng, device, 4, H, HV, K, V, dtype=torch.bfloat16)
    dargs = (y["q"], y["k"], y["v"], y["a"], y["b"], y["A_log"], y["dt_bias"], s, slots)
    (d_ref, ds_ref), (d, ds) = run_both(fused_recurrent_gated_delta_rule, *dargs, state_layout=layout)
    assert_close(d, d_ref, torch.bfloat16)
    assert_close(ds, ds_ref, tol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_graph_capturable(rng, op):
    """Captured once, replayed with new inputs: the same outputs and states as an eager call (no host sync)."""
    from helpers import assert_graph_capturable

    device, H, HV, K, V = "cuda", 2, 4, 64, 64
    lens = [3, 70, 1]
    cu, T = packed(lens, device)
    x = draw(rng, device, T if op == "prefill" else len(lens), H, HV, K, V, dtype=torch.bfloat16)
    pool0 = state_pool(rng, device, 5, V_MAJOR, HV, K, V)
    pool = pool0.clone()
    slots = torch.tensor([4, -1, 1], device=device)
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], pool)

    has_initial = torch.tensor([True, True, False], device=device)  # built before capture: no host copy inside

    def fn():
        pool.copy_(pool0)
        if op == "prefill":
            out = chunk_gated_delta_rule.call_backend("triton", *args, cu, slots, has_initial, state_layout=V_MAJOR)
        else:
            out = fused_recurrent_gated_delta_rule.call_backend("triton", *args, slots, state_layout=V_MAJOR)
        return out, pool.clone()

    assert_graph_capturable(fn, x["q"], x["v"], x["a"], pool0)


def test_prefill_behind_decodes_compiles_nothing_new(monkeypatch):
    """A host's prefill sequences follow its decode sequences, so the prefill part's per-sequence slots and
    initial-state flags are slices at a step-dependent offset (vLLM: ``state_indices[num_decodes:]``).  The conv and
    chunked delta-rule kernels must not specialize on where such a slice starts: one compile for every step."""
    from atom_kernels import causal_conv1d
    from atom_kernels.compile_keys import recording, size_specializations
    from atom_kernels.dispatch import ENV_OVERRIDE, triton_interpreting

    if not triton_interpreting():
        pytest.skip("records the launches Triton's interpreter runs (CPU)")
    monkeypatch.setenv(ENV_OVERRIDE, "triton")
    gen = torch.Generator().manual_seed(0)
    H, HV, K, V, width = 2, 4, 32, 32, 4
    dim = 2 * H * K + HV * V
    slots, initial = torch.arange(80, dtype=torch.int32), torch.arange(80) % 2 == 0
    conv_state, ssm_state = torch.zeros(80, dim, width - 1), torch.zeros(80, HV, K, V)
    weight, A_log, dt_bias = (torch.randn(*s, generator=gen) for s in ((dim, width), (HV,), (HV,)))

    def prefill_behind(num_decodes: int, lengths: list[int]) -> None:
        T, n = sum(lengths), len(lengths)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        mixed = causal_conv1d(torch.randn(T, dim, generator=gen), weight, None, conv_state, cu,
                              slots[num_decodes : num_decodes + n], initial[num_decodes : num_decodes + n])
        q, k = mixed[:, : H * K].view(T, H, K), mixed[:, H * K : 2 * H * K].view(T, H, K)
        chunk_gated_delta_rule(q, k, mixed[:, 2 * H * K :].view(T, HV, V), torch.randn(T, HV, generator=gen),
                               torch.randn(T, HV, generator=gen), A_log, dt_bias, ssm_state, cu,
                               slots[num_decodes : num_decodes + n], initial[num_decodes : num_decodes + n])

    with recording() as keys:
        for num_decodes in (0, 32, 63, 5):
            prefill_behind(num_decodes, [40, 9, 17])
    assert {"_conv_out_kernel", "_conv_state_kernel", "_state_kernel"} <= set(keys), sorted(keys)
    assert size_specializations(keys) == {}
