"""Kernel tests run the Triton kernels on the CPU through Triton's interpreter at small sizes."""

import os
import sys

import pytest
import torch

# On a machine without a GPU the Triton kernels run through Triton's interpreter on CPU tensors.
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
# transformers binds flash-linear-attention's Triton kernels in place of its own torch Gated DeltaNet code when
# fla imports (decided once, when its model module is imported); the reference models here run on the CPU and
# must be transformers' torch code, so fla is made unimportable in the test process (benches run apart).
sys.modules.setdefault("fla", None)
DEVICES = (["cpu"] if INTERPRET else []) + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request):
    """Where the Triton kernels can run here: CPU tensors through the interpreter, or the GPU."""
    return torch.device(request.param)


@pytest.fixture
def rng():
    """A fresh generator per test: every run draws new inputs unless ATOM_TEST_SEED pins them."""
    seed = int(os.environ.get("ATOM_TEST_SEED", torch.seed() % 2**31))
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)
