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


def test_misspelt_op_names_are_errors():
    """An op name that is not a registered op is an error naming the valid ones, never silently ignored."""
    with pytest.raises(ValueError, match=r"unknown op 'rms_nrom' \(did you mean 'rms_norm'\?\); ops: .*silu_and_mul"):
        parse_override("rms_nrom=reference", dispatch.OPS)
    with pytest.raises(ValueError, match="unknown op 'rms_nrom'"):
        candidate_backends(dispatch.OPS["rms_norm"], "cpu", "rms_nrom=reference")
    with pytest.raises(ValueError, match="'rms_norm=' is not op=backend"):
        parse_override("rms_norm=")


def test_check_override_up_front(monkeypatch):
    dispatch.check_override(None)
    dispatch.check_override("reference,rms_norm=triton")
    with pytest.raises(ValueError, match="op 'rms_norm_gated' has no 'aiter' backend"):
        dispatch.check_override("rms_norm_gated=aiter")
    with pytest.raises(ValueError, match="asks for 'aiter' on cpu"):
        dispatch.check_override("aiter", "cpu")
    dispatch.check_override("aiter")  # no device named: availability is not checked


def test_mxfp4_layout_without_triton(monkeypatch):
    """Without Triton only the reference runs, and it reads the checkpoint's rows (no import of Triton)."""
    import sys

    from atom_kernels.ops.mxfp4_mm import preferred_layout

    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.delitem(sys.modules, "atom_kernels.ops.mxfp4_mm.planner", raising=False)
    dispatch._triton_present.cache_clear()
    try:
        assert preferred_layout(256, 256, torch.device("cpu")) == "rows"
    finally:
        dispatch._triton_present.cache_clear()
