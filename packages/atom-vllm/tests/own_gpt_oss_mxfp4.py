"""vLLM's own GptOssForCausalLM (atom-vllm's plugin off) built on the CPU from a gpt-oss MXFP4 checkpoint, and its
loader fed that checkpoint; reports, as JSON, what happened.

    python own_gpt_oss_mxfp4.py MODEL_DIR OUT_JSON

First as vLLM builds it (``GptOssMxfp4MoEMethod`` picks an MXFP4 MoE kernel); where vLLM refuses (no kernel for
this machine), ``refused`` holds its message and the model is built again with the kernel choice answered "none"
(``Mxfp4MoeBackend.NONE``: vLLM's own weights, created and loaded by its own code, left unconverted), so the
checkpoint's layout still goes through vLLM's ``_load_weights_mxfp4``.  ``loaded``: per expert tensor of layer 0,
whether vLLM's parameter holds the checkpoint's bytes (its parameters may be padded: compared on the checkpoint's
extent).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

NO_KERNEL = "No MXFP4 MoE backend supports"


def build_and_load(model_dir: str) -> dict:
    import torch
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm_probe import _init_distributed

    args = EngineArgs(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256, enforce_eager=True)
    vllm_config = args.create_engine_config()
    model_config = vllm_config.model_config
    with set_current_vllm_config(vllm_config):
        _init_distributed()
        with set_default_torch_dtype(model_config.dtype), torch.device("cpu"):
            model = initialize_model(vllm_config=vllm_config, model_config=model_config)
        get_model_loader(vllm_config.load_config).load_weights(model, model_config)
    modules = dict(model.named_modules())
    experts = next(m for name, m in modules.items() if name.startswith("model.layers.0.mlp.experts") and
                   hasattr(m, "w13_weight"))
    state = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        state.update(load_file(str(file)))
    prefix = "model.layers.0.mlp.experts."
    pairs = {"w13_weight": "gate_up_proj_blocks", "w13_weight_scale": "gate_up_proj_scales", "w2_weight": "down_proj_blocks",
             "w2_weight_scale": "down_proj_scales", "w13_bias": "gate_up_proj_bias", "w2_bias": "down_proj_bias"}
    loaded = {}
    for param, tensor in pairs.items():
        want = state[prefix + tensor]
        if tensor.endswith("_blocks"):
            want = want.reshape(*want.shape[:2], -1)  # [E, N, K/32, 16] -> [E, N, K/2]
        got = getattr(experts, param).data
        got = got[tuple(slice(0, size) for size in want.shape)]
        loaded[param] = bool(torch.equal(got, want.to(got.dtype)))
    return {"class": f"{type(model).__module__}.{type(model).__qualname__}",
            "moe_method": type(experts.quant_method).__name__, "loaded": loaded}


def main(model_dir: str, out: str) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from vllm_probe import _cpu_platform_without_triton, _force_cpu_platform

    _force_cpu_platform()
    _cpu_platform_without_triton()
    result: dict = {}
    try:
        result.update(build_and_load(model_dir))
    except NotImplementedError as err:
        if NO_KERNEL not in str(err):
            raise
        result["refused"] = str(err).split(" Candidate backends")[0]
        result["reasons"] = str(err)
        import vllm.model_executor.layers.quantization.mxfp4 as vllm_mxfp4
        from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend

        vllm_mxfp4.select_mxfp4_moe_backend = lambda moe, *args, **kwargs: (Mxfp4MoeBackend.NONE, None)
        result.update(build_and_load(model_dir))
    Path(out).write_text(json.dumps(result, indent=1))
    os._exit(0)  # vLLM's background threads sometimes keep a finished process alive


if __name__ == "__main__":
    main(*sys.argv[1:3])
