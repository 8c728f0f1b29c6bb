"""What the end-to-end benches inside a host (:mod:`atom_tools.e2e.vllm`, :mod:`atom_tools.e2e.sglang`) share:
the models and their checkpoints (bf16, then ``atom quantize``'s copy per format), the prompts, the agreement
summary, the spread of repeats, the command line both take, and the run itself (checkpoint loop, report JSON
rewritten after every step).  What is host-specific (an engine or server per implementation, its timing, its
report fields) comes in through :class:`Host`."""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from atom_tools.checkpoints import prompt_vocab, write_checkpoint

FORMATS = ("bf16", "fp8-block", "ptpc-fp8", "mxfp4")  # bf16 as written; the rest through atom quantize
# name -> (architecture, layers); shapes are atom_tools.checkpoints.SHAPES
MODELS: dict[str, tuple[str, int]] = {
    "qwen3-8b": ("Qwen3ForCausalLM", 8),
    "qwen3-30b-a3b": ("Qwen3MoeForCausalLM", 6),
    "llama3-8b": ("LlamaForCausalLM", 8),
    "mixtral-8x7b": ("MixtralForCausalLM", 4),
    "qwen3-next-80b-a3b": ("Qwen3NextForCausalLM", 4),
    "deepseek-v3": ("DeepseekV3ForCausalLM", 2),  # one dense layer, one with 256 experts
    "gpt-oss-120b": ("GptOssForCausalLM", 2),  # one sliding-window layer, one full
    "qwen3.5-35b-a3b": ("Qwen3_5MoeForConditionalGeneration", 4),  # three linear-attention layers, one full
    "smollm2-135m": ("LlamaForCausalLM", 30),  # the demo model's shape (all 30 layers), random weights
}
# Models whose shape is not their architecture's SHAPES entry
MODEL_SHAPES: dict[str, dict] = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                         head_dim=64, vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
}
AGREEMENT_PROMPTS, AGREEMENT_TOKENS = 16, 32
# Agreement prompts for a real checkpoint (its tokenizer encodes them); random-weight ones use random tokens.
TEXT_PROMPTS = ("The capital of France is", "Water boils at a temperature of",
                "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
                "The three primary colors are", "In 1969, the first humans to walk on the Moon were",
                "A haiku about autumn:\n", "Translate to French: I would like a cup of coffee.\n",
                "The largest planet in the solar system is")


def random_prompts(vocab: int, count: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (count, length), generator=gen).tolist()


def checkpoint_prompt_vocab(model_dir: Path) -> int:
    """:func:`prompt_vocab` of the checkpoint in ``model_dir``."""
    return prompt_vocab(json.loads((Path(model_dir) / "config.json").read_text()))


def agreement_prompts(model_dir: Path) -> list[list[int]]:
    """The fixed prompt set of a random-weight checkpoint: random tokens, lengths 16 to 211."""
    vocab = checkpoint_prompt_vocab(model_dir)
    return [p[: 16 + 13 * i] for i, p in enumerate(random_prompts(vocab, AGREEMENT_PROMPTS, 256, seed=1))]


def text_prompts(model_dir: Path) -> list[list[int]]:
    """``TEXT_PROMPTS`` as the tokenizer of the checkpoint in ``model_dir`` encodes them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    return [tokenizer(p)["input_ids"] for p in TEXT_PROMPTS]


COMPLETE = ".complete"  # written last into a kept checkpoint directory: a run cut off while writing leaves none


def kept(directory: Path, write: Callable[[], Path]) -> Path:
    """``directory`` as a previous run left it when it was finished (its :data:`COMPLETE` marker), else ``write()``
    into it (a partial one is replaced) and mark it finished."""
    if (directory / COMPLETE).is_file():
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    out = write()
    (out / COMPLETE).write_text("")
    return out


def model_checkpoints(name: str, layers: int, formats: list[str], workdir: Path):
    """Yield ``(format, directory)`` of the model ``name`` of :data:`MODELS` at ``layers`` layers: the bf16 random
    checkpoint, then ``atom quantize``'s copy per format; finished ones already in ``workdir`` are reused (random
    weights of the model's shape at ``layers`` layers: any such checkpoint serves the comparison)."""
    from atom_core.quant.quantize import quantize_checkpoint

    arch = MODELS[name][0]
    bf16 = kept(workdir / "bf16", lambda: write_checkpoint(arch, layers, workdir / "bf16", torch.bfloat16, "cuda",
                                                           MODEL_SHAPES.get(name)))
    torch.cuda.empty_cache()
    for fmt in formats:
        if fmt == "bf16":
            yield fmt, bf16
        else:
            out = kept(workdir / fmt, functools.partial(quantize_checkpoint, bf16, workdir / fmt, fmt, device="cuda"))
            torch.cuda.empty_cache()  # before the engines start: this process's cached blocks count against them
            yield fmt, out


