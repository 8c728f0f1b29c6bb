"""Causal conv1d of GDN (prefill over packed sequences, decode update) against the torch reference."""

import pytest
import torch
from helpers import assert_close, randn

from atom_kernels import causal_conv1d, causal_conv1d_update

DTYPES = [torch.float32, torch.bfloat16]


def conv_pool(rng, device, num_slots, dim, width, dtype):
    """A pool stored [slots, W-1, D] (channels contiguous) and used through its [slots, D, W-1] view."""
    return randn(num_slots, width - 1, dim, dtype=dtype, device=device, gen=rng).transpose(1, 2)


def both(op, *args, state_index, **kwargs):
    outs = []
    for backend in ("reference", "triton"):
        call = list(args)
        call[state_index] = args[state_index].clone()
        outs.append((op.call_backend(backend, *call, **kwargs), call[state_index]))
    return outs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("width", [4, 2])
def test_prefill_matches_reference(device, rng, dtype, with_bias, width):
    dim = 70
    lens = [5, 1, 0, 77, 2]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    T = int(cu[-1]) + 2
    x = randn(T, dim + 6, dtype=dtype, device=device, gen=rng)[:, 3 : 3 + dim]  # strided rows
    weight = randn(dim, width, dtype=dtype, device=device, gen=rng)
    bias = randn(dim, dtype=dtype, device=device, gen=rng) if with_bias else None
    pool = conv_pool(rng, device, 8, dim, width, dtype)
    slots = torch.tensor([3, 0, 5, -1, 7], device=device)
    init = torch.tensor([True, False, True, True, True], device=device)
    (o_ref, s_ref), (o, s) = both(causal_conv1d, x, weight, bias, pool, cu, slots, init, state_index=3)
    assert_close(o, o_ref, dtype)
    assert_close(s, s_ref, dtype)
    assert torch.equal(o[-2:], torch.zeros_like(o[-2:]))
    assert torch.equal(s[[1, 2, 4, 6]], pool[[1, 2, 4, 6]])


