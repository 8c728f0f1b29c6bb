"""The demo model served by vLLM with ATOM's plugin: ``python -m atom_vllm.demo DIR`` (the checkpoint `atom fetch-demo
DIR` writes) builds vLLM's offline ``LLM`` on it, prints the model class vLLM built (ATOM's, through the plugin,
forced with ``ATOM_TAKE_OVER=all``: on a CPU vLLM keeps its own class by default) and the text it generates greedily
for a continuation and a chat prompt. With ``--against-own`` it then runs vLLM's own class on the same checkpoint
(plugin off, another process) and fails unless both produce the same greedy tokens."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

PROMPT = "The capital of France is"
TAKE_OVER_ENV = "ATOM_TAKE_OVER"  # atom_core.takeover's switch (not imported: this module imports nothing of ATOM's)
QUESTION = "What is the capital of France?"


def run(model: str, dtype: str, max_new_tokens: int) -> dict:
    """The class vLLM built and its greedy outputs (text and token ids) for the two prompts."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: apply_model works
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=512, max_num_seqs=2, seed=0)
    module, qualname = llm.apply_model(lambda m: (type(m).__module__, type(m).__qualname__))[0]
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    completion = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    answer = llm.chat([{"role": "user", "content": QUESTION}], params, use_tqdm=False)[0].outputs[0]
    return {"class": f"{module}.{qualname}", "texts": [completion.text, answer.text],
            "tokens": [list(completion.token_ids), list(answer.token_ids)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atom_vllm.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a checkpoint directory (atom fetch-demo DIR)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--against-own", action="store_true", help="also run vLLM's own class; fail unless tokens agree")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the --against-own child's output
    args = parser.parse_args(argv)
    if not args.json:  # the ATOM run; the --against-own child runs with the plugin off
        os.environ[TAKE_OVER_ENV] = "all"
    out = run(args.model, args.dtype, args.max_new_tokens)
    if args.json:
        print("ATOM_DEMO_JSON " + json.dumps(out))
        return 0
    print(f"vLLM built {out['class']}")
    if not out["class"].startswith("atom_vllm"):
        print("error: vLLM built its own class, not ATOM's: is the atom plugin installed and enabled?", file=sys.stderr)
        return 1
    print(f"{PROMPT!r} -> {out['texts'][0]!r}")
    print(f"chat {QUESTION!r} -> {out['texts'][1]!r}")
    if args.against_own:
        child = subprocess.run([sys.executable, "-m", "atom_vllm.demo", args.model, "--dtype", args.dtype,
                                "--max-new-tokens", str(args.max_new_tokens), "--json"], capture_output=True, text=True,
                               env=os.environ | {"ATOM_DISABLE_VLLM_PLUGIN": "1"})
        line = next((x for x in child.stdout.splitlines() if x.startswith("ATOM_DEMO_JSON ")), None)
        if child.returncode or line is None:
            print(f"error: vLLM's own class did not run (exit {child.returncode}): {child.stderr[-2000:]}", file=sys.stderr)
            return 1
        own = json.loads(line.split(" ", 1)[1])
        same = own["tokens"] == out["tokens"]
        print(f"vLLM's own {own['class']}: {'the same' if same else 'different'} greedy tokens")
        if not same:
            print(f"error: ATOM's tokens {out['tokens']} differ from vLLM's own {own['tokens']}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
