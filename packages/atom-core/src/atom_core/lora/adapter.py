"""A LoRA adapter as peft saves one: a directory holding ``adapter_config.json`` and ``adapter_model.safetensors``.

An adapter directory is untrusted input, like a checkpoint: its files are opened through
:func:`atom_core.paths.inside`, nothing is unpickled (safetensors only), and every field ATOM relies on is checked
with a one-line error naming the file and the field.  What ATOM cannot apply (DoRA, trained biases, extra trained
modules, per-module rank patterns, weights stored transposed) is refused by name rather than ignored.

peft names each weight ``base_model.model.<module>.lora_A.weight`` (``[r, in]``) and ``...lora_B.weight``
(``[out, r]``), where ``<module>`` is the base checkpoint's module name; the delta a module adds to its output
is ``scaling · x Aᵀ Bᵀ`` with ``scaling = lora_alpha / r`` (``lora_alpha / √r`` with ``use_rslora``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from atom_core.errors import CheckpointError, UnsupportedConfigError, UsageError
from atom_core.paths import inside, read_json_object

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
WEIGHT = re.compile(r"(?P<module>.+)\.lora_(?P<part>[AB])\.weight")

# adapter_config.json fields whose non-default values ask for something ATOM does not apply
REFUSED_FIELDS = {
    "use_dora": "DoRA (use_dora)",
    "fan_in_fan_out": "weights stored transposed (fan_in_fan_out)",
    "modules_to_save": "extra trained modules (modules_to_save)",
    "rank_pattern": "per-module ranks (rank_pattern)",
    "alpha_pattern": "per-module alphas (alpha_pattern)",
    "lora_bias": "trained LoRA biases (lora_bias)",
    "trainable_token_indices": "trained token embeddings (trainable_token_indices)",
}


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter: ``modules`` maps a base-checkpoint module name (``model.layers.0.self_attn.q_proj``) to its
    ``(A [r, in], B [out, r])`` in float32; ``scaling`` multiplies the delta."""

    name: str
    path: Path
    rank: int
    scaling: float
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]]


def check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise UsageError(f"adapter name {name!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a letter "
                         "or digit")
    return name


def parse_lora_option(value: str) -> tuple[str, Path]:
    """``NAME=PATH`` (the ``--lora`` option) -> (name, path)."""
    name, sep, path = value.partition("=")
    if not sep or not path:
        raise UsageError(f"--lora {value!r}: expected NAME=PATH (an adapter name and a peft adapter directory)")
    return check_name(name), Path(path)


def _read_config(path: Path) -> dict:
    try:
        return read_json_object(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: a LoRA adapter directory holds {ADAPTER_CONFIG} (as peft saves "
                              "it)") from None


def _scaling(config: dict, path: Path) -> tuple[int, float]:
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise UnsupportedConfigError(f"{path}: peft_type {peft_type!r} is not supported (ATOM applies LORA adapters)")
    for field, what in REFUSED_FIELDS.items():
        if config.get(field):
            raise UnsupportedConfigError(f"{path}: {field} = {config[field]!r}: {what} is not supported")
    if config.get("bias", "none") != "none":
        raise UnsupportedConfigError(f"{path}: bias = {config['bias']!r}: trained biases are not supported (only 'none')")
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise CheckpointError(f"{path}: r must be a positive integer, got {rank!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise CheckpointError(f"{path}: lora_alpha must be a finite number, got {alpha!r}")
    rslora = config.get("use_rslora", False)
    if not isinstance(rslora, bool):
        raise CheckpointError(f"{path}: use_rslora must be true or false, got {rslora!r}")
    return rank, alpha / (math.sqrt(rank) if rslora else rank)


def _modules(weights: dict[str, torch.Tensor], rank: int, path: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in weights.items():
        name = key.removeprefix(PEFT_PREFIX)
        match = WEIGHT.fullmatch(name)
        if match is None:
            raise UnsupportedConfigError(f"{path}: tensor {key!r} is not a LoRA A/B weight (ATOM applies lora_A/lora_B "
                                         "pairs only)")
        if tensor.dim() != 2 or not tensor.dtype.is_floating_point:
            raise CheckpointError(f"{path}: tensor {key!r} must be a 2-d floating-point matrix, got "
                                  f"{tuple(tensor.shape)} {tensor.dtype}")
        parts.setdefault(match["module"], {})[match["part"]] = tensor.float()
    modules = {}
    for module, pair in parts.items():
        if set(pair) != {"A", "B"}:
            missing = "lora_B" if "A" in pair else "lora_A"
            raise CheckpointError(f"{path}: module {module!r} has no {missing}.weight")
        a, b = pair["A"], pair["B"]
        if a.shape[0] != rank or b.shape[1] != rank:
            raise CheckpointError(f"{path}: module {module!r}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} "
                                  f"do not have rank r = {rank} (A [r, in], B [out, r])")
        modules[module] = (a, b)
    if not modules:
        raise CheckpointError(f"{path} holds no LoRA weights")
    return modules


def load_adapter(name: str, directory: str | Path) -> LoraAdapter:
    """Read and check the peft adapter in ``directory``, served under ``name``."""
    name = check_name(name)
    directory = Path(directory)
    if not directory.is_dir():
        raise UsageError(f"adapter {name}: {directory} is not a directory (a peft adapter directory holds "
                         f"{ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    config_path = inside(directory, ADAPTER_CONFIG)
    rank, scaling = _scaling(_read_config(config_path), config_path)
    weights_path = inside(directory, ADAPTER_WEIGHTS)
    if not weights_path.is_file():
        raise CheckpointError(f"{weights_path} is missing: ATOM reads adapter weights from safetensors only")
    try:
        weights = load_file(weights_path)
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{weights_path} is not a readable safetensors file: {err}") from None
    return LoraAdapter(name, directory, rank, scaling, _modules(weights, rank, weights_path))
