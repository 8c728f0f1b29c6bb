"""SGLang's own serving loop on the CPU around ATOM's class: the offline ``sglang.Engine`` (its tokenizer
manager, a scheduler process with its ModelRunner, radix cache and chunked prefill, the detokenizer) with the
torch-native attention backend, greedy, against transformers.

Each run is a fresh interpreter (the engine spawns its processes) with ``SGLANG_EXTERNAL_MODEL_PACKAGE`` set as
a user sets it; SGLang's logging config (``SGLANG_LOGGING_CONFIG_PATH``) sends atom-sglang's log lines of every
process to a file, where the scheduler's model build must name ATOM's class. Requests go in as token ids
(``skip_tokenizer_init``: the tiny checkpoints have no tokenizer). What this leaves out: SGLang's HTTP server,
CUDA graphs and GPU backends (no GPU here)."""

from __future__ import annotations

import json

import pytest
import torch
from _sglang_env import run_fresh

from atom_core import catalog

pytestmark = pytest.mark.sglang

# a dense and a MoE model; the longest prompt is prefilled in three chunks by the scheduler
ARCHS = ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM"]
PROMPTS = [[5, 17, 99, 3, 200, 41, 7], [11, 300], list(range(40, 90))]
CHUNK = 16
NEW_TOKENS = 4

ENGINE = """
import json, sys
import sglang

path, prompts, new_tokens, chunk = json.loads(%r)
engine = sglang.Engine(model_path=path, device="cpu", dtype="float32", attention_backend="torch_native",
                       sampling_backend="pytorch", skip_tokenizer_init=True, disable_cuda_graph=True,
                       chunked_prefill_size=chunk, max_total_tokens=1024, random_seed=0, log_level="error")
try:
    outputs = engine.generate(input_ids=prompts,
                              sampling_params={"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True})
finally:
    engine.shutdown()
print(json.dumps([out["output_ids"] for out in outputs]))
"""


@torch.inference_mode()
def transformers_greedy(arch: str, path: str) -> list[list[int]]:
    hf = catalog.get(arch).hf_model_class().from_pretrained(path, dtype=torch.float32).eval()
    return [hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                        pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]


@pytest.mark.parametrize("arch", ARCHS)
def test_sglang_engine_serves_atoms_class_greedy_as_transformers(arch, tiny_checkpoints, tmp_path, monkeypatch):
    if arch not in tiny_checkpoints:
        pytest.skip(f"atom-sglang does not serve {arch}")
    path = tiny_checkpoints[arch]
    log = tmp_path / "atom_sglang.log"
    config = {"version": 1, "disable_existing_loggers": False,
              "formatters": {"plain": {"format": "%(process)d %(message)s"}},
              "handlers": {"file": {"class": "logging.FileHandler", "filename": str(log), "formatter": "plain"}},
              "loggers": {"atom_sglang": {"handlers": ["file"], "level": "INFO"}}}
    (tmp_path / "logging.json").write_text(json.dumps(config))
    monkeypatch.setenv("SGLANG_LOGGING_CONFIG_PATH", str(tmp_path / "logging.json"))
    outputs = run_fresh(ENGINE % json.dumps([path, PROMPTS, NEW_TOKENS, CHUNK]))
    built = [line for line in log.read_text().splitlines() if "SGLang builds" in line]
    assert built and all(f"builds {arch} on ATOM's {catalog.get(arch).model}" in line for line in built), built
    assert outputs == transformers_greedy(arch, path)
