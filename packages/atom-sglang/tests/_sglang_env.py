"""Running code in a fresh Python process with (or without) ATOM's models selected."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PACKAGE = "atom_sglang.models"


def run_fresh(code: str, *, external_package: str | None = PACKAGE, timeout: int = 600) -> dict:
    """Run ``code`` in a new interpreter; it must print one JSON object as its last stdout line."""
    env = dict(os.environ)
    env.pop("SGLANG_EXTERNAL_MODEL_PACKAGE", None)
    if external_package is not None:
        env["SGLANG_EXTERNAL_MODEL_PACKAGE"] = external_package
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"subprocess failed ({result.returncode}):\n{result.stderr[-6000:]}")
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
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    publish(ServerArgs(model_path=model_path, device="cpu"), role="test", ranks=SpawnRanks(world_rank=0))
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
    initialize_model_parallel(backend="gloo")


def stop_cpu_runtime() -> None:
    from sglang.srt.distributed import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()


def load_with_sglang(path: str):
    """What SGLang's ModelRunner does: ModelConfig -> DefaultModelLoader.load_model (construction under
    the model dtype, SGLang's safetensors iterator into load_weights, then its post-load processing)."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    model_config = ModelConfig(model_path=path, dtype="float32")
    return DefaultModelLoader(LoadConfig()).load_model(model_config=model_config, device_config=DeviceConfig("cpu"))
