"""End to end inside SGLang's HTTP server: ATOM's model classes against SGLang's own, same checkpoint.

``python -m atom_tools.e2e.sglang --models qwen3-8b,qwen3-30b-a3b --out sglang-e2e.json``
(on the air-gapped GPU machine: ``bash ci/gpu_sglang.sh -m atom_tools.e2e.sglang --models qwen3-8b --out X.json``)

For each model a random-weight checkpoint of the real shape (few layers, :data:`atom_tools.e2e.driver.MODELS`) is written
once in bf16 and in each other format of ``--formats``; ``--checkpoint NAME=DIR`` adds a checkpoint as it is.  Then
one ``python -m sglang.launch_server`` process per implementation serves it: ``sglang`` with SGLang's own classes,
``atom`` with ``SGLANG_EXTERNAL_MODEL_PACKAGE=atom_sglang.models`` and ``ATOM_TAKE_OVER=all`` (ATOM's class even
where atom_core.takeover would keep SGLang's) in that server's environment only.  The servers
are alive together, each started on a free port once the one before it answers ``/health``, each with an equal
share of the GPU memory free when the first starts (SGLang measures ``--mem-fraction-static`` against the memory
free when that server starts, so the n-th of them gets ``share / (1 - n * share)``), and they take turns: every
timed run of one is next to the same run of the other, the order swapped every repeat.

* served by: each server's stdout and stderr go to a log file; the ``atom`` server's log must hold atom-sglang's
  "atom-sglang: SGLang builds <arch> on ATOM's <class>" line (recorded as ``module``), the ``sglang`` server's
  must not;
* agreement: a fixed prompt set as token ids through ``/generate``, greedy, ``AGREEMENT_TOKENS`` tokens, with the
  log-probabilities of prompt and output tokens (``return_logprob``, ``logprob_start_len=0``);
* speed, per batch size: ``repeats`` runs of ``batch`` concurrent streamed ``/generate`` requests of random prompts
  (fresh ones every run, so the radix cache never hits; the same ones for every implementation), ``output_len``
  tokens each (``ignore_eos``).  A token's arrival is the time its chunk of the stream is read: TTFT is the first
  token's arrival after the request was sent, TPOT the time from the first token to the last over the tokens after
  the first; output tokens/s = batch * output_len / (last arrival of the run - first request sent).  Per run the
  median TTFT and TPOT over its requests; per batch size median, min and max over the runs;
* start-up: from ``launch_server``'s start to the first 200 of ``/health`` (weights, CUDA graphs, warm-up);
* optionally (``--profile``) GPU kernel time per kernel name over one run of the first batch size
  (``--profile-prompt-len`` / ``--profile-output-len``), from SGLang's torch profiler (``/start_profile``,
  ``/stop_profile``; :func:`atom_tools.e2e.profile.kernel_table`), beside that run's wall time.

Default server arguments on a GPU: ``--attention-backend triton --sampling-backend pytorch`` (the offline bundle
has neither FA3 nor FlashInfer), SGLang's CUDA graphs; hybrid GDN models also ``--mamba-radix-cache-strategy
no_buffer --disable-overlap-schedule`` (what atom-sglang serves; SGLang's own class gets the same).
``--server-args "..."`` is appended last, so it overrides them (e.g. ``--device cpu --attention-backend torch_native`` on a CPU).

``--attention-backends default,atom`` runs each implementation once per SGLang attention backend
(``--attention-backend``; ``default`` keeps the one above, ``atom`` is ATOM's paged-attention backend,
:mod:`atom_sglang.attention_backend`, registered by atom-sglang's plugin whichever class serves): the servers are then
named ``IMPL@BACKEND`` (``IMPL`` alone for ``default``), and each one's greedy agreement is also stated against the
first server.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from atom_core import catalog
from atom_tools.e2e import driver
from atom_tools.e2e.driver import AGREEMENT_TOKENS, checkpoint_prompt_vocab, compare_agreement, random_prompts, spread
from atom_tools.e2e.profile import profiled_record, summary_lines

EXTERNAL_PACKAGE = "SGLANG_EXTERNAL_MODEL_PACKAGE"
IMPLS: dict[str, dict[str, str]] = {"sglang": {}, "atom": {EXTERNAL_PACKAGE: "atom_sglang.models", "ATOM_TAKE_OVER": "all"}}
SERVED_BY = "atom-sglang: SGLang builds "  # atom_sglang.wrapper's log line when SGLang builds an ATOM class
DEFAULT_SERVER_ARGS = "--attention-backend triton --sampling-backend pytorch"
# server_args.py of SGLang 0.5.17-0.5.23: the no_buffer strategy asserts the overlap scheduler is off (on a GPU it is
# on by default; a CPU server turns it off itself)
HYBRID_SERVER_ARGS = ["--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"]


# ---- requests and their streams (no server needed to test these) --------------------------------------------
def generate_payload(prompts: list[int] | list[list[int]], max_new_tokens: int, *, stream: bool = False,
                     logprobs: bool = False) -> dict:
    """A ``/generate`` request of token-id prompts (one, or a list of them), greedy, ``ignore_eos``."""
    payload = {"input_ids": prompts, "stream": stream,
               "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}
    if logprobs:
        payload.update(return_logprob=True, logprob_start_len=0)
    return payload


def stream_arrivals(lines: Iterable[bytes], clock: Callable[[], float] = time.perf_counter) -> list[tuple[float, int]]:
    """``(time, tokens so far)`` for each chunk of a streamed ``/generate`` response that brought new tokens.
    SGLang writes ``data: {json}`` events whose ``meta_info.completion_tokens`` counts the tokens so far (one chunk
    may bring several), then ``data: [DONE]``; an ``error`` event raises."""
    arrivals: list[tuple[float, int]] = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        if line.startswith(b"data:"):
            line = line[5:].strip()
        if line == b"[DONE]":
            break
        event = json.loads(line)
        if "error" in event:
            raise RuntimeError(f"SGLang answered a streamed request with an error: {event['error']}")
        count = event["meta_info"]["completion_tokens"]
        if count > (arrivals[-1][1] if arrivals else 0):
            arrivals.append((clock(), count))
    return arrivals


def request_timing(sent: float, arrivals: list[tuple[float, int]]) -> dict:
    """TTFT (first arrival - ``sent``), TPOT (first to last arrival over the tokens after the first chunk's) and the
    token count of one streamed request."""
    if not arrivals:
        raise RuntimeError("a streamed request ended without a token")
    (first, first_count), (last, count) = arrivals[0], arrivals[-1]
    tpot = (last - first) / (count - first_count) if count > first_count else None
    return {"ttft_s": first - sent, "tpot_s": tpot, "tokens": count, "end": last}


def run_metrics(timings: list[dict], sent: float, batch: int, output_len: int) -> dict:
    """One timed run of ``batch`` concurrent requests: output tok/s over its wall time, median TTFT and TPOT (ms)."""
    short = [t["tokens"] for t in timings if t["tokens"] != output_len]
    if len(timings) != batch or short:
        raise RuntimeError(f"a run of {batch} requests of {output_len} tokens got {len(timings)} answers, "
                           f"token counts {short or 'as asked'}")
    wall = max(t["end"] for t in timings) - sent
    tpots = [t["tpot_s"] for t in timings if t["tpot_s"] is not None]
    return {"tok_per_s": batch * output_len / wall, "ttft_ms": statistics.median(t["ttft_s"] for t in timings) * 1e3,
            "tpot_ms": statistics.median(tpots) * 1e3 if tpots else None}


def summarize(runs: list[dict]) -> dict:
    """The runs of one batch size: median, min, max and samples of each run's tok/s, median TPOT and median TTFT."""
    tpot = [r["tpot_ms"] for r in runs if r["tpot_ms"] is not None]
    return {"output_tok_per_s": spread([r["tok_per_s"] for r in runs]), "tpot_ms": spread(tpot) if tpot else None,
            "ttft_ms": spread([r["ttft_ms"] for r in runs])}


def agreement_record(prompt: list[int], answer: dict) -> dict:
    """A non-streamed ``/generate`` answer with log-probabilities, as :func:`atom_tools.e2e.driver.compare_agreement` takes
    it: the greedy tokens, their log-probabilities and those of prompt tokens 1.. (SGLang gives the first prompt
    token none)."""
    meta = answer["meta_info"]
    prompt_lp = [entry[0] for entry in meta["input_token_logprobs"]]
    while prompt_lp and prompt_lp[0] is None:
        prompt_lp.pop(0)
    if len(prompt_lp) != len(prompt) - 1:
        raise RuntimeError(f"SGLang gave {len(prompt_lp)} prompt log-probabilities for a prompt of {len(prompt)} tokens")
    return {"tokens": list(answer["output_ids"]), "logprobs": [entry[0] for entry in meta["output_token_logprobs"]],
            "prompt_logprobs": prompt_lp}


def served_by(log_text: str, impl: str) -> str:
    """Which class the server built, from its log: ATOM's (its "builds ... on ATOM's" line, which the ``atom``
    server must have) or SGLang's own (the ``sglang`` server's log must have no such line)."""
    built = [line[line.index(SERVED_BY) + len(SERVED_BY):].strip() for line in log_text.splitlines()
             if SERVED_BY in line]
    if impl == "atom":
        if not built:
            raise RuntimeError(f"the atom server's log has no '{SERVED_BY}...' line: SGLang did not build ATOM's class")
        return built[0].split(" on ATOM's ", 1)[-1]
    if built:
        raise RuntimeError(f"the {impl} server built ATOM's class ({built[0]}): {EXTERNAL_PACKAGE} leaked into it")
    return "SGLang's own class"


def server_args(model_dir: Path, arch: str, dtype: str, mem_fraction: float, extra: str) -> list[str]:
    """``launch_server``'s arguments apart from host and port: the checkpoint as token ids only (a random
    checkpoint has no real tokenizer), the defaults, a hybrid model's, then ``extra`` (last: it overrides)."""
    args = ["--model-path", str(model_dir), "--skip-tokenizer-init", "--dtype", dtype, "--random-seed", "0",
            "--mem-fraction-static", f"{mem_fraction:.4f}", *shlex.split(DEFAULT_SERVER_ARGS)]
    if catalog.HYBRID in catalog.get(arch).capabilities:
        args += HYBRID_SERVER_ARGS
    return args + shlex.split(extra)


def mem_fractions(share: float, count: int) -> list[float]:
    """Each server's ``--mem-fraction-static`` for an equal ``share`` of the memory free before the first starts:
    SGLang takes the fraction of the memory free when that server starts, after the ones before it took theirs."""
    return [share / (1 - i * share) for i in range(count)]


# ---- one server ----------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``sglang.launch_server`` subprocess (its own process group) with the implementation's environment."""

    def __init__(self, impl: str, args: list[str], log_path: Path, start_timeout: float):
        self.impl, self.port, self.log_path = impl, free_port(), log_path
        base = impl.partition("@")[0]  # IMPL@BACKEND: the backend is a server argument
        env = {k: v for k, v in os.environ.items() if k != EXTERNAL_PACKAGE}
        env.update(IMPLS[base])
        command = [sys.executable, "-m", "sglang.launch_server", *args, "--host", "127.0.0.1", "--port", str(self.port)]
        self.command = command
        began = time.perf_counter()
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_healthy(began + start_timeout)
            self.startup_s = time.perf_counter() - began
            self.module = served_by(log_path.read_text(errors="replace"), base)
        except BaseException:
            self.close()
            raise

    def _wait_healthy(self, deadline: float) -> None:
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the {self.impl} server exited with code {self.process.returncode}:\n{self.log_tail()}")
            if time.perf_counter() > deadline:
                raise RuntimeError(f"the {self.impl} server did not answer /health in time:\n{self.log_tail()}")
            try:
                if self.request("GET", "/health", timeout=10)[0] == 200:
                    return
            except (OSError, http.client.HTTPException):  # not listening yet
                pass
            time.sleep(1)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = 3600):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            return response.status, (json.loads(data) if data and response.status == 200 else data)
        finally:
            conn.close()

    def agreement(self, prompts: list[list[int]]) -> list[dict]:
        status, answers = self.request("POST", "/generate", generate_payload(prompts, AGREEMENT_TOKENS, logprobs=True))
        if status != 200:
            raise RuntimeError(f"the {self.impl} server answered the agreement prompts with {status}: {answers!r}")
        return [agreement_record(p, a) for p, a in zip(prompts, answers)]

    def _stream(self, prompt: list[int], max_new_tokens: int, start: threading.Barrier, out: list, index: int):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        try:
            body = json.dumps(generate_payload(prompt, max_new_tokens, stream=True))
            start.wait()
            sent = time.perf_counter()
            conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                raise RuntimeError(f"{response.status}: {response.read()[:500]!r}")
            out[index] = request_timing(sent, stream_arrivals(iter(response.readline, b"")))
        except BaseException as e:  # reported by timed_run
            out[index] = e
        finally:
            conn.close()

    def timed_run(self, prompts: list[list[int]], max_new_tokens: int) -> dict:
        """All ``prompts`` sent at once, one streamed request (and thread) each: :func:`run_metrics`."""
        out: list = [None] * len(prompts)
        start = threading.Barrier(len(prompts) + 1)
        threads = [threading.Thread(target=self._stream, args=(p, max_new_tokens, start, out, i), daemon=True)
                   for i, p in enumerate(prompts)]
        for thread in threads:
            thread.start()
        sent = time.perf_counter()
        start.wait()
        for thread in threads:
            thread.join()
        failed = [o for o in out if not isinstance(o, dict)]
        if failed:
            raise RuntimeError(f"the {self.impl} server failed {len(failed)} of {len(prompts)} requests: {failed[0]!r}")
        return run_metrics(out, sent, len(prompts), max_new_tokens)

    def profiled_run(self, prompts: list[list[int]], max_new_tokens: int, trace_dir: Path,
                     wait_s: float = 120) -> float:
        """One :meth:`timed_run` under SGLang's torch profiler (GPU and CPU activities, no stacks), its trace written
        into ``trace_dir``; returns the run's wall seconds."""
        trace_dir.mkdir(parents=True, exist_ok=True)
        status, answer = self.request("POST", "/start_profile", {"output_dir": str(trace_dir),
                                                                 "activities": ["CPU", "GPU"], "with_stack": False})
        if status != 200:
            raise RuntimeError(f"the {self.impl} server refused /start_profile with {status}: {answer!r}")
        began = time.perf_counter()
        self.timed_run(prompts, max_new_tokens)
        seconds = time.perf_counter() - began
        self.request("POST", "/stop_profile")
        deadline = time.perf_counter() + wait_s  # the trace may still be being written: wait until its size holds
        sizes = None
        while True:
            now = {str(f): f.stat().st_size for f in trace_dir.rglob("*.json*")}
            if now and now == sizes:
                return seconds
            if time.perf_counter() > deadline:
                raise RuntimeError(f"the {self.impl} server wrote no complete profiler trace into {trace_dir}")
            sizes = now
            time.sleep(2)

    def close(self) -> None:
        if self.process.poll() is None:
            for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
                try:
                    os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # the server's children (scheduler, detokenizer) share its process group
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# ---- the comparison ------------------------------------------------------------------------------------------
def timed_runs(servers: list[Server], batch: int, vocab: int, args: argparse.Namespace) -> dict[str, list[dict]]:
    """A warm-up run per server at this batch size, then ``repeats`` runs each of the same fresh prompts, one
    server's next to the other's, the servers' order swapped every repeat."""
    runs: dict[str, list[dict]] = {s.impl: [] for s in servers}
    for server in servers:
        server.timed_run(random_prompts(vocab, batch, args.prompt_len, seed=10_000 + batch), args.output_len)
    for rep in range(args.repeats):
        prompts = random_prompts(vocab, batch, args.prompt_len, seed=100 * batch + rep)
        for server in servers if rep % 2 == 0 else servers[::-1]:
            runs[server.impl].append(server.timed_run(prompts, args.output_len))
    return runs


