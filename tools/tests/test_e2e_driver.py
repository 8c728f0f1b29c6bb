"""The end-to-end driver both hosts' benches share (atom_tools.e2e.driver): its command line refuses bad input
before any work, and its run gives every model, format and given checkpoint one report entry, rewriting the report
as entries grow and keeping one model's checkpoints on disk at a time.  No host and no GPU: checkpoints and the
host's comparison are stand-ins."""

from __future__ import annotations

import json

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
