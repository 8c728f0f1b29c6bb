"""Timing and ceilings on a CUDA device: median of CUDA-graph replays, measured copy bandwidth and
bf16 matrix rate (the ceilings every floor is computed from)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def measure(fn: Callable[[], object], *, use_graph: bool = True, calls_per_graph: int = 20, warmup: int = 3,
            reps: int = 30) -> dict:
    """Median device time of one call of ``fn``: ``{"us": float, "graph": bool, "samples_us": [float]}``
    (``samples_us``: each timed repetition's time per call, what a regression check tests).

    With ``use_graph`` (the default), ``calls_per_graph`` calls are captured back to back into one CUDA
    graph and each replay is timed with events, so neither Python nor the host's launch latency is in the
    number (as in a serving engine's captured decode step).  ``fn`` may cycle over several input sets so
    the L2 cache does not hold them.  When capture fails (a peer that syncs with the host), the calls are
    timed eagerly, back to back, and ``graph`` is False.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if use_graph:
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls_per_graph):
                    fn()
            return _timing(_event_us(graph.replay, reps), calls_per_graph, graph=True)
        except RuntimeError:
            torch.cuda.synchronize()

    def eager() -> None:
        for _ in range(calls_per_graph):
            fn()

    return _timing(_event_us(eager, reps), calls_per_graph, graph=False)


def _timing(samples: list[float], calls: int, graph: bool) -> dict:
    per_call = [t / calls for t in samples]
    return {"us": statistics.median(per_call), "graph": graph, "samples_us": [round(t, 4) for t in per_call]}


def median_us(fn: Callable[[], object], *, rotate: int | None = None, **kw) -> float:
    """:func:`measure`'s time alone (``rotate``: calls per graph, at least the default 20)."""
    if rotate is not None:
        kw["calls_per_graph"] = max(rotate, kw.get("calls_per_graph", 20))
    return measure(fn, **kw)["us"]


def _event_us(run: Callable[[], object], reps: int) -> list[float]:
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0)
    return samples


def copy_bandwidth_bytes_per_s(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    us = median_us(lambda: dst.copy_(src), use_graph=False, calls_per_graph=1, reps=20)
    return 2 * src.numel() / (us * 1e-6)


def bf16_matmul_flops_per_s(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    us = median_us(lambda: a @ b, use_graph=False, calls_per_graph=1, reps=10)
    return 2 * n**3 / (us * 1e-6)


def gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
