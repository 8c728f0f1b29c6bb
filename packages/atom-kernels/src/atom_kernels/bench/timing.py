"""Timing and ceilings on a CUDA device: median of CUDA-graph replays, measured copy bandwidth and
bf16 matrix rate (the ceilings every floor is computed from)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def median_us(fn: Callable[[], object], *, use_graph: bool = True, warmup: int = 5, reps: int = 50,
              rotate: int = 1) -> float:
    """Median time of one call of ``fn`` in µs.

    With ``use_graph`` the calls are captured into a CUDA graph (launch overhead removed, as in a
    serving engine's decode); graph capture failures fall back to eager timing.  ``rotate`` calls are
    captured back to back per replay (pass closures that cycle over several input sets so the L2 cache
    does not hold them) and the time is divided by it.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    replay: Callable[[], object] = fn
    per_replay = 1
    if use_graph:
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(rotate):
                    fn()
            replay, per_replay = graph.replay, rotate
        except RuntimeError:
            torch.cuda.synchronize()
            replay, per_replay = fn, 1
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / per_replay)
    return statistics.median(samples)


def copy_bandwidth_bytes_per_s(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    us = median_us(lambda: dst.copy_(src), use_graph=False, reps=20)
    return 2 * src.numel() / (us * 1e-6)


def bf16_matmul_flops_per_s(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    us = median_us(lambda: a @ b, use_graph=False, reps=10)
    return 2 * n**3 / (us * 1e-6)


def gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
