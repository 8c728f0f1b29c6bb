"""End to end inside vLLM on a GPU: ATOM's model classes against vLLM's own, same checkpoint, same engine.

``python -m atom_tools.e2e.vllm --models qwen3-8b,qwen3-30b-a3b --formats bf16,fp8-block --out e2e.json``

For each model a random-weight checkpoint of the real shape (few layers) is written once, in bf16 and in each
other format of ``--formats`` (``atom quantize``'s output, which both implementations load: the same bytes);
``--checkpoint NAME=DIR`` adds a real checkpoint as it is.  ``mxfp4`` is AMD Quark's dense MXFP4 for most
models; for gpt-oss it is the published gpt-oss layout (MoE experts only, ``*_blocks`` / ``*_scales``,
``quant_method: mxfp4``), the one vLLM's own gpt-oss class loads (:mod:`atom_core.quant.native_layouts`).
Then, for each model and format, one engine process per implementation runs ``LLM.generate`` with vLLM's
defaults (CUDA graphs, torch.compile, chunked prefill, prefix caching) and ``max_num_batched_tokens``.  The
engines are alive together, each with an equal share of GPU memory, and take turns: every timed run of one is
next to the same run of the other, so the machine's drift over minutes (clocks, neighbours) cannot favour the
implementation that ran first.

* agreement: greedy tokens and the log-probabilities of prompt and output tokens on a fixed prompt set;
* speed, per batch size: ``repeats`` runs of ``batch`` random prompts (fresh ones every run, so the prefix
  cache never hits; the same ones for every implementation), each timed with 1 output token (TTFT: the
  batch's prefill) and with ``output_len`` tokens (``ignore_eos``): output tokens/s = batch * output_len /
  time, TPOT = (time - TTFT) / (output_len - 1);
* start-up: ``LLM(...)`` construction (weights, profiling, compilation, CUDA-graph capture);
* optionally (``--profile``) GPU kernel time per kernel name, from vLLM's torch profiler, over one run of the
  first batch size (``--profile-prompt-len`` 32 / ``--profile-output-len`` 64 by default: mostly decode steps;
  a long prompt and one output token profile prefill), beside that run's wall time and its count of
  CUDA-graph and kernel launches from the host (GPU idle time and eager launches show as a gap between the two).

The implementation is chosen with atom-vllm's own switches (``ATOM_DISABLE_VLLM_PLUGIN=1`` gives vLLM's
classes, ``ATOM_TAKE_OVER=all`` ATOM's whatever atom_core.takeover's table says); the engine's module is recorded so a row
cannot silently measure the wrong one.

``--attention-backends default,FLASH_ATTN,TRITON_ATTN,CUSTOM`` runs each implementation once per vLLM attention
backend (``--attention-backend``; ``default`` is vLLM's own choice, ``CUSTOM`` ATOM's paged-attention backend,
:mod:`atom_vllm.attention_backend`): the engines are then named ``IMPL@BACKEND`` (``IMPL`` alone for ``default``),
each records the backends its attention layers were built with, and agreement and the speed ratios are stated
against the first engine.  ATOM's backend is registered by ATOM's plugin, so ``vllm@CUSTOM`` is not a combination.

``--speculative N`` runs each engine a second time drafting ``N`` tokens with the model's own draft (DeepSeek-V3 and
Qwen3-Next: an MTP layer added to the random checkpoint, its target made to agree with it; :mod:`atom_tools.e2e.drafts`), named
``ENGINE+mtp``: the speed-up of drafting per implementation, the drafts' acceptance, and the drafting engines'
greedy agreement with the same engine without drafts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from atom_tools.e2e import drafts, driver
from atom_tools.e2e.driver import AGREEMENT_TOKENS, checkpoint_prompt_vocab, compare_agreement, random_prompts, spread
from atom_tools.e2e.profile import profiled_record, summary_lines
from atom_tools.e2e.triton_cache import CompileLog

# Engine arguments a model needs, given to both implementations.  vLLM's own Qwen3-Next and Qwen3.5 take
# FlashInfer's JIT-compiled GDN prefill on Hopper by default; the Triton (flash-linear-attention) one needs no
# compiler on the machine and FlashInfer is not part of the offline bundle.  ATOM's classes ignore the setting.
# Qwen3.5 runs text-only (``language_model_only``: no image or video inputs, so no multimodal processor, which
# needs tokenizer and image-processor files (a random checkpoint has tiny stand-ins), and no encoder profiling; vLLM's own
# class then builds no vision tower, ATOM's loads the checkpoint's two-block one).  Random prompts stay below the
# placeholder ids (``prompt_vocab``).
_TRITON_GDN = {"additional_config": {"gdn_prefill_backend": "triton"}}
ENGINE_ARGS: dict[str, dict] = {"qwen3-next-80b-a3b": _TRITON_GDN,
                                "qwen3.5-35b-a3b": {**_TRITON_GDN, "language_model_only": True}}
# by architecture, for models given with --checkpoint: atom-vllm's sparse attention runs eagerly only (it refuses
# CUDA-graph capture, atom_vllm.sparse), so both implementations of DeepSeek-V3.2 / GLM-5 run eagerly
ARCH_ENGINE_ARGS: dict[str, dict] = {"DeepseekV32ForCausalLM": {"enforce_eager": True},
                                     "GlmMoeDsaForCausalLM": {"enforce_eager": True}}
# atom-compiled: ATOM's classes with vLLM's torch.compile of the hybrid ones too (atom_vllm.compilation's opt-in)
IMPLS: dict[str, dict[str, str]] = {"vllm": {"ATOM_DISABLE_VLLM_PLUGIN": "1"},
                                    "atom": {"ATOM_DISABLE_VLLM_PLUGIN": "0", "ATOM_TAKE_OVER": "all"},
                                    "atom-compiled": {"ATOM_DISABLE_VLLM_PLUGIN": "0", "ATOM_TAKE_OVER": "all",
                                                      "ATOM_VLLM_COMPILE_HYBRID": "1"}}
# every engine: llm.apply_model ships a function to the worker (vLLM refuses pickled callables otherwise)
ENGINE_ENV = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


# ---- one engine (a subprocess per implementation, alive for the whole comparison) -------------------------------
def model_module(model) -> str:
    """Run in vLLM's worker (``apply_model``): which implementation the engine built.  A module-level function of
    an importable module, so the engine-core process can unpickle it."""
    return type(model).__module__


def attention_backends(model) -> list[str]:
    """Run in vLLM's worker: the names of the attention backends the model's attention layers were built with (a
    backend class, or, on vLLM's vision-encoder attention, an ``AttentionBackendEnum`` member)."""
    def name(backend) -> str:
        return backend.get_name() if hasattr(backend, "get_name") else getattr(backend, "name", str(backend))

    return sorted({name(m.attn_backend) for m in model.modules() if hasattr(m, "attn_backend")})


def engine_name(impl: str, backend: str) -> str:
    return impl if backend == "default" else f"{impl}@{backend}"


def engine_impl(name: str) -> str:
    return drafts.engine_parts(name)[0]


class Engine:
    """One ``LLM`` and the requests the comparison sends it: agreement, one timed run, one profiled run."""

    def __init__(self, job: dict):
        from vllm import LLM

        self.job = job
        self.vocab = checkpoint_prompt_vocab(Path(job["model_dir"]))
        extra = {}
        if job.get("profile_dir"):
            from vllm.config import ProfilerConfig

            extra["profiler_config"] = ProfilerConfig(profiler="torch", torch_profiler_dir=job["profile_dir"],
                                                      torch_profiler_with_stack=False, torch_profiler_use_gzip=True,
                                                      ignore_frontend=True)
        if job.get("attention_backend"):
            extra["attention_backend"] = job["attention_backend"]
        if job.get("speculative_config"):  # LLM.get_metrics reads the draft counters only with stats kept
            extra |= {"speculative_config": job["speculative_config"], "disable_log_stats": False}
        began = time.perf_counter()
        self.llm = LLM(model=job["model_dir"], skip_tokenizer_init=True, dtype="bfloat16", seed=0,
                       max_num_batched_tokens=job["max_num_batched_tokens"],
                       gpu_memory_utilization=job["gpu_memory_utilization"], **job.get("engine_args", {}), **extra)
        self.startup_s = time.perf_counter() - began
        self.module = self.llm.apply_model(model_module)[0]
        self.attention_backends = self.llm.apply_model(attention_backends)[0]

    def generate(self, prompts, max_tokens, **kw):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False, **kw)
        start = time.perf_counter()
        results = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return results, time.perf_counter() - start

    def ready(self) -> dict:
        return {"module": self.module, "startup_s": self.startup_s, "attention_backends": self.attention_backends}

    def agreement(self) -> list[dict]:
        results, _ = self.generate(self.job["agreement_prompts"], AGREEMENT_TOKENS, logprobs=0, prompt_logprobs=0)
        return [{
            "tokens": list(r.outputs[0].token_ids),
            "logprobs": [next(iter(d.values())).logprob for d in r.outputs[0].logprobs],
            "prompt_logprobs": [next(iter(d.values())).logprob for d in r.prompt_logprobs[1:]],
        } for r in results]

    def timed(self, batch: int, prompt_len: int, max_tokens: int, seed: int) -> float:
        return self.generate(random_prompts(self.vocab, batch, prompt_len, seed), max_tokens)[1]

    def acceptance(self) -> dict:
        """Draft tokens proposed and accepted over every request this engine ran."""
        counters: dict[str, float] = {}
        for metric in self.llm.get_metrics():
            if "spec_decode_num" in metric.name and hasattr(metric, "value"):
                counters[metric.name] = counters.get(metric.name, 0) + metric.value
        return drafts.acceptance(counters)

    def profiled(self, batch: int, prompt_len: int, max_tokens: int) -> float:
        """vLLM's profiler runs once per engine, over one run."""
        self.llm.start_profile()
        _, seconds = self.generate(random_prompts(self.vocab, batch, prompt_len, seed=7), max_tokens)
        self.llm.stop_profile()
        return seconds


