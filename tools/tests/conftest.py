"""Fixtures of the tools' tests: where the Triton kernels can run (a kernel suite at toy sizes), and tiny random
checkpoints (the accuracy gate, the native bench)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

# On a machine without a GPU the Triton kernels run through Triton's interpreter on CPU tensors.
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
# transformers binds flash-linear-attention's Triton kernels in place of its own torch Gated DeltaNet code when
# fla imports; the reference models here run on the CPU and must be transformers' torch code.
sys.modules.setdefault("fla", None)
DEVICES = (["cpu"] if INTERPRET else []) + (["cuda"] if torch.cuda.is_available() else [])
_TINY: dict[tuple, str] = {}


@pytest.fixture(params=DEVICES)
def device(request):
    """Where the Triton kernels can run here: CPU tensors through the interpreter, or the GPU."""
    return torch.device(request.param)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """``tiny(arch, **overrides) -> dir``: a tiny random checkpoint (``atom make-tiny``), built once per session."""
    from atom_core.tiny import make_tiny

    def build(arch: str, *, seed: int = 0, **overrides) -> str:
        key = (arch, seed, repr(sorted(overrides.items())))
        if key not in _TINY:
            out = tmp_path_factory.mktemp(arch)
            make_tiny(arch, out, seed=seed, **overrides)
            _TINY[key] = str(out)
        return _TINY[key]

    return build
