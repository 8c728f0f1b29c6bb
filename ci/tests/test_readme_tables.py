"""The end-to-end tables in docs/vllm.md and docs/sglang.md (ci/readme_tables.py): the newest run folder's runs (H200
or H100), older folders only for the models no newer one measured, each host's reports in its own table, and runs of
other engine sets (``IMPL@BACKEND``) in their own table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

CI = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CI))

import readme_tables  # noqa: E402


def timing(tok_per_s: float) -> dict:
    return {"output_tok_per_s": {"median": tok_per_s, "min": tok_per_s - 1, "max": tok_per_s + 1},
            "tpot_ms": {"median": 2.0}, "ttft_ms": {"median": 10.0}}


def entry(model: str, engines: dict[str, float], fmt: str = "bf16") -> dict:
    return {"model": model, "layers": 2, "format": fmt,
            "impls": {name: {"startup_s": 30.0, "batches": {"1": timing(t)}} for name, t in engines.items()}}


def report(*models: dict, host: str = "vllm") -> dict:
    return {"gpu": "NVIDIA H200", "date": "2026-12-05T04:00", host: "0.26.0", "torch": "2.11.0", "atom_commit": "abc",
            "settings": {"prompt_len": 512, "output_len": 128, "max_num_batched_tokens": 8192}, "models": list(models)}


def test_newest_folder_first_and_older_models_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(readme_tables, "RESULTS", tmp_path)
    old, new = tmp_path / "2026-12-01T1000-h200", tmp_path / "2026-12-05T0400-h100"
    old.mkdir()
    new.mkdir()
    (old / "e2e.json").write_text(json.dumps(report(entry("qwen3-8b", {"vllm": 100, "atom": 90}),
                                                    entry("llama3-8b", {"vllm": 100, "atom": 110}))))
    (new / "e2e.json").write_text(json.dumps(report(entry("qwen3-8b", {"vllm": 100, "atom": 120}))))
    (new / "kernels.json").write_text(json.dumps({"rows": []}))  # not an e2e report
    runs = readme_tables._e2e_runs("vllm")
    assert [(name, [e["model"] for e in r["models"]]) for name, r in runs] == [
        ("2026-12-05T0400-h100/e2e.json", ["qwen3-8b"]), ("2026-12-01T1000-h200/e2e.json", ["llama3-8b"])]
    table = readme_tables.e2e_table("vllm")
    assert "**1.20**" in table and "**1.10**" in table and "**0.90**" not in table


def test_other_engine_sets_get_their_own_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(readme_tables, "RESULTS", tmp_path)
    folder = tmp_path / "2026-12-05T0400-h200"
    folder.mkdir()
    backends = entry("qwen3-8b", {"atom": 200, "atom@TRITON_ATTN": 150, "atom@CUSTOM": 220})
    started = entry("deepseek-v3", {"atom": 0})
    started["impls"]["atom"]["batches"] = {}
    (folder / "e2e.json").write_text(json.dumps(report(entry("qwen3-8b", {"vllm": 100, "atom": 100}))))
    (folder / "backends.json").write_text(json.dumps(report(backends, started)))
    table = readme_tables.e2e_table("vllm")
    rows = [line for line in table.splitlines() if line.startswith("|") and "backends.json" in line]
    assert [line.split(" | ")[2] for line in rows] == ["atom", "atom@TRITON_ATTN", "atom@CUSTOM"]
    assert [line.split(" | ")[4] for line in rows] == ["1.00", "0.75", "1.10"]
    assert "deepseek-v3 (2, bf16): atom started in 30.0 s (2026-12-05T0400-h200/backends.json)" in table


def test_each_host_gets_its_own_reports(tmp_path, monkeypatch):
    monkeypatch.setattr(readme_tables, "RESULTS", tmp_path)
    folder = tmp_path / "2026-12-05T0400-h100"
    folder.mkdir()
    (folder / "vllm.json").write_text(json.dumps(report(entry("qwen3-8b", {"vllm": 100, "atom": 90}))))
    (folder / "sglang.json").write_text(json.dumps(report(entry("qwen3-8b", {"sglang": 100, "atom": 130}), host="sglang")))
    vllm, sglang = readme_tables.e2e_table("vllm"), readme_tables.e2e_table("sglang")
    assert "**0.90**" in vllm and "**1.30**" not in vllm and "vLLM's class" in vllm
    assert "**1.30**" in sglang and "**0.90**" not in sglang and "SGLang's class" in sglang and "SGLang 0.26.0" in sglang