def serve_engine(job_file: str, reply_fd: int) -> None:
    """The engine subprocess: builds the engine, then answers one JSON request per stdin line with one JSON line
    on ``reply_fd`` (stdout carries vLLM's logs) until stdin closes."""
    with os.fdopen(reply_fd, "w", buffering=1) as replies:
        engine = Engine(json.loads(Path(job_file).read_text()))
        replies.write(json.dumps(engine.ready()) + "\n")
        for line in sys.stdin:
            request = json.loads(line)
            replies.write(json.dumps(getattr(engine, request.pop("op"))(**request)) + "\n")


class EngineProcess:
    """The parent's handle on one engine subprocess, with the implementation's environment."""

    def __init__(self, impl: str, job: dict, workdir: Path):
        job_file = workdir / f"{impl}-job.json"
        job_file.write_text(json.dumps(job))
        read_fd, write_fd = os.pipe()
        env = {**os.environ, **ENGINE_ENV, **IMPLS[engine_impl(impl)]}
        # a fresh Triton cache per engine: every kernel Triton compiles adds one entry, so the entries added during
        # a timed run are the compiles that run paid for (a step size or batch composition seen for the first time)
        self.triton_cache = workdir / f"{impl}-triton-cache"
        shutil.rmtree(self.triton_cache, ignore_errors=True)
        self.triton_cache.mkdir(parents=True)
        env["TRITON_CACHE_DIR"] = str(self.triton_cache)
        self.compiles = CompileLog(self.triton_cache)
        # run as atom_tools.e2e.vllm rather than __main__, so model_module pickles by an importable name
        code = "import sys; from atom_tools.e2e.vllm import main; sys.exit(main(sys.argv[1:]))"
        self.impl = impl
        self.process = subprocess.Popen([sys.executable, "-c", code, "--engine", str(job_file), str(write_fd)],
                                        env=env, stdin=subprocess.PIPE, text=True, pass_fds=(write_fd,))
        os.close(write_fd)
        self.replies = os.fdopen(read_fd)
        self.ready = self._reply()

    def _reply(self):
        line = self.replies.readline()
        if not line:
            code = self.process.wait()
            raise RuntimeError(f"the {self.impl} engine exited with code {code} (its log is above)")
        return json.loads(line)

    def triton_compiles(self) -> int:
        """Kernels Triton has compiled in this engine so far (entries of its cache)."""
        return self.compiles.count()

    def new_compiles(self) -> list[dict]:
        """The kernels Triton compiled since the last call, described (:mod:`atom_tools.e2e.triton_cache`)."""
        return self.compiles.new()

    def request(self, op: str, **kw):
        self.process.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.process.stdin.flush()
        return self._reply()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()
        self.replies.close()


