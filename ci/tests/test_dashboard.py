"""The benchmark dashboard and the regression check (ci/results.py, ci/regression.py, ci/dashboard.py):
seeded regressions in synthetic runs are flagged, unchanged runs are not, unknown files are skipped, and the
dashboard built from the committed results renders and filters in headless Chromium from file://.
Run by ``nox -s dashboard`` (plotly, scipy, playwright and Debian's chromium installed there)."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="needs the dashboard's packages: nox -s dashboard")
pytest.importorskip("scipy", reason="needs the dashboard's packages: nox -s dashboard")

CI = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CI))

import dashboard  # noqa: E402
import regression  # noqa: E402
from results import load_runs  # noqa: E402

BASE = {"output_tok_per_s": 1000.0, "tpot_ms": 2.0, "ttft_ms": 20.0}


def e2e_report(scale: dict[str, float], noise: float, seed: int, repeats: int = 5, machine: float = 1.0) -> dict:
    """An atom_tools.e2e.vllm report: one model, batches 1 and 64, ``repeats`` samples per metric with relative
    noise ``noise``; ATOM's metrics multiplied by ``scale`` (vLLM's never), both engines' throughput by ``machine``
    (a faster or slower machine of the same GPU: latencies divided by it)."""
    rng = random.Random(seed)

    def stats(value: float) -> dict:
        samples = [value * (1 + rng.gauss(0, noise)) for _ in range(repeats)]
        return {"median": sorted(samples)[repeats // 2], "min": min(samples), "max": max(samples), "samples": samples}

    impls = {impl: {"startup_s": 60.0, "batches": {str(b): {m: stats(v * b ** (m == "output_tok_per_s")
                                                                      * (scale.get(m, 1.0) if impl == "atom" else 1.0)
                                                                      * (machine if m == "output_tok_per_s" else 1 / machine))
                                                              for m, v in BASE.items()} for b in (1, 64)}}
             for impl in ("vllm", "atom")}
    return {"gpu": "NVIDIA H200", "date": "2026-12-04T00:00+00:00", "vllm": "0.26.0", "torch": "2.11.0",
            "settings": {"prompt_len": 512, "output_len": 128, "repeats": repeats, "max_num_batched_tokens": 8192},
            "models": [{"model": "qwen3-8b", "arch": "Qwen3ForCausalLM", "layers": 8, "format": "bf16", "impls": impls}]}


def write_runs(root: Path, new_scale: dict[str, float], noise: float = 0.01, new_noise: float | None = None,
               machine: float = 1.0, acknowledged: str | None = None) -> Path:
    (root / "2026-12-04T0100-h200").mkdir(parents=True)
    (root / "2026-12-04T0100-h200" / "e2e.json").write_text(json.dumps(e2e_report({}, noise, seed=1)))
    (root / "2026-12-04T0200-h200").mkdir()
    if acknowledged is not None:
        (root / "2026-12-04T0200-h200" / "acknowledged.toml").write_text(acknowledged)
    new = e2e_report(new_scale, noise if new_noise is None else new_noise, seed=2, machine=machine)
    (root / "2026-12-04T0200-h200" / "run.json").write_text(json.dumps({"format": "atom-run/1", "e2e": new}))
    return root


def statuses(root: Path) -> dict[str, set[str]]:
    runs = load_runs(root)
    out: dict[str, set[str]] = {}
    for v in regression.check(runs, runs[-1]):
        out.setdefault(v["status"], set()).add(v["what"])
    return out


def test_seeded_throughput_drop_is_flagged(tmp_path):
    root = write_runs(tmp_path, {"output_tok_per_s": 0.85})
    flagged = statuses(root)["regression"]
    assert {"qwen3-8b bf16 batch 1 in/out 512/128 output_tok_per_s / vllm's own",
            "qwen3-8b bf16 batch 64 in/out 512/128 output_tok_per_s / vllm's own"} == flagged
    assert regression.main(["--results", str(root)]) == 1


def test_seeded_latency_increase_is_flagged(tmp_path):
    root = write_runs(tmp_path, {"tpot_ms": 1.2, "ttft_ms": 1.0})
    assert statuses(root)["regression"] == {f"qwen3-8b bf16 batch {b} in/out 512/128 tpot_ms / vllm's own"
                                            for b in (1, 64)}


def test_unchanged_run_is_not_flagged(tmp_path):
    root = write_runs(tmp_path, {})
    found = statuses(root)
    assert "regression" not in found and "unconfirmed" not in found and len(found["ok"]) == 6
    assert regression.main(["--results", str(root)]) == 0


def test_another_machine_of_the_same_gpu_is_not_a_regression(tmp_path):
    """Both classes 30% slower on the new run's machine: ATOM over the host's own class is unchanged."""
    root = write_runs(tmp_path, {}, machine=0.7)
    found = statuses(root)
    assert "regression" not in found and "unconfirmed" not in found and len(found["ok"]) == 6
    assert all(what.endswith("/ vllm's own") for what in found["ok"])


def test_only_atom_slower_on_another_machine_is_flagged(tmp_path):
    root = write_runs(tmp_path, {"output_tok_per_s": 0.8}, machine=1.3)
    assert statuses(root)["regression"] == {f"qwen3-8b bf16 batch {b} in/out 512/128 output_tok_per_s / vllm's own"
                                            for b in (1, 64)}


def test_acknowledged_regressions_pass_with_their_reason_and_stale_entries_fail(tmp_path, capsys):
    entry = '[[acknowledged]]\nwhat = "qwen3-8b bf16 batch * output_tok_per_s / vllm\'s own"\nwhy = "looked at: X"\n'
    root = write_runs(tmp_path / "a", {"output_tok_per_s": 0.85}, acknowledged=entry)
    found = statuses(root)
    assert "regression" not in found and len(found["acknowledged"]) == 2
    assert regression.main(["--results", str(root)]) == 0
    assert "looked at: X" in capsys.readouterr().out
    stale = write_runs(tmp_path / "b", {}, acknowledged=entry)  # nothing regressed: the entry explains nothing
    assert statuses(stale)["regression"] == {"acknowledged.toml entry \"qwen3-8b bf16 batch * output_tok_per_s / "
                                             "vllm's own\""}
    assert regression.main(["--results", str(stale)]) == 1


def test_change_within_threshold_is_not_flagged(tmp_path):
    """A real but small drop (3% < 5%), measured precisely: not a regression."""
    root = write_runs(tmp_path, {"output_tok_per_s": 0.97}, noise=0.002)
    assert "regression" not in statuses(root)


def test_noisy_drop_is_unconfirmed_not_failed(tmp_path):
    """Past the threshold in the medians, but the repeats are too noisy to say so at 95%."""
    root = write_runs(tmp_path, {"output_tok_per_s": 0.92}, noise=0.01, new_noise=0.15)
    found = statuses(root)
    assert "regression" not in found and "unconfirmed" in found
    assert regression.main(["--results", str(root)]) == 0


def test_kernel_slowdown_is_flagged_and_other_gpus_ignored(tmp_path):
    def kernels(us: float, gpu: str) -> dict:
        rng = random.Random(us)
        rows = [{"op": "silu_and_mul", "impl": impl, "tokens": 8192, "us": us * f, "floor_us": 10.0,
                 "samples_us": [us * f * (1 + rng.gauss(0, 0.005)) for _ in range(30)]}
                for impl, f in (("atom-triton", 1.0), ("torch-eager", 3.0))]
        return {"context": {"gpu": gpu}, "suites": {"dense": rows}}

    for name, us in (("2026-12-04T0100-h200", 20.0), ("2026-12-04T0130-b200", 10.0), ("2026-12-04T0200-h200", 25.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "kernels.json").write_text(json.dumps(kernels(us, name.split("-")[-1])))
    runs = load_runs(tmp_path)
    (verdict,) = regression.check(runs, runs[-1])  # ATOM's row only, against the h200 run, not the b200 one
    assert verdict["status"] == "regression" and verdict["against"] == "2026-12-04T0100-h200"


def test_failed_accuracy_gate_is_a_regression(tmp_path):
    (tmp_path / "2026-12-04T0100-cpu").mkdir()
    models = [{"model": "smollm2", "passed": False, "summary": "smollm2: |Δ log ppl| 3e-2 > bound 1e-2"}]
    (tmp_path / "2026-12-04T0100-cpu" / "run.json").write_text(json.dumps({"accuracy": {"models": models}}))
    assert regression.main(["--results", str(tmp_path)]) == 1


def test_unknown_layouts_are_skipped_with_a_reason(tmp_path):
    run = tmp_path / "2026-12-04T0100-h200"
    run.mkdir()
    (run / "list.json").write_text("[1, 2]")
    (run / "broken.json").write_text("{")
    (run / "other.json").write_text(json.dumps({"rows": [{"us": 1.0}]}))
    (run / "notes.md").write_text("# notes")
    (tmp_path / "not-a-run.json").write_text("{}")
    (r,) = load_runs(tmp_path)
    assert not r.e2e and not r.kernels and len(r.skipped) == 3
    assert any("broken.json: not readable JSON" in s for s in r.skipped)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The dashboard of the committed results, plus a synthetic run so a chart of each kind exists."""
    results = tmp_path_factory.mktemp("results")
    shutil.copytree(CI.parent / "bench" / "results", results, dirs_exist_ok=True)
    write_runs(results / "synthetic", {"output_tok_per_s": 0.9})
    for run in (results / "synthetic").iterdir():
        run.rename(results / run.name)
    (results / "synthetic").rmdir()
    return dashboard.build(tmp_path_factory.mktemp("dashboard"), results)


