"""Triton kernels of the dense-model ops against their torch references."""

import pytest
import torch
from helpers import assert_close, assert_graph_capturable, randn

from atom_kernels import rms_norm, rotary_embedding, silu_and_mul

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 8), (5, 33), (3, 4, 130)])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("weight_offset", [0.0, 1.0])
def test_rms_norm(device, rng, dtype, shape, with_residual, weight_offset):
    x = randn(*shape, dtype=dtype, device=device, gen=rng)
    w = randn(shape[-1], dtype=dtype, device=device, gen=rng)
    res = randn(*shape, dtype=dtype, device=device, gen=rng) if with_residual else None
    ref = rms_norm.call_backend("reference", x, w, 1e-6, res, weight_offset)
    out = rms_norm.call_backend("triton", x, w, 1e-6, res, weight_offset)
    if with_residual:
        assert_close(out[1], ref[1], dtype)
        out, ref = out[0], ref[0]
    assert_close(out, ref, dtype)


def test_rms_norm_strided_rows(device, rng):
    base = randn(6, 40, device=device, gen=rng)
    x = base[:, 4:36]  # rows with stride 40
    w = randn(32, device=device, gen=rng)
    assert_close(rms_norm.call_backend("triton", x, w, 1e-5), rms_norm.call_backend("reference", x, w, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2), (7, 22), (2, 3, 2 * 1100)])
def test_silu_and_mul(device, rng, dtype, shape):
    x = randn(*shape, dtype=dtype, device=device, gen=rng, scale=3.0)
    assert_close(silu_and_mul.call_backend("triton", x), silu_and_mul.call_backend("reference", x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_size,rotary_dim", [(4, 2, 16, 16), (3, 1, 24, 12), (5, 5, 64, 32)])
@pytest.mark.parametrize("num_tokens", [1, 13])
def test_rotary_embedding(device, rng, dtype, is_neox, num_heads, num_kv_heads, head_size, rotary_dim, num_tokens):
    max_pos = 64
    cache = randn(max_pos, rotary_dim, device=device, gen=rng)
    positions = torch.randint(0, max_pos, (num_tokens,), generator=rng).to(device)
    qkv = randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_size, dtype=dtype, device=device, gen=rng)
    q_size, kv_size = num_heads * head_size, num_kv_heads * head_size
    outs = {}
    for backend in ("reference", "triton"):
        buf = qkv.clone()
        q, k, _ = buf.split([q_size, kv_size, kv_size], dim=-1)  # strided views, rotated in place
        rotary_embedding.call_backend(backend, positions, q, k, cache, head_size, is_neox)
        outs[backend] = buf
    assert_close(outs["triton"], outs["reference"], dtype)
    # the value part and the un-rotated dims are untouched
    assert torch.equal(outs["triton"][:, q_size + kv_size :], qkv[:, q_size + kv_size :])


def test_rotary_q_only_and_3d(device, rng):
    cache = randn(16, 8, device=device, gen=rng)
    positions = torch.tensor([3, 0, 15], device=device)
    q = randn(3, 2, 8, device=device, gen=rng)
    q_ref = q.clone()
    rotary_embedding.call_backend("triton", positions, q, None, cache, 8, True)
    rotary_embedding.call_backend("reference", positions, q_ref, None, cache, 8, True)
    assert_close(q, q_ref)


def test_rotary_matches_explicit_complex_rotation(rng):
    """The reference itself: NeoX rotation of a pair (x_i, x_{i+d/2}) equals complex multiplication."""
    head, pos = 8, torch.tensor([5])
    theta = torch.rand(4, generator=rng) * 3
    cache = torch.cat([theta.cos(), theta.sin()])[None].repeat(6, 1)
    q = torch.randn(1, head, generator=rng)
    expected = torch.view_as_real(torch.complex(q[0, :4], q[0, 4:]) * torch.polar(torch.ones(4), theta))
    rotary_embedding.call_backend("reference", pos, q, None, cache, head, True)
    torch.testing.assert_close(q[0, :4], expected[:, 0])
    torch.testing.assert_close(q[0, 4:], expected[:, 1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_dense_ops_are_cuda_graph_capturable(rng):
    x = randn(9, 96, dtype=torch.bfloat16, device="cuda", gen=rng)
    res = randn(9, 96, dtype=torch.bfloat16, device="cuda", gen=rng)
    w = randn(96, dtype=torch.bfloat16, device="cuda", gen=rng)
    assert_graph_capturable(lambda: rms_norm.call_backend("triton", x, w, 1e-6, res), x, res)
    assert_graph_capturable(lambda: silu_and_mul.call_backend("triton", x), x)
    cache = randn(32, 16, device="cuda", gen=rng)
    pos = torch.randint(0, 32, (9,), generator=rng).cuda()
    qk = randn(9, 3 * 32, dtype=torch.bfloat16, device="cuda", gen=rng)

    def rotate_copy():
        out = qk.clone()
        q, k = out[:, :64], out[:, 64:]
        rotary_embedding.call_backend("triton", pos, q, k, cache, 32, True)
        return out

    assert_graph_capturable(rotate_copy, qk)