def compare_agreement(ref: list[dict], other: list[dict]) -> dict:
    """Two implementations' greedy outputs on the same prompts (per prompt ``tokens``, ``logprobs`` of them and
    ``prompt_logprobs`` of prompt tokens 1..): how many are identical, where they first diverge, and how far
    their log-probabilities are apart."""
    same = sum(a["tokens"] == b["tokens"] for a, b in zip(ref, other))
    first_diff = [next((i for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y), len(a["tokens"]))
                  for a, b in zip(ref, other)]
    prompt_delta = [abs(x - y) for a, b in zip(ref, other) for x, y in zip(a["prompt_logprobs"], b["prompt_logprobs"])]
    # output log-probabilities are comparable only while both chose the same tokens
    out_delta = [abs(x - y) for a, b, n in zip(ref, other, first_diff) for x, y in zip(a["logprobs"][:n], b["logprobs"][:n])]
    return {"prompts": len(ref), "identical_greedy": same, "mean_first_divergence": statistics.mean(first_diff),
            "prompt_logprob_mean_abs_diff": statistics.mean(prompt_delta), "prompt_logprob_max_abs_diff": max(prompt_delta),
            "output_logprob_mean_abs_diff": statistics.mean(out_delta) if out_delta else None}


def spread(values: list[float]) -> dict:
    """Median, min, max and every sample (ci/regression.py tests the samples) of a metric's repeats."""
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2),
            "samples": [round(v, 3) for v in values]}



