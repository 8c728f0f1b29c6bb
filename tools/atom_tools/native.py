"""Model-level benchmark: ATOM's native runner against transformers' eager implementation on the same
random checkpoint of a real model shape (few layers), prefill and decode, on one GPU.

``python -m atom_tools.native --arch Qwen3ForCausalLM --layers 4 --out model.json``

The native host is a small runtime (ATOM's paged attention over its block cache), not a serving engine, so this
measures the model code (fused ops, loader, layers) rather than a scheduler.  ATOM runs twice: eager
(``atom-native``) and with decode steps replayed from CUDA graphs (``atom-native-graphs``).

It writes its random real-shape checkpoint with :mod:`atom_tools.checkpoints`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time
from pathlib import Path

import torch

from atom_tools.checkpoints import SHAPES, prompt_vocab, write_checkpoint


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _wall(fn, device: str, reps: int) -> float:
    fn()  # warm-up (compilation, allocator)
    _sync(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]



def _time_atom(runner, prompts, decode_tokens: int, device: str, reps: int, params_cls) -> tuple[float, float]:
    one = params_cls(max_new_tokens=1, ignore_eos=True)
    many = params_cls(max_new_tokens=decode_tokens, ignore_eos=True)
    return (_wall(lambda: runner.generate(prompts, one), device, reps),
            _wall(lambda: runner.generate(prompts, many), device, reps))


def run(arch: str, layers: int, batch: int, prompt_len: int, decode_tokens: int, device: str = "cuda",
        dtype: torch.dtype = torch.bfloat16, reps: int = 3, shape: dict | None = None) -> list[dict]:
    import transformers

    from atom_core.runtime.runner import Runner
    from atom_core.runtime.sampler import SamplingParams

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_checkpoint(arch, layers, Path(tmp), dtype, device, shape)
        vocab = prompt_vocab(json.loads((ckpt / "config.json").read_text()))
        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, vocab, (batch, prompt_len), generator=gen)
        prompt_lists = prompts.tolist()

        atom = {impl: _time_atom(Runner(ckpt, device=device, dtype=dtype, cuda_graphs=graphs), prompt_lists,
                                 decode_tokens, device, reps, SamplingParams)
                for impl, graphs in (("atom-native", False), ("atom-native-graphs", True))}

        hf = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=dtype, trust_remote_code=False).to(device).eval()
        ids = prompts.to(device)

        @torch.inference_mode()
        def hf_generate(n: int):
            return hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)

        hf_prefill = _wall(lambda: hf_generate(1), device, reps)
        hf_total = _wall(lambda: hf_generate(decode_tokens), device, reps)

    for impl, (prefill, total) in {**atom, "hf-eager": (hf_prefill, hf_total)}.items():
        decode_step = (total - prefill) / max(decode_tokens - 1, 1)
        rows.append({
            "arch": arch, "layers": layers, "batch": batch, "prompt_len": prompt_len, "impl": impl,
            "prefill_ms": prefill * 1e3, "prefill_tok_per_s": batch * prompt_len / prefill,
            "decode_step_ms": decode_step * 1e3, "decode_tok_per_s": batch / decode_step,
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atom_tools.native")
    parser.add_argument("--arch", default="Qwen3ForCausalLM", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = [row for b in args.batch for row in run(args.arch, args.layers, b, args.prompt_len, args.decode_tokens, device)]
    context = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu",
               "date": datetime.date.today().isoformat(), "torch": torch.__version__}
    Path(args.out).write_text(json.dumps({"context": context, "rows": rows}, indent=1))
    for row in rows:
        print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
