"""Gated RMSNorm of GDN's output against the torch reference and transformers' module."""

import pytest
import torch
from helpers import assert_close, randn

from atom_kernels import rms_norm_gated


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 48), (5, 3, 24), (1, 32, 128)])
def test_matches_reference(device, rng, dtype, shape):
    x = randn(*shape, dtype=dtype, device=device, gen=rng)
    wide = randn(*shape[:-1], shape[-1] * 2, dtype=dtype, device=device, gen=rng)
    z = wide[..., : shape[-1]]  # a strided view, as the layer passes z
    w = randn(shape[-1], dtype=dtype, device=device, gen=rng)
    out = rms_norm_gated.call_backend("triton", x, z, w, 1e-6)
    assert_close(out, rms_norm_gated.call_backend("reference", x, z, w, 1e-6), dtype)


def test_reference_matches_transformers(rng):
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    norm = modeling.Qwen3NextRMSNormGated(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16, generator=rng))
    x, z = torch.randn(9, 16, generator=rng), torch.randn(9, 16, generator=rng)
    assert_close(rms_norm_gated.call_backend("reference", x, z, norm.weight.data, 1e-6), norm(x, z).detach())
