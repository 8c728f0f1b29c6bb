"""Shared fixtures: tiny random checkpoints written by transformers, and their HF reference models."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

# On a machine without a GPU the Triton kernels run through Triton's interpreter on CPU tensors.
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
MODEL_DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# transformers binds flash-linear-attention's Triton kernels in place of its own torch Gated DeltaNet code when
# fla imports (decided once, when its model module is imported); the reference models here run on the CPU and
# must be transformers' torch code, so fla is made unimportable in the test process (benches run apart).
sys.modules.setdefault("fla", None)

from atom_core.tiny import make_tiny, save_reference  # noqa: E402

_CACHE: dict[tuple, str] = {}


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """``tiny(arch, **overrides) -> dir``: a tiny random checkpoint, built once per session per arguments."""

    def build(arch: str, *, seed: int = 0, max_shard_size=None, **overrides) -> str:
        key = (arch, seed, max_shard_size, tuple(sorted(overrides.items(), key=lambda kv: kv[0])).__repr__())
        if key not in _CACHE:
            out = tmp_path_factory.mktemp(arch)
            make_tiny(arch, out, seed=seed, max_shard_size=max_shard_size, **overrides)
            _CACHE[key] = str(out)
        return _CACHE[key]

    return build


@pytest.fixture(params=MODEL_DEVICES)
def device(request):
    """Where a model can run here (the CPU always, with the reference kernels)."""
    return request.param


def hf_model(model_dir: str, dtype=torch.float32, device="cpu"):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()


def with_random_correction_bias(src: str, dst: Path) -> str:
    """A copy (at ``dst``, written once) of the checkpoint at ``src`` whose routers' ``e_score_correction_bias``
    buffers are random: transformers starts them at zero, which would leave the bias path of the routing untested."""
    if not (dst / "config.json").exists():
        model = hf_model(src)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    buffer.copy_(torch.randn(buffer.shape, generator=gen) * 0.05)
        model.save_pretrained(str(dst))
        for extra in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(src) / extra, dst / extra)
    return str(dst)


def with_random_vectors(src: str, dst: Path, scale: float = 0.1) -> str:
    """A copy (at ``dst``, written once) of the checkpoint at ``src`` whose 1-D tensors (norm weights, biases,
    routers' correction biases) have ``scale``·N(0, 1) added: transformers starts them at one or zero, which would
    leave a norm applied over the wrong features, a missing bias or an unread correction bias untested."""
    if not (dst / "config.json").exists():
        import transformers

        config = transformers.AutoConfig.from_pretrained(src)
        from atom_core import catalog

        spec = catalog.resolve(config)
        model = spec.hf_model_class().from_pretrained(src, dtype=torch.float32).eval()
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for tensor in model.state_dict().values():
                if tensor.dim() == 1 and tensor.is_floating_point():
                    tensor.add_(torch.randn(tensor.shape, generator=gen) * scale)
        save_reference(model, spec.name, dst)
        for extra in Path(src).iterdir():
            if extra.name.startswith(("tokenizer", "preprocessor", "processor", "chat_template")):
                shutil.copy(extra, dst / extra.name)
    return str(dst)
