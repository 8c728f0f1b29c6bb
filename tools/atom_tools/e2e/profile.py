"""What a host's torch-profiler traces say about a run: GPU busy time, kernels, launches and host operators
(:func:`kernel_table`; the vLLM and SGLang benches both profile through their host's own profiler)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

HOST_CATEGORIES = ("cpu_op", "user_annotation", "python_function")
LAUNCH_CALLS = ("cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC",
                "cudaMemcpyAsync", "cudaStreamSynchronize")


def kernel_table(profile_dir: Path, top: int = 30) -> dict:
    """Over the profiler traces under ``profile_dir``: the time the GPU was busy (the union of the kernel
    intervals), how many kernels, copies and memsets it ran (``gpu_ops``: each one costs a launch gap even inside a
    CUDA graph), per kernel name ``[name, summed µs, own µs, launches]`` ranked by own time, and how often the host called
    each CUDA launch entry point of ``LAUNCH_CALLS`` (kernels replayed from a CUDA graph count once, as its
    ``cudaGraphLaunch``).  A kernel started early by programmatic dependent launch overlaps its predecessor while
    it waits for it, so its summed duration includes that wait; its own time is only what it adds to the busy
    time beyond the kernels that started before it (the own times add up to ``busy_us``).  ``host_ops``: the
    host-side operators and annotations ``[name, count, summed µs]`` ranked by summed time (nested ones overlap):
    where the wall time beyond the GPU's goes."""
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    calls: dict[str, int] = {}
    host: dict[str, list] = {}
    intervals: list[tuple[float, float, str]] = []
    for trace in sorted(profile_dir.rglob("*.json*")):
        with (gzip.open(trace, "rt") if trace.suffix == ".gz" else open(trace)) as f:
            events = json.load(f).get("traceEvents", [])
        for e in events:
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                start, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
                totals[e["name"]] = totals.get(e["name"], 0.0) + dur
                counts[e["name"]] = counts.get(e["name"], 0) + 1
                intervals.append((start, start + dur, e["name"]))
            elif e.get("cat") == "cuda_runtime" and e.get("name") in LAUNCH_CALLS:
                calls[e["name"]] = calls.get(e["name"], 0) + 1
            elif e.get("cat") in HOST_CATEGORIES:
                seen = host.setdefault(e["name"], [0, 0.0])
                seen[0] += 1
                seen[1] += float(e.get("dur", 0.0))
    own = dict.fromkeys(totals, 0.0)
    end = float("-inf")
    for start, stop, name in sorted(intervals):
        own[name] += max(0.0, stop - max(start, end))
        end = max(end, stop)
    ranked = sorted(totals, key=lambda n: (-own[n], -totals[n]))
    return {"total_us": round(sum(totals.values()), 1), "busy_us": round(sum(own.values()), 1),
            "gpu_ops": len(intervals), "host_calls": calls,
            "kernels": [[n[:120], round(totals[n], 1), round(own[n], 1), counts[n]] for n in ranked[:top]],
            "host_ops": [[n[:120], c, round(t, 1)] for n, (c, t) in sorted(host.items(), key=lambda kv: -kv[1][1])[:top]]}


def profiled_record(batch: int, prompt_len: int, output_len: int, seconds: float, profile_dir: Path) -> dict:
    """What a bench stores for one profiled run: its shape, its wall time and :func:`kernel_table` of its traces."""
    return {"batch": batch, "prompt_len": prompt_len, "output_len": output_len, "wall_us": round(seconds * 1e6, 1),
            **kernel_table(profile_dir)}


def summary_lines(label: str, impl: str, kernels: dict) -> list[str]:
    """Two lines of a bench's console table for one profiled run (:func:`kernel_table` plus ``wall_us``)."""
    k = kernels
    return [f"{label}: {impl} profiled run {k['wall_us'] / 1e3:.1f} ms wall, GPU busy {k['busy_us'] / 1e3:.1f} ms "
            f"(kernels summed {k['total_us'] / 1e3:.1f} ms, {k['gpu_ops']} GPU ops), host calls {k['host_calls']}",
            "  own GPU ms (launches): " + ", ".join(f"{row[0][:40]} {row[2] / 1e3:.2f} ({row[3]})"
                                                     for row in k["kernels"][:8])]