# ---- the comparison ------------------------------------------------------------------------------------------
def reference_quantization(model_dir: Path) -> dict:
    """transformers' loading arguments for the reference of a quantized checkpoint: MXFP4 is dequantized by
    transformers' own reader (its GPU path fetches kernels from the Hub, which the offline GPU machine cannot reach;
    the dequantized weights are the checkpoint's values exactly, then upcast)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    if config.get("quantization_config", {}).get("quant_method") == "mxfp4":
        from transformers import Mxfp4Config

        return {"quantization_config": Mxfp4Config(dequantize=True)}
    return {}


def reference_scores(model_dir: Path, prompts: list[list[int]], agreement: dict[str, list[dict]],
                     device: str = "cuda") -> dict:
    """transformers in float32 (the checkpoint's weights, upcast) scores each prompt followed by each
    implementation's greedy output, on the GPU after the engines have exited.  Per implementation: how far its
    prompt and output log-probabilities are from the reference's, and the reference's regret of its greedy
    choices (reference max log-prob minus the reference log-prob of the chosen token, given the same prefix; 0
    when the reference would have chosen it too).  When the implementations disagree, this says which is right."""
    import torch
    from transformers import AutoModelForCausalLM

    # straight onto the GPU (device_map; the GPU machine has accelerate): a real-shape float32 copy is tens of GB
    placement = {"device_map": device} if device != "cpu" else {}
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, trust_remote_code=False,
                                                 **placement, **reference_quantization(model_dir)).eval()
    scores = {}
    with torch.inference_mode():
        for impl, outputs in agreement.items():
            prompt_delta, output_delta, regret = [], [], []
            for prompt, out in zip(prompts, outputs):
                ids = prompt + out["tokens"]
                logp = torch.log_softmax(model(torch.tensor([ids], device=device)).logits[0].float(), dim=-1)
                chosen = logp[:-1].gather(1, torch.tensor(ids[1:], device=device)[:, None])[:, 0]
                best = logp[:-1].max(dim=-1).values
                n = len(prompt) - 1  # chosen[:n] scores prompt tokens 1.., chosen[n:] the output tokens
                prompt_delta += (chosen[:n].cpu() - torch.tensor(out["prompt_logprobs"])).abs().tolist()
                output_delta += (chosen[n:].cpu() - torch.tensor(out["logprobs"])).abs().tolist()
                regret += (best[n:] - chosen[n:]).tolist()
            scores[impl] = {"prompt_logprob_mean_abs_diff": statistics.mean(prompt_delta),
                            "prompt_logprob_max_abs_diff": max(prompt_delta),
                            "output_logprob_mean_abs_diff": statistics.mean(output_delta),
                            "output_regret_mean": statistics.mean(regret), "output_regret_max": max(regret),
                            "output_reference_greedy": sum(r == 0.0 for r in regret) / len(regret)}
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"reference": "transformers float32", **scores}


def summarize(runs: list[dict], batch: int, output_len: int) -> dict:
    mine = [r for r in runs if r["batch"] == batch]
    tput = [batch * output_len / r["total_s"] for r in mine]
    tpot = [(r["total_s"] - r["ttft_s"]) / (output_len - 1) * 1e3 for r in mine]
    ttft = [r["ttft_s"] * 1e3 for r in mine]
    out = {"output_tok_per_s": spread(tput), "tpot_ms": spread(tpot), "ttft_ms": spread(ttft),
           "triton_compiles": [r["triton_compiles"] for r in mine]}
    if any(r.get("compiled") for r in mine):  # which kernels, per repeat (atom_tools.e2e.triton_cache)
        out["compiled"] = [r.get("compiled", []) for r in mine]
    return out


def timed_runs(engines: list[EngineProcess], batches: list[int], args: argparse.Namespace) -> dict[str, list[dict]]:
    """Every implementation runs the same prompts, one run after the other's: for each repeat at each batch size
    a TTFT run (1 output token) and a full run per engine, the engines' order swapped every repeat, so a drift
    of the machine's speed (clocks, a neighbour) lands on both implementations alike."""
    runs: dict[str, list[dict]] = {e.impl: [] for e in engines}
    plen, olen = args.prompt_len, args.output_len
    for batch in batches:
        for engine in engines:  # warm-up at this batch size
            engine.request("timed", batch=batch, prompt_len=plen, max_tokens=olen, seed=10_000 + batch)
        for rep in range(args.repeats):
            for engine in engines if rep % 2 == 0 else engines[::-1]:
                seed = 100 * batch + 2 * rep  # fresh prompts every run, so the prefix cache never hits
                compiled = engine.triton_compiles()
                engine.new_compiles()
                ttft = engine.request("timed", batch=batch, prompt_len=plen, max_tokens=1, seed=seed)
                total = engine.request("timed", batch=batch, prompt_len=plen, max_tokens=olen, seed=seed + 1)
                runs[engine.impl].append({"batch": batch, "repeat": rep, "ttft_s": ttft, "total_s": total,
                                          "triton_compiles": engine.triton_compiles() - compiled,
                                          "compiled": engine.new_compiles()})
    return runs


def compare(entry: dict, model_dir: Path, impls: list[str], batches: list[int], args: argparse.Namespace,
            engine_args: dict, prompts: list[list[int]], save) -> dict:
    """Start one engine per implementation on ``model_dir``, all alive at once (each given an equal share of
    GPU memory), and time them against each other; ``entry`` gains per-implementation results and the
    agreement of ATOM's with vLLM's.  ``save()`` is called each time ``entry`` grows (an engine up, agreement,
    a batch size timed), so a run cut short by a time limit keeps what it measured."""
    workdir = model_dir.parent
    engines: list[EngineProcess] = []
    profile_dirs: dict[str, Path] = {}
    entry["impls"] = {}
    try:
        for impl in impls:  # one at a time: each engine's memory profiling must see the other's memory settled
            profile_dirs[impl] = workdir / f"profile-{model_dir.name}-{impl}"
            _, backend, method = drafts.engine_parts(impl)
            job = {"model_dir": str(model_dir), "max_num_batched_tokens": args.max_num_batched_tokens,
                   "gpu_memory_utilization": args.gpu_memory_utilization, "engine_args": engine_args,
                   "agreement_prompts": prompts, "attention_backend": backend,
                   "speculative_config": drafts.speculative_config(method, args.speculative) if method else None,
                   "profile_dir": str(profile_dirs[impl]) if args.profile else None}
            engine = EngineProcess(impl, job, workdir)
            engines.append(engine)
            entry["impls"][impl] = {"module": engine.ready["module"], "startup_s": round(engine.ready["startup_s"], 1),
                                    "attention_backends": engine.ready.get("attention_backends"), "batches": {}}
            save()
        agreement = {e.impl: e.request("agreement") for e in engines}
        if "vllm" in agreement and "atom" in agreement:
            entry["agreement"] = compare_agreement(agreement["vllm"], agreement["atom"])
        first = impls[0]
        others = [i for i in impls[1:] if {first, i} != {"vllm", "atom"}]
        if others:
            entry["agreement_with_first"] = {i: compare_agreement(agreement[first], agreement[i]) for i in others}
        drafting = {i: drafts.plain_name(i) for i in impls if drafts.engine_parts(i)[2] and drafts.plain_name(i) in agreement}
        if drafting:  # greedy decoding with drafts gives the tokens of the same engine without them
            entry["agreement_with_plain"] = {i: compare_agreement(agreement[p], agreement[i]) for i, p in drafting.items()}
        save()
        for batch in batches:
            for impl, runs in timed_runs(engines, [batch], args).items():
                entry["impls"][impl]["batches"][str(batch)] = summarize(runs, batch, args.output_len)
            save()
        for engine in engines:
            if drafts.engine_parts(engine.impl)[2]:
                entry["impls"][engine.impl]["speculative"] = engine.request("acceptance")
        save()
        profiled = ({e.impl: e.request("profiled", batch=batches[0], prompt_len=args.profile_prompt_len,
                                       max_tokens=args.profile_output_len) for e in engines} if args.profile else {})
    finally:
        for engine in engines:
            engine.close()
    for impl in profiled:
        if args.traces_out:
            shutil.copytree(profile_dirs[impl], Path(args.traces_out) / f"{entry['model']}-{profile_dirs[impl].name}",
                            dirs_exist_ok=True)
        entry["impls"][impl]["kernels"] = profiled_record(batches[0], args.profile_prompt_len, args.profile_output_len,
                                                          profiled[impl], profile_dirs[impl])
    if args.reference:
        entry["against_reference"] = reference_scores(model_dir, prompts, agreement)
    save()
    return entry


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--engine"]:  # internal: an engine subprocess of EngineProcess, JOB.json REPLY_FD
        serve_engine(argv[1], int(argv[2]))
        return 0
    parser = driver.parser("python -m atom_tools.e2e.vllm", __doc__.split("\n\n")[0], "vllm,atom")
    parser.add_argument("--attention-backends", default="default",
                        help="vLLM attention backends to run each implementation with, e.g. default,FLASH_ATTN,TRITON_ATTN,"
                             "CUSTOM (CUSTOM: ATOM's paged attention; default: vLLM's own choice)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--reference", action="store_true",
                        help="also score every implementation's agreement outputs with transformers in float32")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="each engine's share of GPU memory (default: 0.85 split evenly between the engines)")
    parser.add_argument("--speculative", type=int, default=0, metavar="N",
                        help="also run each implementation drafting N tokens with the model's own draft, its target "
                             "made to agree with it (DeepSeek-V3, Qwen3-Next: an MTP layer; atom_tools.e2e.drafts)")
    parser.add_argument("--draft-agreeing", type=float, default=0.0,
                        help="with --speculative: how much the target reads its context (0: the draft is always "
                             "right; larger: accepted less often)")
    args = driver.parse(parser, argv, IMPLS)
    backends = [b for b in args.attention_backends.split(",") if b]
    bad_backends = [b for b in backends if b != "default" and not (b.isidentifier() and b.isupper())]
    if bad_backends:
        parser.error(f"--attention-backends: {', '.join(bad_backends)} is not a vLLM backend name (e.g. FLASH_ATTN, "
                     "TRITON_ATTN, CUSTOM) or default")
    if "vllm" in args.impl_list and "CUSTOM" in backends:
        parser.error("--attention-backends CUSTOM needs ATOM's plugin, which --impls vllm turns off: use --impls atom")
    impls = [engine_name(i, b) for i in args.impl_list for b in backends]
    if args.speculative:
        archs = {name: driver.MODELS[name][0] for name in args.names}
        archs |= {name: json.loads((Path(d) / "config.json").read_text())["architectures"][0]
                  for name, d in args.real.items()}
        if why := drafts.refusal(archs, args.format_list):
            parser.error(why)
    engine_count = len(impls) * (2 if args.speculative else 1)

    import torch
    import vllm

    args.gpu_memory_utilization = args.gpu_memory_utilization or round(0.85 / engine_count, 2)
    report = driver.new_report(args, torch.cuda.get_device_name(), {"vllm": vllm.__version__}, {
        "dtype": "bfloat16", "max_num_batched_tokens": args.max_num_batched_tokens, "attention_backends": backends,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "speculative_tokens": args.speculative, "draft_agreeing": args.draft_agreeing if args.speculative else None,
        "engine": "LLM.generate, vLLM defaults (CUDA graphs + torch.compile), ignore_eos",
        "protocol": "engines alive together, timed runs alternated, order swapped every repeat"})

    def compare_one(entry: dict, model_dir: Path, prompts: list[list[int]], save) -> dict:
        engines = impls
        if args.speculative:  # the same checkpoint, with its draft, for the plain engines and the drafting ones
            model_dir, method = drafts.with_draft(entry["arch"], model_dir, args.draft_agreeing)
            engines = impls + [drafts.drafting_name(i, method) for i in impls]
        engine_args = ENGINE_ARGS.get(entry["model"], ARCH_ENGINE_ARGS.get(entry["arch"], {}))
        return compare(entry, model_dir, engines, args.batch_list, args, engine_args, prompts, save)

    driver.run(args, report, compare_one, given_format="real weights")
    print_table(report)
    return 0


