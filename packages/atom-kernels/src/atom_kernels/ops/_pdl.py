"""Programmatic dependent launch (PDL): letting the next kernel on a stream start before this one ends.

On NVIDIA GPUs of compute capability 9.0 and up, a kernel launched with PDL may start as soon as every program of
the kernel before it has run ``griddepcontrol.launch_dependents`` (or exited); it must then run
``griddepcontrol.wait`` before it reads anything that kernel wrote, which waits until that kernel has finished and
its writes are visible.  Both instructions are no-ops in a kernel launched without PDL, and a kernel launched with
PDL after one that never calls ``launch_dependents`` simply starts when that one ends: mixing PDL and plain kernels
(the host framework's) is always correct.  CUDA graphs keep the relation when they capture the launches.

ATOM's decode-path kernels that feed a GEMM (RMSNorm, SiLU-and-mul), the small-M MXFP4 GEMM, and the MoE chain's
routing, align and bf16 expert kernels let their successor launch as they start and wait first thing; the MXFP4
GEMM, whose weights do not depend on the previous kernel, starts streaming them before its wait
(``mxfp4_mm/gluon_small_m.py``).  The FP8/MXFP4 expert kernels (``fused_moe/triton_quant.py``) do not use it:
they measured slower with it (docs/performance-notes.md).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda

from atom_kernels.dispatch import triton_interpreting


def pdl_supported(capability: tuple[int, int] | None, hip: bool, interpreting: bool) -> bool:
    """Whether a kernel may be launched with PDL: an NVIDIA GPU (``capability`` None off the GPU) of compute
    capability >= 9.0, not ROCm, not Triton's CPU interpreter."""
    return capability is not None and capability[0] >= 9 and not hip and not interpreting


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def use_pdl(device: torch.device) -> bool:
    """:func:`pdl_supported` for tensors on ``device``."""
    capability = _capability(device.index or 0) if device.type == "cuda" else None
    return pdl_supported(capability, torch.version.hip is not None, triton_interpreting())


def launch_options(pdl: bool) -> dict:
    """The launch keywords for a kernel launched with PDL or without: ``launch_pdl`` only when on, because Triton's
    ROCm backend has no such option and rejects the keyword even when it is false."""
    return {"launch_pdl": True} if pdl else {}


def pdl_keywords(device: torch.device) -> dict:
    """The keywords of a launch on ``device`` of a kernel with a ``PDL`` constexpr: ``PDL`` (whether the kernel
    runs its ``griddepcontrol`` instructions) and, when on, the launch option."""
    pdl = use_pdl(device)
    return {"PDL": pdl, **launch_options(pdl)}


@triton.jit
def start_dependent(PDL: tl.constexpr):
    """First thing in a kernel launched with ``launch_pdl=PDL``: let the next kernel launch, then wait for the
    previous one (nothing when ``PDL`` is false, so the kernel also compiles for ROCm and the interpreter)."""
    if PDL:
        tl_cuda.gdc_launch_dependents()
        tl_cuda.gdc_wait()