def test_dashboard_is_self_contained(built):
    text = built.read_text()
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://cdn" not in text
    assert (built.parent / "plotly.min.js").stat().st_size > 1_000_000
    assert text.count('data-kind="e2e"') >= 1 and text.count('data-kind="kernel"') >= 1


def test_dashboard_renders_and_filters_in_chromium(built):
    """From file://, offline: charts are drawn, the model filter hides the other models' charts, the batch filter
    hides the other batches' traces; screenshots go to $ATOM_ARTIFACTS_DIR (CI keeps them)."""
    pytest.importorskip("playwright", reason="needs playwright: nox -s dashboard")
    if not Path(dashboard.CHROMIUM).is_file():
        pytest.fail(f"no Chromium at {dashboard.CHROMIUM}: apt-get install -y chromium (nox -s dashboard does)")
    artifacts = Path(os.environ.get("ATOM_ARTIFACTS_DIR", built.parent))
    artifacts.mkdir(parents=True, exist_ok=True)
    with dashboard.browser_page(built) as page:
        errors = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        total = page.locator("section.card").count()
        drawn = page.locator("section.card[data-drawn] .main-svg").count()
        assert drawn >= 1 and page.locator("section.card[data-drawn] .scatterlayer .trace").count() >= 1
        assert page.inner_text("#shown") == f"{total} charts shown"
        page.screenshot(path=str(artifacts / "dashboard.png"))
        page.locator("section.card").first.screenshot(path=str(artifacts / "dashboard-chart.png"))

        page.select_option("#filter-model", "qwen3-8b")
        shown = page.locator("section.card:visible")
        assert 1 <= shown.count() < total
        assert {shown.nth(i).get_attribute("data-model") for i in range(shown.count())} == {"qwen3-8b"}
        page.select_option("#filter-batch", "64")
        page.wait_for_function("document.querySelector('section.card:not([style*=none])[data-drawn]') !== null")
        batches = page.evaluate("""() => [...document.querySelectorAll('section.card[data-drawn]')]
            .filter((c) => c.style.display !== 'none')
            .flatMap((c) => c.querySelector('div.plot').data.filter((t) => t.visible === true).map((t) => t.meta.batch))""")
        assert batches and set(batches) == {64}
        page.screenshot(path=str(artifacts / "dashboard-filtered.png"))
        assert not errors, errors