def print_table(report: dict) -> None:
    print(f"{report['gpu']}, vLLM {report['vllm']}, {report['date']}")
    print(f"{'model':28} {'batch':>5} {'engine':>18} {'tok/s (min-max)':>24} {'TPOT ms':>8} {'TTFT ms':>9} {'startup':>8}"
          f" {'compiles':>9}")
    for entry in report["models"]:
        label = f"{entry['model']} {entry.get('format', 'bf16')}"
        for impl, result in entry["impls"].items():
            for batch, row in result["batches"].items():
                t = row["output_tok_per_s"]
                print(f"{label:28} {batch:>5} {impl:>18} {t['median']:>10.0f} ({t['min']:.0f}-{t['max']:.0f})"
                      f"{row['tpot_ms']['median']:>8.2f} {row['ttft_ms']['median']:>9.1f} {result['startup_s']:>8.1f}"
                      f" {'/'.join(map(str, row.get('triton_compiles', []))):>9}")
            if "kernels" in result:
                print("\n".join(summary_lines(label, impl, result["kernels"])))
        if "agreement" in entry:
            print(f"{label}: agreement {entry['agreement']}")
        if "against_reference" in entry:
            print(f"{label}: against {entry['against_reference']}")
        if {"vllm", "atom"} <= set(entry["impls"]):
            ratios = [entry["impls"]["atom"]["batches"][b]["output_tok_per_s"]["median"]
                      / entry["impls"]["vllm"]["batches"][b]["output_tok_per_s"]["median"]
                      for b in entry["impls"]["atom"]["batches"]]
            print(f"{label}: ATOM / vLLM " + " / ".join(f"{r:.2f}" for r in ratios))
        first, *others = entry["impls"]
        for other in others:
            if {first, other} == {"vllm", "atom"}:
                continue
            ratios = [entry["impls"][other]["batches"][b]["output_tok_per_s"]["median"]
                      / entry["impls"][first]["batches"][b]["output_tok_per_s"]["median"]
                      for b in entry["impls"][other]["batches"] if b in entry["impls"][first]["batches"]]
            print(f"{label}: {other} / {first} tok/s per batch " + " / ".join(f"{r:.2f}" for r in ratios))
        for other, agreement in entry.get("agreement_with_first", {}).items():
            print(f"{label}: agreement {other} vs {first} {agreement}")
        for name, result in entry["impls"].items():
            plain = drafts.plain_name(name)
            if "speculative" in result and plain in entry["impls"]:
                ratios = [result["batches"][b]["output_tok_per_s"]["median"]
                          / entry["impls"][plain]["batches"][b]["output_tok_per_s"]["median"]
                          for b in result["batches"] if b in entry["impls"][plain]["batches"]]
                print(f"{label}: {name} / {plain} tok/s per batch " + " / ".join(f"{r:.2f}" for r in ratios)
                      + f"; drafts accepted {result['speculative']}")


if __name__ == "__main__":
    raise SystemExit(main())
