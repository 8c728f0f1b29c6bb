"""A host's real OpenAI-compatible server, run twice on one checkpoint (ATOM's class forced on, and the host's own
class), and the checks a user's ``openai`` client makes of it: each asks both servers the same thing and asserts
they agree (and that the answer is right on its own).

Host-neutral: atom-vllm's and atom-sglang's ``test_server.py`` start their host's server (:class:`Server`, with the
host's command line) in a module fixture named ``servers`` returning a :class:`Pair`, and import the ``test_*``
functions below, so pytest runs them against that pair.  Standard library and ``openai`` (every host requires it).

What the pair must be started with (the tests rely on it): the demo model (SmolLM2-135M-Instruct, real weights,
its chat template) served as :data:`MODEL`, float32, a chunked-prefill budget of :data:`CHUNK` tokens, a context of
at least :data:`CONTEXT` tokens, room for :data:`CONCURRENT` sequences at once, prefix caching with cached-token
counts in ``usage``, and top-:data:`TOP_LOGPROBS` log-probabilities allowed.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

MODEL = "demo"  # the served model name
CHUNK = 512
CONTEXT = 2048
CONCURRENT = 16
TOP_LOGPROBS = 5
LOGPROB_ATOL = 1e-4  # float32: ATOM and the host's own class differ in summation order only (measured: 2e-5)
QUESTION = "What is the capital of France?"
# ~1,650 tokens with SmolLM2's tokenizer: more than three chunks of CHUNK, well inside CONTEXT
LONG_PROMPT = " ".join(f"Fact {i}: the river number {i} flows into lake number {i + 1}." for i in range(88)) + \
    " Which lake does river number 7 flow into? Answer:"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process in its own process group, on a free port of 127.0.0.1, its stdout and stderr in a log
    file; ready when ``GET /health`` answers 200 (vLLM and SGLang both serve it) within ``start_timeout`` s."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log_path: Path, start_timeout: float):
        self.name, self.port, self.log_path, self.deadline = name, free_port(), log_path, start_timeout
        self.command = [part.replace("{port}", str(self.port)) for part in command]
        self.started = time.monotonic()
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(self.command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self) -> float:
        """Seconds from start to the first 200 of /health; a server that exits or overruns is an error with its log."""
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the {self.name} server exited with code {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() - self.started > self.deadline:
                raise RuntimeError(f"the {self.name} server did not answer /health in {self.deadline:.0f} s:\n"
                                   f"{self.log_tail()}")
            try:
                if self.get("/health")[0] == 200:
                    return time.monotonic() - self.started
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(1)

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def post(self, path: str, body: dict) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def client(self):
        import openai

        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", timeout=600, max_retries=0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the process group (the server's engine and worker processes too), SIGKILL after 30 s."""
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # children left behind by the parent's exit
        except (ProcessLookupError, PermissionError):
            pass


@dataclass
class Pair:
    atom: Server  # ATOM's class forced on (ATOM_TAKE_OVER=all)
    own: Server  # the host's own class (the default on this CPU)
    model_dir: Path
    cached_tokens: object  # (openai usage) -> cached prompt tokens, as the host reports them
    unseeded: str | None = None  # why the host cannot honour a request's seed here (the seeded check skips), or None

    def both(self, call):
        """``call(client)`` against both servers at once (each mostly one core's work): (ATOM's answer, own's)."""
        with ThreadPoolExecutor(2) as pool:
            atom, own = pool.map(lambda server: call(server.client()), (self.atom, self.own))
        return atom, own


def start_pair(make_server, model_dir: Path, cached_tokens, request, unseeded: str | None = None) -> Pair:
    """Both servers started at once (``make_server(impl) -> Server`` for ``atom`` and ``own``), ready; stopped when
    the module's tests are done, their logs written to stderr if a test failed."""
    servers = [make_server("atom"), make_server("own")]
    failed_before = request.session.testsfailed

    def finish():
        for server in servers:
            server.stop()
        if request.session.testsfailed > failed_before:
            for server in servers:
                sys.__stderr__.write(f"\n---- {server.name} server log ({server.log_path}), last lines ----\n"
                                     f"{server.log_tail(120)}\n")

    request.addfinalizer(finish)
    for server in servers:
        server.wait_ready()
    return Pair(*servers, model_dir=model_dir, cached_tokens=cached_tokens, unseeded=unseeded)


# ---- the checks: each a pytest test over the module's ``servers`` fixture -----------------------------------------
def greedy(client, prompt: str, max_tokens: int = 12, **kw):
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, **kw)


def test_completion_and_logprobs(servers):
    """Greedy completion with top-5 log-probabilities: the same tokens, each log-probability within LOGPROB_ATOL."""
    atom, own = servers.both(lambda c: greedy(c, "The capital of France is", logprobs=TOP_LOGPROBS))
    a, o = atom.choices[0], own.choices[0]
    assert a.text == o.text and a.text.strip(), (a.text, o.text)
    assert a.logprobs.tokens == o.logprobs.tokens
    for step, (x, y) in enumerate(zip(a.logprobs.token_logprobs, o.logprobs.token_logprobs, strict=True)):
        assert abs(x - y) <= LOGPROB_ATOL, f"step {step}: {x} vs {y}"
    for x, y in zip(a.logprobs.top_logprobs, o.logprobs.top_logprobs, strict=True):
        assert len(x) == len(y) == TOP_LOGPROBS
        for token in set(x) & set(y):
            assert abs(x[token] - y[token]) <= LOGPROB_ATOL, (token, x[token], y[token])


