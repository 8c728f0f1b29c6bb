"""Running code in a fresh Python process with (or without) ATOM's models selected."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from atom_sglang.compat import ByRelease
from atom_sglang.contract import Symbol

PACKAGE = "atom_sglang.models"

# The SGLang symbols this harness (not the adapter) relies on where the supported releases differ; test_contract
# checks them beside atom_sglang.contract.CONTRACT, and the ByRelease tables below pick among them.
HARNESS: tuple[Symbol, ...] = (
    Symbol("sglang.srt.runtime_context:publish", ("server_args", "role"), used_by="start_cpu_runtime",
           releases="<0.5.21"),
    Symbol("sglang.srt.runtime_context:publish", ("server_args", "role", "ranks"), used_by="start_cpu_runtime",
           releases=">=0.5.21"),
    Symbol("sglang.srt.runtime_context:SpawnRanks", fields=("world_rank",), used_by="start_cpu_runtime",
           releases=">=0.5.21"),
    Symbol("sglang.srt.managers.mm_utils:init_mm_embedding_cache", ("max_size",),
           used_by="_sglang_batch.SGLangCPUBatch", releases="<0.5.18"),
    Symbol("sglang.srt.managers.mm_schedule:init_mm_embedding_cache", ("max_size",),
           used_by="_sglang_batch.SGLangCPUBatch", releases=">=0.5.18"),
    Symbol("sglang.srt.layers.attention.linear.utils:resolve_linear_attn_backends", (),
           used_by="_sglang_batch.SGLangCPUBatch (ModelRunner.linear_attn_backends)", releases=">=0.5.18"),
    Symbol("sglang.srt.configs.linear_attn_model_registry:get_linear_attn_config", ("hf_config",),
           used_by="test_contract (SGLang's ModelConfig finds a hybrid spec by config class)"),
    Symbol("sglang.srt.configs.linear_attn_model_registry:get_linear_attn_spec_by_arch", ("arch_name",),
           used_by="test_contract"),
    Symbol("sglang.srt.layers.dp_attention:initialize_dp_attention", ("server_args", "model_config"),
           used_by="start_cpu_runtime", releases="<0.5.21"),
    Symbol("sglang.srt.configs.model_config:ModelConfig.__init__", ("self", "model_path", "dtype", "is_draft_model"),
           used_by="test_speculative.load_draft (a draft as SGLang's EAGLE worker configures it)"),
    Symbol("sglang.srt.speculative.draft_utils:DraftBackendFactory.__init__",
           ("self", "draft_model_runner", "topk", "speculative_num_steps"),
           used_by="test_speculative (SGLang's draft backends refuse torch_native)", releases=">=0.5.21"),
)



def _spawn_ranks() -> dict:
    from sglang.srt.runtime_context import SpawnRanks

    return {"ranks": SpawnRanks(world_rank=0)}


# What publish() is handed beside the server arguments: 0.5.21+ takes the launcher's placement (rank 0 of one);
# before, SGLang read the ranks from its process groups when asked.
PUBLISH_PLACEMENT: ByRelease = ByRelease("the launcher's placement at publish", {
    "<0.5.21": dict,
    ">=0.5.21": _spawn_ranks,
})


def _init_dp_attention(model_path: str) -> None:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.dp_attention import initialize_dp_attention
    from sglang.srt.runtime_context import get_server_args

    initialize_dp_attention(get_server_args(), ModelConfig(model_path=model_path))


# SGLang's attention data-parallel size, which its own layers (LayerCommunicator: the MTP drafts test_speculative
# builds) ask for: before 0.5.21 its ModelRunner set it up (initialize_dp_attention; checked on 0.5.17), from 0.5.21
# the published placement answers.
DP_ATTENTION: ByRelease = ByRelease("the attention data-parallel setup", {
    "<0.5.21": _init_dp_attention,
    ">=0.5.21": lambda model_path: None,
})


def run_fresh(code: str, *, external_package: str | None = PACKAGE, timeout: int = 600,
              env: dict[str, str | None] | None = None, stderr: list[str] | None = None) -> dict:
    """Run ``code`` in a new interpreter; it must print one JSON object as its last stdout line.  ``env``: variables
    to set, or to unset with None; ``stderr``: a list the process's stderr is appended to."""
    full_env = dict(os.environ)
    full_env.pop("SGLANG_EXTERNAL_MODEL_PACKAGE", None)
    if external_package is not None:
        full_env["SGLANG_EXTERNAL_MODEL_PACKAGE"] = external_package
    for key, value in (env or {}).items():
        full_env.pop(key, None)
        if value is not None:
            full_env[key] = value
    result = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"subprocess failed ({result.returncode}):\n{result.stderr[-6000:]}")
    if stderr is not None:
        stderr.append(result.stderr)
    return json.loads(result.stdout.strip().splitlines()[-1])


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cpu_runtime(model_path: str) -> None:
    """SGLang's runtime as its scheduler sets it up, minus the GPU: server arguments published with
    ``device="cpu"``, a gloo process group of one, SGLang's model-parallel groups."""
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import ServerArgs

    publish(ServerArgs(model_path=model_path, device="cpu"), role="test", **PUBLISH_PLACEMENT.get()())
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
    initialize_model_parallel(backend="gloo")
    DP_ATTENTION.get()(model_path)


def stop_cpu_runtime() -> None:
    from sglang.srt.distributed import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()


def load_with_sglang(path: str, dtype: str = "float32"):
    """What SGLang's ModelRunner does: ModelConfig -> DefaultModelLoader.load_model (construction under
    the model dtype, SGLang's safetensors iterator into load_weights, then its post-load processing)."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    model_config = ModelConfig(model_path=path, dtype=dtype)
    return DefaultModelLoader(LoadConfig()).load_model(model_config=model_config, device_config=DeviceConfig("cpu"))
