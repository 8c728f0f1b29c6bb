"""Run vLLM on tiny checkpoints and report, as JSON, what it did: the tests call this in subprocesses so
every check sees a fresh process (vLLM loads plugins once per process) with its own environment.

    python vllm_probe.py resolve   --out F DIR...   registry: resolved class + inspection flags per checkpoint
    python vllm_probe.py construct --out F DIR...   forced-CPU construction + vLLM's weight loading
    python vllm_probe.py generate  --out F [--prompts JSON] [--max-tokens N] DIR...   LLM.generate, greedy

Everything runs under ``if __name__ == "__main__":`` (vLLM may spawn processes that re-import this file).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def _model_config(model_dir: str):
    from vllm.config import ModelConfig

    return ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=256)


def resolve(dirs: list[str], inspect: bool = True) -> list[dict]:
    from dataclasses import asdict

    from vllm import ModelRegistry
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    out = []
    for model_dir in dirs:
        config = _model_config(model_dir)
        archs = config.architectures
        cls, arch = ModelRegistry.resolve_model_cls(archs, config)
        flags = {}
        if inspect:  # vLLM's inspection subprocess (or its cache under VLLM_CACHE_ROOT)
            info, _ = ModelRegistry.inspect_model_cls(archs, config)
            flags = {k: v for k, v in asdict(info).items() if isinstance(v, bool)}
        out.append({"dir": model_dir, "arch": arch, "module": cls.__module__, "qualname": cls.__qualname__, "flags": flags})
    return out


def _init_distributed() -> None:
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    init_file = tempfile.mktemp(prefix="atom-vllm-dist-")
    init_distributed_environment(world_size=1, rank=0, local_rank=0, distributed_init_method=f"file://{init_file}",
                                 backend="gloo")
    ensure_model_parallel_initialized(1, 1)


def construct(dirs: list[str]) -> list[dict]:
    """Build each model the way vLLM's loader does, with every parameter first filled with NaN, then let
    vLLM's DefaultModelLoader feed its weight iterator to the model's load_weights."""
    import torch
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    out = []
    initialized = False
    for model_dir in dirs:
        args = EngineArgs(model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=256, enforce_eager=True)
        vllm_config = args.create_engine_config()
        model_config = vllm_config.model_config
        with set_current_vllm_config(vllm_config):
            if not initialized:
                _init_distributed()
                initialized = True
            start = time.perf_counter()
            with set_default_torch_dtype(model_config.dtype), torch.device("cpu"):
                model = initialize_model(vllm_config=vllm_config, model_config=model_config)
            params = dict(model.named_parameters())
            with torch.no_grad():
                for p in params.values():
                    p.fill_(float("nan"))
            loader = get_model_loader(vllm_config.load_config)
            returned: set[str] = set()
            original = model.load_weights

            def recording(weights, _original=original, _returned=returned):
                result = _original(weights)
                _returned.update(result)
                return result

            model.load_weights = recording
            loader.load_weights(model, model_config)
            process_weights_after_loading(model, model_config, torch.device("cpu"))
            seconds = time.perf_counter() - start
        state = {}
        for file in sorted(Path(model_dir).glob("*.safetensors")):
            state.update(load_file(str(file)))
        layer0 = "model.layers.0.self_attn"
        qkv = torch.cat([state[f"{layer0}.{n}_proj.weight"] for n in "qkv"])
        spot = {
            "embed_tokens": torch.equal(params["model.embed_tokens.weight"], state["model.embed_tokens.weight"]),
            "qkv_proj": torch.equal(params[f"{layer0}.qkv_proj.weight"], qkv),
            "final_norm": torch.equal(params["model.norm.weight"], state["model.norm.weight"]),
        }
        out.append({
            "dir": model_dir, "arch": model_config.architectures[0], "module": type(model).__module__,
            "qualname": type(model).__qualname__, "params": sorted(params), "returned": sorted(returned),
            "nan_params": sorted(n for n, p in params.items() if torch.isnan(p).any()),
            "attention_layers": sorted(vllm_config.compilation_config.static_forward_context),
            "spot_checks": spot, "seconds": round(seconds, 2),
        })
    return out


def generate(dirs: list[str], prompts: list[list[int]], max_tokens: int) -> list[dict]:
    # The engine core and its worker in this process: no process start-ups (each re-imports vLLM), and
    # apply_model can run a plain function on the model.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    out = []
    for model_dir in dirs:
        start = time.perf_counter()
        llm = LLM(model=model_dir, skip_tokenizer_init=True, enforce_eager=True, dtype="float32", max_model_len=256,
                  max_num_seqs=4, seed=0)
        started = time.perf_counter() - start
        module, qualname = llm.apply_model(lambda model: (type(model).__module__, type(model).__qualname__))[0]
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        out.append({"dir": model_dir, "module": module, "qualname": qualname,
                    "tokens": [list(r.outputs[0].token_ids) for r in results],
                    "startup_seconds": round(started, 1), "seconds": round(time.perf_counter() - start, 1)})
        del llm
        _release()
    return out


def _release() -> None:
    import gc

    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    gc.collect()
    cleanup_dist_env_and_memory()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["resolve", "construct", "generate"])
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts", default="[[1, 2, 3, 4]]")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--inspect", choices=["yes", "no"], default="yes")
    args = parser.parse_args()
    if args.command == "resolve":
        result = resolve(args.dirs, inspect=args.inspect == "yes")
    elif args.command == "construct":
        result = construct(args.dirs)
    else:
        result = generate(args.dirs, json.loads(args.prompts), args.max_tokens)
    Path(args.out).write_text(json.dumps(result, indent=1))
    os._exit(0)  # vLLM's background threads sometimes keep a finished process alive


if __name__ == "__main__":
    main()