def test_chat_template(servers):
    """A chat completion goes through the checkpoint's chat template (the prompt token count is the template's),
    and ATOM's answer is the host's own, and right."""
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": QUESTION}]
    templated = AutoTokenizer.from_pretrained(servers.model_dir).apply_chat_template(messages, add_generation_prompt=True)
    templated = templated["input_ids"] if isinstance(templated, dict) or hasattr(templated, "keys") else templated
    atom, own = servers.both(lambda c: c.chat.completions.create(model=MODEL, messages=messages, max_tokens=16,
                                                                 temperature=0))
    assert atom.usage.prompt_tokens == own.usage.prompt_tokens == len(templated)
    assert atom.choices[0].message.content == own.choices[0].message.content
    assert "Paris" in atom.choices[0].message.content


def test_streaming(servers):
    """A streamed chat answer arrives in several chunks that add up to the answer of the same request unstreamed."""
    messages = [{"role": "user", "content": QUESTION}]

    def streamed(client):
        chunks = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                                stream=True)
        return [c.choices[0].delta.content or "" for c in chunks if c.choices]

    atom, own = servers.both(streamed)
    assert len([c for c in atom if c]) > 1, atom
    whole = servers.atom.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    assert "".join(atom) == "".join(own) == whole.choices[0].message.content


def test_seeded_sampling(servers):
    """Sampling (temperature 1, top-p 0.9, n=2) with a seed: the same request gives the same samples again, and
    ATOM's samples are the host's own."""
    if servers.unseeded:
        import pytest

        pytest.skip(servers.unseeded)

    def sample(client):
        out = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=1.0,
                                        top_p=0.9, n=2, seed=1234)
        return [c.text for c in sorted(out.choices, key=lambda c: c.index)]

    atom, own = servers.both(sample)
    assert len(atom) == 2 and atom == own, (atom, own)
    assert sample(servers.atom.client()) == atom


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
          "required": ["city", "country"], "additionalProperties": False}


def test_structured_output(servers):
    """A JSON-schema response format: valid JSON with exactly the schema's keys, the same from both classes."""
    def ask(client):
        out = client.chat.completions.create(
            model=MODEL, temperature=0, max_tokens=48,
            messages=[{"role": "user", "content": "Name the capital of France as JSON with keys city and country."}],
            response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": SCHEMA}})
        return out.choices[0].message.content

    atom, own = servers.both(ask)
    assert atom == own, (atom, own)
    assert sorted(json.loads(atom)) == ["city", "country"], atom


def test_stop_strings(servers):
    """Generation stops at a stop string (left out of the text, finish reason "stop"), as the host's own does."""
    prompt = "Count: one, two, three, four, five,"
    full = greedy(servers.atom.client(), prompt, max_tokens=16).choices[0].text
    stop = full.strip().split(" ")[1][:3]  # a piece of the second word the model writes
    atom, own = servers.both(lambda c: greedy(c, prompt, max_tokens=16, stop=[stop]))
    a = atom.choices[0]
    assert a.text == own.choices[0].text and stop not in a.text and full.startswith(a.text), (a.text, full, stop)
    assert a.finish_reason == own.choices[0].finish_reason == "stop"


def test_long_prompt_over_the_chunk_budget(servers):
    """A prompt of more than three prefill chunks: the same greedy answer, then the same prompt again hits the
    prefix cache (cached tokens reported) and answers the same."""
    atom, own = servers.both(lambda c: greedy(c, LONG_PROMPT, max_tokens=8))
    assert atom.usage.prompt_tokens == own.usage.prompt_tokens > 3 * CHUNK
    assert atom.choices[0].text == own.choices[0].text, (atom.choices[0].text, own.choices[0].text)
    again_atom, again_own = servers.both(lambda c: greedy(c, LONG_PROMPT, max_tokens=8))
    for first, again in ((atom, again_atom), (own, again_own)):
        assert again.choices[0].text == first.choices[0].text
        assert servers.cached_tokens(again.usage) >= 2 * CHUNK, again.usage


def test_concurrent_requests(servers):
    """CONCURRENT requests at once: each answer is the one the request gets alone, and the host's own."""
    prompts = [f"Question {i}: what is {i} plus {i}? Answer:" for i in range(CONCURRENT)]

    def many(client):
        with ThreadPoolExecutor(CONCURRENT) as pool:
            return list(pool.map(lambda p: greedy(client, p, max_tokens=6).choices[0].text, prompts))

    atom, own = servers.both(many)
    assert atom == own
    assert greedy(servers.atom.client(), prompts[3], max_tokens=6).choices[0].text == atom[3]


BAD_REQUESTS = {  # what a client gets wrong -> the request (to /v1/completions)
    "negative max_tokens": {"prompt": "Hi", "max_tokens": -1},
    "prompt longer than the context": {"prompt": "hello " * (2 * CONTEXT), "max_tokens": 4},
    "negative temperature": {"prompt": "Hi", "max_tokens": 4, "temperature": -1.0},
}


def test_bad_requests(servers):
    """Requests the server must refuse: 400 from both classes (the model class never sees them), and both servers
    still answer afterwards."""
    for what, body in BAD_REQUESTS.items():
        codes = [server.post("/v1/completions", {"model": MODEL, **body})[0] for server in (servers.atom, servers.own)]
        assert codes == [400, 400], f"{what}: {codes}"
    atom, own = servers.both(lambda c: greedy(c, "Hi", max_tokens=2))
    assert atom.choices[0].text == own.choices[0].text
