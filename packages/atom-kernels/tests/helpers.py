"""Comparison helpers shared by the kernel tests."""

from __future__ import annotations

import torch

# ‖out - ref‖ / ‖ref‖ bounds per dtype: fp32 arithmetic differs only in summation order;
# bf16/fp16 outputs are rounded once more than the fp32 reference, and Triton's CPU interpreter
# rounds fp32 -> bf16 by truncation (1 ulp = 2^-8) where the GPU rounds to nearest.  Wrong indexing
# or a missing element shows as an error of order 1.
REL_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    assert torch.isfinite(out64).all(), "non-finite output"
    return ((out64 - ref64).norm() / ref64.norm().clamp_min(1e-30)).item()


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None, tol: float | None = None):
    assert out.shape == ref.shape, (out.shape, ref.shape)
    bound = tol if tol is not None else REL_TOL[dtype or ref.dtype]
    err = rel_err(out, ref)
    assert err <= bound, f"relative error {err:.3e} > {bound:.1e}"


def randn(*shape, dtype=torch.float32, device="cpu", gen=None, scale=1.0):
    return (torch.randn(*shape, generator=gen, dtype=torch.float32) * scale).to(dtype=dtype, device=device)


def assert_graph_capturable(fn, *inputs_to_refresh):
    """``fn()`` captured into a CUDA graph and replayed gives what an eager call gives.

    ``fn`` must return a tensor or a tuple of tensors; ``inputs_to_refresh`` are tensors it reads that the
    check overwrites with fresh values between capture and replay, so a graph that baked in stale values
    (a host sync, a ``.item()``) fails.
    """
    import torch

    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn()
    for t in inputs_to_refresh:
        t.copy_(torch.randn_like(t.float()).to(t.dtype) if t.is_floating_point() else t)
    graph.replay()
    torch.cuda.synchronize()
    expected = fn()
    captured = captured if isinstance(captured, tuple) else (captured,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for got, want in zip(captured, expected):
        torch.testing.assert_close(got, want)


def every_code_pair_word(seed: int = 0):
    """``(pair, byte, word, lo, hi)`` for each of the 256 e2m1 code pairs at each of a 32-bit word's 4 byte positions
    (codes ``2 pair`` and ``2 pair + 1`` in byte ``pair``, the other codes random), with ``lo`` / ``hi`` the bf16
    bit patterns of ``code * 2**-126`` that a decode must produce for the pair's two codes."""
    from atom_kernels import formats

    gen = torch.Generator().manual_seed(seed)
    expected = (formats.E2M1_VALUES * 2.0**-126).to(torch.bfloat16).view(torch.int16).int() & 0xFFFF
    for pair in range(4):
        for byte in range(256):
            word = int(torch.randint(0, 2**32, (), generator=gen, dtype=torch.int64)) & ~(0xFF << (8 * pair))
            yield pair, byte, word | byte << (8 * pair), int(expected[byte & 15]), int(expected[byte >> 4])
