import pytest
import torch
from conftest import INTERPRET

from atom_kernels import dispatch
from atom_kernels.dispatch import BackendUnavailable, candidate_backends, parse_override


def test_parse_override_forms():
    assert parse_override(None) == (None, {})
    assert parse_override("triton") == ("triton", {})
    assert parse_override("triton, rms_norm=reference") == ("triton", {"rms_norm": "reference"})
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        parse_override("cuda")


def test_cpu_defaults_to_reference_without_override():
    op = dispatch.OPS["rms_norm"]
    assert candidate_backends(op, "cpu", None) == ("reference",)


@pytest.mark.skipif(not INTERPRET, reason="imports kernels in interpreter mode: CPU-only check")
def test_forced_triton_on_cpu_runs_through_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    op = dispatch.OPS["silu_and_mul"]
    assert candidate_backends(op, "cpu", "triton") == ("triton", "reference")
    assert candidate_backends(op, "cpu", "rms_norm=reference") == ("reference",)


def test_forced_unavailable_backend_is_a_clear_error(monkeypatch):
    op = dispatch.OPS["rms_norm"]
    with pytest.raises(BackendUnavailable, match="aiter"):
        candidate_backends(op, "cpu", "aiter")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(BackendUnavailable, match="TRITON_INTERPRET"):
        candidate_backends(op, "cpu", "triton")


@pytest.mark.skipif(not INTERPRET, reason="imports kernels in interpreter mode: CPU-only check")
def test_precondition_failure_falls_back_to_reference(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(dispatch.ENV_OVERRIDE, "triton")
    op = dispatch.OPS["silu_and_mul"]
    odd = torch.randn(3, 7)  # odd last dim: the Triton kernel declines
    backend, _ = op.resolve(odd)
    assert backend == "reference"
    even = torch.randn(3, 8)
    backend, _ = op.resolve(even)
    assert backend == "triton"


def test_describe_lists_every_op():
    table = dispatch.describe("cpu")
    assert set(table) >= {"rms_norm", "silu_and_mul", "rotary_embedding"}