def compare(entry: dict, model_dir: Path, impls: list[str], batches: list[int], args: argparse.Namespace,
            prompts: list[list[int]], save, start_server=Server) -> dict:
    """Start one server per implementation on ``model_dir``, all alive at once, and time them against each other;
    ``entry`` gains per-implementation results and the agreement of ATOM's with SGLang's.  ``save()`` is called
    each time ``entry`` grows (a server up, agreement, a batch size timed), so a run cut short keeps what it
    measured."""
    servers: list[Server] = []
    entry["impls"] = {}
    label = f"{entry['model']}-{entry['format']}".replace("/", "_")
    try:
        for impl, fraction in zip(impls, mem_fractions(args.mem_fraction_static, len(impls))):
            command = server_args(model_dir, entry["arch"], args.dtype, fraction, args.server_args)
            backend = impl.partition("@")[2]
            command += ["--attention-backend", backend] if backend else []
            server = start_server(impl, command, Path(args.log_dir) / f"{label}-{impl}.log", args.start_timeout)
            servers.append(server)
            entry["impls"][impl] = {"module": server.module, "startup_s": round(server.startup_s, 1),
                                    "mem_fraction_static": round(fraction, 4), "server_args": command,
                                    "log": str(server.log_path), "batches": {}}
            save()
        agreement = {s.impl: s.agreement(prompts) for s in servers}
        if "sglang" in agreement and "atom" in agreement:
            entry["agreement"] = compare_agreement(agreement["sglang"], agreement["atom"])
        first = impls[0]
        others = [i for i in impls[1:] if {first, i} != {"sglang", "atom"}]
        if others:
            entry["agreement_with_first"] = {i: compare_agreement(agreement[first], agreement[i]) for i in others}
        save()
        vocab = checkpoint_prompt_vocab(model_dir)
        for batch in batches:
            for impl, runs in timed_runs(servers, batch, vocab, args).items():
                entry["impls"][impl]["batches"][str(batch)] = summarize(runs)
            save()
        if args.profile:
            prompts = random_prompts(vocab, batches[0], args.profile_prompt_len, seed=7)
            traces = Path(args.traces_out) if args.traces_out else Path(tempfile.mkdtemp(prefix="sglang-traces-"))
            for server in servers:
                trace_dir = traces / f"profile-{label}-{server.impl}"
                seconds = server.profiled_run(prompts, args.profile_output_len, trace_dir)
                entry["impls"][server.impl]["kernels"] = profiled_record(
                    batches[0], args.profile_prompt_len, args.profile_output_len, seconds, trace_dir)
                save()
    finally:
        for server in servers:
            server.close()
    return entry


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = driver.parser("python -m atom_tools.e2e.sglang", __doc__.split("\n\n")[0], "sglang,atom")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--server-args", default="", help="more launch_server arguments, given to every server last")
    parser.add_argument("--mem-fraction-static", type=float, default=None,
                        help="each server's share of the GPU memory free at the start (default: 0.8 split evenly)")
    parser.add_argument("--start-timeout", type=float, default=1800, help="seconds a server may take to start")
    parser.add_argument("--log-dir", default=None, help="the servers' logs (default: OUT's name + '-logs')")
    parser.add_argument("--attention-backends", default="default",
                        help="SGLang attention backends to run each implementation with, e.g. default,atom,triton")
    args = driver.parse(parser, argv, IMPLS)
    backends = [b for b in args.attention_backends.split(",") if b]
    bad = [b for b in backends if not b.replace("_", "").isalnum() or not b.islower()]
    if bad:
        parser.error(f"--attention-backends: {', '.join(bad)} is not an SGLang backend name (e.g. triton, atom)")
    args.impl_list = [i if b == "default" else f"{i}@{b}" for i in args.impl_list for b in backends]
    args.mem_fraction_static = args.mem_fraction_static or round(0.8 / len(args.impl_list), 3)
    args.log_dir = args.log_dir or str(Path(args.out).with_suffix("")) + "-logs"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from importlib.metadata import version

    import torch

    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    report = driver.new_report(args, gpu, {"sglang": version("sglang")}, {
        "dtype": args.dtype, "mem_fraction_share": args.mem_fraction_static,
        "server_args": f"{DEFAULT_SERVER_ARGS} {args.server_args}".strip(),
        "engine": "sglang.launch_server, /generate with token ids, streamed, ignore_eos",
        "protocol": "servers alive together, timed runs alternated, order swapped every repeat"})

    def compare_one(entry: dict, model_dir: Path, prompts: list[list[int]], save) -> dict:
        return compare(entry, model_dir, args.impl_list, args.batch_list, args, prompts, save)

    driver.run(args, report, compare_one, given_format="given")
    print_table(report)
    return 0


