"""Do no harm as data (atom_core.takeover): which class serves each architecture per host and platform, the
ATOM_TAKE_OVER switch, and that every measured row agrees with the committed results it cites."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from atom_core import catalog, takeover
from atom_core.errors import UsageError
from atom_core.takeover import CPU, CUDA, ROCM, TAKE_OVER_ENV, decide

ROOT = Path(__file__).resolve().parents[3]
ALL_ARCHS = list(catalog.ARCHITECTURES)


@pytest.fixture(autouse=True)
def unset(monkeypatch):
    monkeypatch.delenv(TAKE_OVER_ENV, raising=False)


@pytest.mark.parametrize("host", sorted(takeover.HOSTS))
def test_cpu_keeps_the_hosts_class(host):
    for arch in ALL_ARCHS:
        d = decide(host, CPU, arch, host_has_own=True)
        assert not d.atom and "ATOM_TAKE_OVER=all" in d.reason, (arch, d)


def test_cuda_follows_the_measurements():
    assert decide("vllm", CUDA, "Qwen3ForCausalLM", True).atom
    llama = decide("vllm", CUDA, "LlamaForCausalLM", True)  # the newest run: 1.00x / 0.98x
    assert llama.atom and "vllm-e2e-llama-qwen3-8b.json" in llama.reason
    assert decide("vllm", CUDA, "Qwen3MoeForCausalLM", True).atom  # the newest run: 1.03x / 1.01x
    unmeasured = decide("vllm", CUDA, "Glm4MoeForCausalLM", True)
    assert not unmeasured.atom and "no measured fast path" in unmeasured.reason
    assert decide("sglang", CUDA, "Qwen3MoeForCausalLM", True).atom  # measured inside SGLang
    assert not decide("sglang", CUDA, "LlamaForCausalLM", True).atom  # vLLM's numbers say nothing about SGLang
    assert not decide("vllm", ROCM, "Qwen3ForCausalLM", True).atom
    assert not decide("vllm", "", "Qwen3ForCausalLM", True).atom  # a platform the host did not recognise


def test_architectures_the_host_lacks_stay_atoms(monkeypatch):
    monkeypatch.setenv(TAKE_OVER_ENV, "none")
    d = decide("sglang", CPU, "Qwen3_5ForConditionalGeneration", host_has_own=False)
    assert d.atom and "no class of its own" in d.reason


@pytest.mark.parametrize("value, expected", [
    ("all", set(ALL_ARCHS)), (" ALL ", set(ALL_ARCHS)), ("none", set()),
    ("Qwen3ForCausalLM", {"Qwen3ForCausalLM"}), ("LlamaForCausalLM, Qwen3ForCausalLM", {"LlamaForCausalLM", "Qwen3ForCausalLM"}),
])
def test_switch(monkeypatch, value, expected):
    monkeypatch.setenv(TAKE_OVER_ENV, value)
    for platform in (CPU, CUDA):
        atom = {d.arch for d in takeover.decide_all("vllm", platform, ALL_ARCHS, ALL_ARCHS) if d.atom}
        measured = {a for a in ALL_ARCHS if platform == CUDA and decide_unset(platform, a)} if value != "none" else set()
        assert atom == expected | measured, (value, platform)


def decide_unset(platform: str, arch: str) -> bool:
    row = takeover.measurement("vllm", platform, arch)
    return row is not None and row.atom_wins


@pytest.mark.parametrize("value", ["Llama", "all,Qwen3ForCausalLM", "yes"])
def test_switch_value_naming_no_architecture_is_an_error(monkeypatch, value):
    monkeypatch.setenv(TAKE_OVER_ENV, value)
    with pytest.raises(UsageError, match=f"{TAKE_OVER_ENV}={value}: .* is not a catalog architecture"):
        decide("vllm", CPU, "LlamaForCausalLM", True)


def test_summary_names_every_architecture_once():
    decisions = takeover.decide_all("vllm", CUDA, ALL_ARCHS, ["LlamaForCausalLM", "Qwen3ForCausalLM", "Glm4MoeForCausalLM"])
    lines = takeover.summary("vllm", CUDA, decisions)
    assert [line.split(",")[0].split(" serve")[0] for line in lines] == ["ATOM's classes", "vLLM's own classes"]
    for arch in ALL_ARCHS:
        assert sum(f" {arch}," in line or f" {arch} (" in line for line in lines) == 1, arch
    assert "Glm4MoeForCausalLM (ATOM has no measured fast path in vLLM on CUDA" in lines[1]


def test_a_row_below_parity_keeps_the_hosts_class(monkeypatch):
    slower = takeover.Measured("vllm", CUDA, "Glm4MoeForCausalLM", takeover.PARITY - 0.01, "bench/results/x.json", "")
    monkeypatch.setattr(takeover, "MEASURED", (*takeover.MEASURED, slower))
    d = decide("vllm", CUDA, "Glm4MoeForCausalLM", True)
    assert not d.atom and "measured slower in vLLM on CUDA" in d.reason and "bench/results/x.json" in d.reason
    assert decide("sglang", CUDA, "Glm4MoeForCausalLM", False).atom  # a host without its own class: ATOM's


def output_ratio(path: Path, arch: str, host: str) -> float:
    """Geometric mean over batch sizes of ATOM's median output tokens/s over the host's own (the implementation
    named like the host), from a bench file."""
    (model,) = [m for m in json.loads(path.read_text())["models"] if m["arch"] == arch]
    atom, own = (model["impls"][impl]["batches"] for impl in ("atom", host))
    ratios = [atom[b]["output_tok_per_s"]["median"] / own[b]["output_tok_per_s"]["median"] for b in atom]
    return math.exp(sum(map(math.log, ratios)) / len(ratios))


@pytest.mark.parametrize("row", [m for m in takeover.MEASURED if m.results.startswith("bench/results/")],
                         ids=lambda m: f"{m.host}-{m.platform}-{m.arch}")
def test_measured_rows_agree_with_their_results(row):
    """Each row's ratio is what its committed result file says, and it is the newest file measuring that architecture
    in that host (a newer run must update the row)."""
    path = ROOT / row.results
    assert path.is_file(), f"{row.results} is not committed"
    assert output_ratio(path, row.arch, row.host) == pytest.approx(row.ratio, abs=0.005)
    newer = [p for p in sorted(ROOT.glob(f"bench/results/*/{row.host}-e2e-*.json"))
             if p.parent.name > path.parent.name
             and any(m["arch"] == row.arch for m in json.loads(p.read_text())["models"])]
    assert newer == [], f"{row.arch}: newer results than {row.results}: {newer}"


def test_rows_name_catalog_architectures_once():
    keys = [(m.host, m.platform, m.arch) for m in takeover.MEASURED]
    assert len(keys) == len(set(keys))
    for host, platform, arch in keys:
        assert host in takeover.HOSTS and platform in (CPU, CUDA, ROCM)
        assert arch == takeover.EVERY or arch in catalog.ARCHITECTURES, arch