def test_prefill_without_initial_state(device, rng):
    dim, width = 33, 4
    cu = torch.tensor([0, 2, 9], dtype=torch.int32, device=device)
    x = randn(9, dim, device=device, gen=rng)
    weight = randn(dim, width, device=device, gen=rng)
    pool = conv_pool(rng, device, 3, dim, width, torch.float32)
    slots = torch.tensor([2, 0], device=device)
    (o_ref, s_ref), (o, s) = both(causal_conv1d, x, weight, None, pool, cu, slots, None, state_index=3)
    assert_close(o, o_ref)
    assert_close(s, s_ref)
    # a 2-token sequence keeps a zero in its oldest state column when there was no initial state
    assert torch.equal(s[2][:, 0], torch.zeros_like(s[2][:, 0]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens_per_seq", [1, 3])
def test_update_matches_reference(device, rng, dtype, tokens_per_seq):
    dim, width, N = 300, 4, 4
    x = randn(N * tokens_per_seq, dim, dtype=dtype, device=device, gen=rng)
    weight = randn(dim, width, dtype=dtype, device=device, gen=rng)
    bias = randn(dim, dtype=dtype, device=device, gen=rng)
    pool = conv_pool(rng, device, 6, dim, width, dtype)
    slots = torch.tensor([4, -1, 0, 2], device=device)
    (o_ref, s_ref), (o, s) = both(causal_conv1d_update, x, weight, bias, pool, slots, state_index=3)
    assert_close(o, o_ref, dtype)
    assert_close(s, s_ref, dtype)
    pad = slice(tokens_per_seq, 2 * tokens_per_seq)
    assert torch.equal(o[pad], torch.zeros_like(o[pad]))
    assert torch.equal(s[[1, 3, 5]], pool[[1, 3, 5]])


def test_prefill_then_updates_equal_one_conv(device, rng):
    """Prefill of a prompt then decode steps give the conv of the whole sequence (no activation)."""
    dim, width, prompt, steps = 24, 4, 6, 3
    x = randn(prompt + steps, dim, device=device, gen=rng)
    weight = randn(dim, width, device=device, gen=rng)
    pool = conv_pool(rng, device, 2, dim, width, torch.float32)
    slots = torch.tensor([1], device=device)
    whole = causal_conv1d.call_backend("reference", x, weight, None, pool.clone(), torch.tensor([0, prompt + steps]),
                                       torch.tensor([0]), None, activation=None)
    out = [causal_conv1d.call_backend("triton", x[:prompt], weight, None, pool, torch.tensor([0, prompt], device=device),
                                      slots, None, activation=None)]
    for t in range(prompt, prompt + steps):
        out.append(causal_conv1d_update.call_backend("triton", x[t : t + 1], weight, None, pool, slots, activation=None))
    assert_close(torch.cat(out), whole)
    explicit = torch.nn.functional.conv1d(x.t()[None], weight[:, None, :], padding=width - 1, groups=dim)[0, :, : prompt + steps]
    assert_close(whole, explicit.t().to(whole.device))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ragged", [False, True])
def test_rolling_update_matches_reference(device, rng, dtype, ragged):
    """Speculative steps against vLLM's rolling buffer (W - 2 + 3 columns): windows at the accepted offsets,
    uniform (3 tokens each) or ragged lengths (one sequence without tokens), a padding slot."""
    dim, width, N, tq = 130, 4, 4, 3
    lens = [3, 1, 0, 2] if ragged else [tq] * N
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    x = randn(int(cu[-1]) + (1 if ragged else 0), dim, dtype=dtype, device=device, gen=rng)
    weight = randn(dim, width, dtype=dtype, device=device, gen=rng)
    bias = randn(dim, dtype=dtype, device=device, gen=rng)
    pool = randn(7, width - 2 + tq, dim, dtype=dtype, device=device, gen=rng).transpose(1, 2)  # vLLM's SD layout
    slots = torch.tensor([5, 2, 0, -1] if ragged else [5, -1, 0, 2], device=device)
    accepted = torch.tensor([2, 3, 1, 1] if ragged else [2, 1, 3, 1], dtype=torch.int32, device=device)
    kwargs = dict(num_accepted_tokens=accepted, cu_seqlens=cu if ragged else None)
    (o_ref, s_ref), (o, s) = both(causal_conv1d_update, x, weight, bias, pool, slots, state_index=3, **kwargs)
    assert_close(o, o_ref, dtype)
    assert_close(s, s_ref, dtype)
    padding = [n for n, slot in enumerate(slots.tolist()) if slot < 0]
    for n in padding:
        rows = slice(int(cu[n]), int(cu[n + 1]))
        assert torch.equal(o[rows], torch.zeros_like(o[rows]))
    untouched = [1, 3, 4, 6] + ([0] if ragged else [])  # slot 0 holds the sequence without tokens when ragged
    assert torch.equal(s[untouched], pool[untouched])
    if ragged:
        assert torch.equal(o[-1], torch.zeros_like(o[-1])), "rows past the last sequence are zero"


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_rolling_steps_equal_one_conv_over_accepted_tokens(device, rng, backend):
    """Prefill (the reference), then speculative steps of 1 + 2 draft tokens where 2, 1 and 3 of them are accepted (the
    rejected drafts' inputs replaced by the next step's tokens): every accepted token's output and the final
    window equal one causal conv over the accepted tokens alone."""
    dim, width, prompt, num_spec = 20, 4, 5, 2
    weight = randn(dim, width, device=device, gen=rng)
    pool = torch.zeros(2, width - 1 + num_spec, dim, device=device).transpose(1, 2)
    slots = torch.tensor([1], device=device)
    accepted_stream = [randn(prompt, dim, device=device, gen=rng)]
    outputs = [causal_conv1d.call_backend("reference", accepted_stream[0], weight, None, pool[:, :, : width - 1],
                                          torch.tensor([0, prompt], dtype=torch.int32, device=device), slots, None,
                                          activation=None)]
    accepted = 1
    for num_accepted in (2, 1, 3):
        step = randn(1 + num_spec, dim, device=device, gen=rng)
        out = causal_conv1d_update.call_backend(
            backend, step, weight, None, pool, slots, activation=None,
            num_accepted_tokens=torch.tensor([accepted], dtype=torch.int32, device=device))
        accepted_stream.append(step[:num_accepted])
        outputs.append(out[:num_accepted])
        accepted = num_accepted
    stream = torch.cat(accepted_stream)
    whole = torch.nn.functional.conv1d(stream.t()[None], weight[:, None, :], padding=width - 1, groups=dim)[0, :, : len(stream)]
    assert_close(torch.cat(outputs), whole.t())
    # the window of the next step (at the last accepted offset) holds the last W - 1 accepted inputs
    assert_close(pool[1][:, accepted - 1 : accepted - 1 + width - 1].t(), stream[-(width - 1) :])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("op", ["update", "prefill"])
def test_graph_capturable(rng, op):
    from helpers import assert_graph_capturable

    device, dim, width = "cuda", 96, 4
    cu = torch.tensor([0, 5, 6, 40], dtype=torch.int32, device=device)
    x = randn(40 if op == "prefill" else 3, dim, dtype=torch.bfloat16, device=device, gen=rng)
    weight = randn(dim, width, dtype=torch.bfloat16, device=device, gen=rng)
    pool0 = conv_pool(rng, device, 4, dim, width, torch.bfloat16)
    pool = pool0.clone()
    slots = torch.tensor([2, -1, 0], device=device)
    init = torch.tensor([True, True, False], device=device)

    def fn():
        pool.copy_(pool0)
        if op == "prefill":
            out = causal_conv1d.call_backend("triton", x, weight, None, pool, cu, slots, init)
        else:
            out = causal_conv1d_update.call_backend("triton", x, weight, None, pool, slots)
        return out, pool.clone()

    assert_graph_capturable(fn, x, pool0)
