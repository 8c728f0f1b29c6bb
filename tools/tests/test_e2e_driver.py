"""The end-to-end driver both hosts' benches share (atom_tools.e2e.driver): its command line refuses bad input
before any work, and its run gives every model, format and given checkpoint one report entry, rewriting the report
as entries grow and keeping one model's checkpoints on disk at a time.  No host and no GPU: checkpoints and the
host's comparison are stand-ins."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys

import pytest

from atom_tools.e2e import driver


def parse(argv: list[str]):
    return driver.parse(driver.parser("bench", "", "host,atom"), argv, {"host": {}, "atom": {}})


@pytest.mark.parametrize("argv, message", [
    (["--models", "qwen3-9b"], "unknown model, implementation or format: qwen3-9b"),
    (["--impls", "host,vllm"], "unknown model, implementation or format: vllm"),
    (["--formats", "bf16,int3"], "unknown model, implementation or format: int3"),
    (["--checkpoint", "/some/dir"], "--checkpoint: /some/dir is not NAME=DIR"),
    (["--checkpoint", "smol=/nonexistent"], "--checkpoint: no config.json in /nonexistent"),
])
def test_bad_arguments_are_refused_naming_the_cause(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse([*argv, "--out", "unused.json"])
    assert message in capsys.readouterr().err


def test_run_fills_one_entry_per_checkpoint_and_saves_as_it_goes(tmp_path, monkeypatch):
    written = []

    def fake_checkpoints(name, layers, formats, workdir):
        for fmt in formats:
            out = workdir / fmt
            out.mkdir(parents=True)
            (out / "config.json").write_text(json.dumps({"vocab_size": 100}))
            written.append((name, layers, fmt))
            yield fmt, out

    monkeypatch.setattr(driver, "model_checkpoints", fake_checkpoints)
    given = tmp_path / "given"
    given.mkdir()
    (given / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 3,
                                                   "vocab_size": 100}))
    out = tmp_path / "report.json"
    args = parse(["--models", "qwen3-8b,llama3-8b", "--formats", "bf16,fp8-block", "--layers", "2",
                  "--checkpoint", f"mine={given}", "--workdir", str(tmp_path / "new" / "work"), "--out", str(out)])
    report = driver.new_report(args, "cpu", {"host": "1.0"}, {"dtype": "bfloat16"})
    seen = []

    def compare(entry, model_dir, prompts, save):
        assert model_dir.is_dir() and prompts and max(max(p) for p in prompts) < 100
        if entry["model"] != "mine":  # --workdir is made when missing; the checkpoints go in a directory inside
            assert tmp_path / "new" / "work" in model_dir.parents
        if entry["model"] == "llama3-8b":  # the previous model's checkpoints are gone
            assert not (model_dir.parents[1] / "qwen3-8b").exists()
        entry["measured"] = True
        save()
        seen.append(json.loads(out.read_text())["models"][-1])

    driver.run(args, report, compare, given_format="given")
    assert written == [("qwen3-8b", 2, "bf16"), ("qwen3-8b", 2, "fp8-block"), ("llama3-8b", 2, "bf16"),
                       ("llama3-8b", 2, "fp8-block")]
    assert [(e["model"], e["format"], e["layers"]) for e in report["models"]] == [
        ("qwen3-8b", "bf16", 2), ("qwen3-8b", "fp8-block", 2), ("llama3-8b", "bf16", 2), ("llama3-8b", "fp8-block", 2),
        ("mine", "given", 3)]
    assert all(e["measured"] for e in seen) and len(seen) == 5
    saved = json.loads(out.read_text())
    assert saved["host"] == "1.0" and saved["settings"]["repeats"] == 5 and len(saved["models"]) == 5


def test_kept_checkpoints_are_reused_only_when_finished(tmp_path):
    calls = []

    def write(directory):
        def go():
            calls.append(directory.name)
            directory.mkdir(parents=True)
            (directory / "config.json").write_text("{}")
            return directory
        return go

    first = driver.kept(tmp_path / "bf16", write(tmp_path / "bf16"))
    assert (first / driver.COMPLETE).is_file() and calls == ["bf16"]
    assert driver.kept(tmp_path / "bf16", write(tmp_path / "bf16")) == first and calls == ["bf16"]  # reused
    partial = tmp_path / "fp8-block"  # a run cut off while writing: no marker, so it is written again from scratch
    partial.mkdir()
    (partial / "model-00001.safetensors").write_text("half")
    driver.kept(partial, write(partial))
    assert calls == ["bf16", "fp8-block"] and not (partial / "model-00001.safetensors").exists()


def test_keep_checkpoints_leaves_them_in_the_workdir(tmp_path, monkeypatch):
    def fake_checkpoints(name, layers, formats, workdir):
        for fmt in formats:
            yield fmt, driver.kept(workdir / fmt, functools.partial(_config_dir, workdir / fmt))

    monkeypatch.setattr(driver, "model_checkpoints", fake_checkpoints)
    work = tmp_path / "work"
    args = parse(["--models", "qwen3-8b", "--formats", "bf16", "--layers", "2", "--workdir", str(work),
                  "--keep-checkpoints", "--out", str(tmp_path / "r.json")])
    driver.run(args, driver.new_report(args, "cpu", {}, {}), lambda entry, d, p, save: save(), given_format="given")
    assert (work / "checkpoints" / "qwen3-8b-2" / "bf16" / driver.COMPLETE).is_file()
    with pytest.raises(SystemExit):
        parse(["--keep-checkpoints", "--out", "unused.json"])  # without --workdir


def _config_dir(directory):
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"vocab_size": 100}))
    return directory


def test_a_run_stopped_by_sigterm_leaves_no_checkpoint_behind(tmp_path):
    """`timeout` sends SIGTERM: the temporary checkpoints go with the run."""
    work = tmp_path / "work"
    script = f"""
import json, sys, time
from pathlib import Path
from atom_tools.e2e import driver
def fake(name, layers, formats, workdir):
    (workdir / "bf16").mkdir(parents=True)
    (workdir / "bf16" / "config.json").write_text(json.dumps({{"vocab_size": 100}}))
    yield "bf16", workdir / "bf16"
def compare(entry, model_dir, prompts, save):
    print("measuring", flush=True)
    time.sleep(60)
driver.model_checkpoints = fake
args = driver.parse(driver.parser("t", "", "a"), ["--models", "qwen3-8b", "--workdir", {str(work)!r},
                    "--out", {str(tmp_path / "r.json")!r}], {{"a": None}})
driver.run(args, driver.new_report(args, "cpu", {{}}, {{}}), compare, "given")
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.stdout.readline().strip() == "measuring"
    assert list(work.glob("*/qwen3-8b/bf16"))  # the checkpoint is there while the run measures
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert list(work.iterdir()) == []


def test_machine_reads_nvidia_smi_and_survives_its_absence(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: the CPU facts only
    assert set(driver.machine()) == {"cpu", "cpus"}
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '580.159.04, 1980 MHz, 1755 MHz, 700.00 W'\n")
    smi.chmod(0o755)
    facts = driver.machine()
    assert (facts["driver_version"], facts["clocks.max.sm"], facts["clocks.sm"], facts["power.limit"]) == (
        "580.159.04", "1980 MHz", "1755 MHz", "700.00 W")
    assert facts["cpus"] >= 1 and facts["cpu"]