def checkpoint_prompts(model_dir: Path) -> list[list[int]]:
    """Agreement prompts of a given checkpoint: the text prompts its tokenizer encodes, random tokens without one."""
    has_tokenizer = any((Path(model_dir) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    return text_prompts(model_dir) if has_tokenizer else agreement_prompts(model_dir)


# ---- the command line and the run both hosts share --------------------------------------------------------------
def parser(prog: str, description: str, default_impls: str) -> argparse.ArgumentParser:
    """The arguments every end-to-end bench takes; a host adds its own before :func:`parse`."""
    out = argparse.ArgumentParser(prog=prog, description=description)
    out.add_argument("--models", default="qwen3-8b,qwen3-30b-a3b", help=f"of {', '.join(MODELS)}")
    out.add_argument("--impls", default=default_impls)
    out.add_argument("--formats", default="bf16", help=f"weight formats of the random checkpoints: {', '.join(FORMATS)}")
    out.add_argument("--checkpoint", action="append", default=[], metavar="NAME=DIR",
                     help="also compare on this checkpoint (agreement on text prompts when it has a tokenizer)")
    out.add_argument("--layers", type=int, default=None, help="override each model's layer count")
    out.add_argument("--batches", default="1,64,256")
    out.add_argument("--prompt-len", type=int, default=512)
    out.add_argument("--output-len", type=int, default=128)
    out.add_argument("--repeats", type=int, default=5)
    out.add_argument("--workdir", default=None, help="where checkpoints go (default: a temporary directory)")
    out.add_argument("--keep-checkpoints", action="store_true",
                     help="keep the random checkpoints in --workdir/checkpoints and reuse finished ones on the next "
                          "run (a GPU call too short for writing and measuring a large model does the writing once)")
    out.add_argument("--out", required=True, help="the report (JSON), rewritten after every step")
    out.add_argument("--profile", action="store_true",
                     help="kernel times over one run of the first batch size, from the host's torch profiler")
    out.add_argument("--profile-prompt-len", type=int, default=32,
                     help="the profiled run's prompt length (default 32 with 64 output tokens: mostly decode steps)")
    out.add_argument("--profile-output-len", type=int, default=64)
    out.add_argument("--traces-out", default=None, help="keep the profiler traces in this directory")
    return out


def parse(parser: argparse.ArgumentParser, argv: list[str] | None, impls: dict) -> argparse.Namespace:
    """Parse and check the shared arguments: ``names``, ``impl_list``, ``format_list``, ``real`` (NAME -> DIR) and
    ``batch_list`` are added; an unknown model, implementation or format, or a ``--checkpoint`` without a
    config.json, is a usage error naming it."""
    args = parser.parse_args(argv)
    args.names = [m for m in args.models.split(",") if m]
    args.impl_list = [i for i in args.impls.split(",") if i]
    args.format_list = [f for f in args.formats.split(",") if f]
    bad = [item for item in args.checkpoint if "=" not in item]
    if bad:
        parser.error(f"--checkpoint: {', '.join(bad)} is not NAME=DIR")
    args.real = dict(item.split("=", 1) for item in args.checkpoint)
    unknown = ([i for i in args.impl_list if i not in impls] + [m for m in args.names if m not in MODELS]
               + [f for f in args.format_list if f not in FORMATS])
    if unknown:
        parser.error(f"unknown model, implementation or format: {', '.join(unknown)} (models: {', '.join(MODELS)}; "
                     f"implementations: {', '.join(impls)}; formats: {', '.join(FORMATS)})")
    missing = [d for d in args.real.values() if not (Path(d) / "config.json").is_file()]
    if missing:
        parser.error(f"--checkpoint: no config.json in {', '.join(missing)}")
    if args.keep_checkpoints and not args.workdir:
        parser.error("--keep-checkpoints needs --workdir (where the checkpoints stay)")
    args.batch_list = [int(b) for b in args.batches.split(",")]
    return args


_SMI_FIELDS = ("driver_version", "clocks.max.sm", "clocks.sm", "power.limit")


def machine() -> dict:
    """What tells two machines of one GPU kind apart: the host CPU (its model and count, since vLLM's host loop bounds
    small batches) and, where ``nvidia-smi`` runs, the GPU driver, SM clocks and power limit."""
    facts = {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        facts["cpu"] = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                             if line.startswith("model name")), facts["cpu"])
    try:
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return facts
    return facts | dict(zip(_SMI_FIELDS, (v.strip() for v in smi.split(",")), strict=False))


def new_report(args: argparse.Namespace, gpu: str, versions: dict, settings: dict) -> dict:
    """The report's head: GPU, the machine's facts, date, host and torch versions, the command, ATOM's commit, the
    settings."""
    return {"gpu": gpu, "machine": machine(), "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
            **versions,
            "torch": torch.__version__, "command": " ".join(sys.argv), "atom_commit": os.environ.get("ATOM_COMMIT"),
            "settings": {"prompt_len": args.prompt_len, "output_len": args.output_len, "repeats": args.repeats,
                         **settings},
            "models": []}


# compare(entry, model_dir, prompts, save): a host's comparison of its implementations on one checkpoint
Compare = Callable[[dict, Path, list[list[int]], Callable[[], None]], dict]


def run(args: argparse.Namespace, report: dict, compare: Compare, given_format: str) -> dict:
    """Every model of ``--models`` in every format of ``--formats`` (random checkpoints written under
    ``--workdir``, one model's on disk at a time), then every ``--checkpoint`` as it is (its entry's format is
    ``given_format``): ``compare`` fills one report entry each.  The report is rewritten to ``--out`` whenever an
    entry grows, so a run cut short keeps what it measured."""

    def save() -> None:
        Path(args.out).write_text(json.dumps(report, indent=1))

    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)  # each run's checkpoints in a fresh directory inside
    # `timeout` stops a run with SIGTERM: leave through the context managers, so no tens-of-GB checkpoint stays behind
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return _run(args, report, compare, given_format, save)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace, report: dict, compare: Compare, given_format: str, save: Callable[[], None]) -> dict:
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        root = Path(args.workdir) / "checkpoints" if args.keep_checkpoints else Path(tmp)
        for name in args.names:
            arch, layers = MODELS[name]
            layers = args.layers or layers
            model_root = root / (f"{name}-{layers}" if args.keep_checkpoints else name)
            for fmt, model_dir in model_checkpoints(name, layers, args.format_list, model_root):
                entry = {"model": name, "arch": arch, "layers": layers, "format": fmt}
                report["models"].append(entry)
                compare(entry, model_dir, agreement_prompts(model_dir), save)
            if not args.keep_checkpoints:  # a real-shape checkpoint takes tens of GB: one model's on disk at a time
                shutil.rmtree(model_root)
        for name, model_dir in args.real.items():
            config = json.loads((Path(model_dir) / "config.json").read_text())
            entry = {"model": name, "arch": config["architectures"][0],
                     "layers": config.get("text_config", config)["num_hidden_layers"], "format": given_format}
            report["models"].append(entry)
            compare(entry, Path(model_dir), checkpoint_prompts(Path(model_dir)), save)
    return report
