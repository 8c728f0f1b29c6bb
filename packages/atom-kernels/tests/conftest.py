"""Kernel tests run the Triton kernels on the CPU through Triton's interpreter at small sizes."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(params=["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def device(request):
    return torch.device(request.param)


@pytest.fixture
def rng():
    """A fresh generator per test: every run draws new inputs unless ATOM_TEST_SEED pins them."""
    seed = int(os.environ.get("ATOM_TEST_SEED", torch.seed() % 2**31))
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)