def print_table(report: dict) -> None:
    print(f"{report['gpu']}, SGLang {report['sglang']}, {report['date']}")
    print(f"{'model':28} {'batch':>5} {'server':>8} {'tok/s (min-max)':>24} {'TPOT ms':>8} {'TTFT ms':>9} {'startup':>8}")
    for entry in report["models"]:
        label = f"{entry['model']} {entry['format']}"
        for impl, result in entry.get("impls", {}).items():
            for batch, row in result["batches"].items():
                t, tpot = row["output_tok_per_s"], (row["tpot_ms"] or {}).get("median", float("nan"))
                print(f"{label:28} {batch:>5} {impl:>8} {t['median']:>10.0f} ({t['min']:.0f}-{t['max']:.0f})"
                      f"{tpot:>8.2f} {row['ttft_ms']['median']:>9.1f} {result['startup_s']:>8.1f}")
            if "kernels" in result:
                print("\n".join(summary_lines(label, impl, result["kernels"])))
        if "agreement" in entry:
            print(f"{label}: agreement {entry['agreement']}")
        impls = entry.get("impls", {})
        if {"sglang", "atom"} <= set(impls):
            ratios = [impls["atom"]["batches"][b]["output_tok_per_s"]["median"]
                      / impls["sglang"]["batches"][b]["output_tok_per_s"]["median"]
                      for b in impls["atom"]["batches"] if b in impls["sglang"]["batches"]]
            print(f"{label}: ATOM / SGLang tok/s per batch " + " / ".join(f"{r:.2f}" for r in ratios))


if __name__ == "__main__":
    # a SIGTERM (a time limit) unwinds like an exception, so compare() stops the servers it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    raise SystemExit(main())
