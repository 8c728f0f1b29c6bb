"""One validation of a checkpoint's config, before anything is allocated for it.

:func:`validate_config` runs where every model is built, whatever the host (``CausalLM.__init__``), and, for the
native runner and the ``atom`` command, as soon as ``config.json`` is read (:func:`atom_core.config.load_hf_config`).
Each problem is a :class:`CheckpointError` naming ``config.json`` and the field, or an
:class:`UnsupportedConfigError` for a well-formed value ATOM will not build (a rotary table too large to hold).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from atom_core.errors import CheckpointError, UnsupportedConfigError

# sizes every decoder has: positive integers
REQUIRED_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings")
# sizes some configs have: positive integers when given (None: absent)
OPTIONAL_SIZES = (
    "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size", "num_experts", "num_local_experts",
    "n_routed_experts", "num_experts_per_tok", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "linear_conv_kernel_dim",
)
VISION_SIZES = ("depth", "hidden_size", "num_heads", "patch_size", "spatial_merge_size", "temporal_patch_size",
                "out_hidden_size", "num_position_embeddings")
EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")
# A rotary cos/sin table covers every position a host may run: fp32, rotary_dim wide (8 GiB at rotary_dim 128).
# A host that says how long its sequences get (the native runner, sized by what it runs) needs no more than that;
# for one that does not, max_position_embeddings above this is refused rather than allocated.
MAX_TABLE_POSITIONS = 1 << 24


def config_file(hf_config: Any) -> str:
    """How messages name a config: its ``config.json`` when the config knows its directory."""
    where = getattr(hf_config, "name_or_path", "") or getattr(hf_config, "_name_or_path", "") or ""
    return str(Path(where) / "config.json") if where else "config.json"


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _text(hf_config: Any) -> tuple[Any, str]:
    getter = getattr(hf_config, "get_text_config", None)
    text = getter() if getter is not None else hf_config
    return text, ("text_config." if text is not hf_config else "")


def validate_config(hf_config: Any, *, host: Any = None, where: str | None = None) -> None:
    """Check the fields ATOM's models read from ``hf_config``; ``host``: the host the model is built for (its
    ``max_positions``, when it has one, bounds the rotary tables; None: no model is built yet, so no table)."""
    where = where or config_file(hf_config)
    text, prefix = _text(hf_config)

    def bad(field: str, value: Any, want: str) -> CheckpointError:
        return CheckpointError(f"{where}: {prefix}{field} must be {want}, got {value!r}")

    for field in REQUIRED_SIZES:
        value = getattr(text, field, None)
        if not _is_size(value):
            raise bad(field, value, "a positive integer")
    for field in OPTIONAL_SIZES:
        value = getattr(text, field, None)
        if value is not None and not _is_size(value):
            raise bad(field, value, "a positive integer (or absent)")
    window = getattr(text, "sliding_window", None)
    if window is not None and not (isinstance(window, int) and not isinstance(window, bool) and window >= 0):
        raise bad("sliding_window", window, "an integer >= 0 (or absent)")
    heads, kv_heads = text.num_attention_heads, getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    if heads % kv_heads:
        raise CheckpointError(f"{where}: {prefix}num_attention_heads ({heads}) is not a multiple of "
                              f"{prefix}num_key_value_heads ({kv_heads})")
    experts = next((getattr(text, f) for f in EXPERT_COUNTS if getattr(text, f, None)), None)
    top_k = getattr(text, "num_experts_per_tok", None)
    if experts and top_k and top_k > experts:
        raise CheckpointError(f"{where}: {prefix}num_experts_per_tok ({top_k}) is more than the {experts} experts")
    eps = getattr(text, "rms_norm_eps", None)
    if eps is not None and not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps)
                                and eps >= 0):
        raise bad("rms_norm_eps", eps, "a finite number >= 0")
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None and (not isinstance(layer_types, (list, tuple))
                                    or len(layer_types) != text.num_hidden_layers):
        raise bad("layer_types", layer_types, f"a list of {text.num_hidden_layers} layer types (num_hidden_layers)")
    for owner, field_prefix in ((hf_config, ""), (text, prefix)):
        tie = getattr(owner, "tie_word_embeddings", None)
        if tie is not None and not isinstance(tie, bool):
            raise CheckpointError(f"{where}: {field_prefix}tie_word_embeddings must be true or false, got {tie!r}")
    _check_rope(text, where, prefix)
    _check_quantization(hf_config, where)
    _check_vision(hf_config, where)
    _check_table(text, host, where, prefix)


def validate_raw_config(data: dict[str, Any], where: str) -> None:
    """The checks transformers' config classes need passed before they are built from ``data`` (``config.json``
    as read): nested configs and ``quantization_config`` are JSON objects."""
    for field in ("quantization_config", "text_config", "vision_config", "rope_parameters", "rope_scaling"):
        value = data.get(field)
        if value is not None and not isinstance(value, dict):
            raise CheckpointError(f"{where}: {field} must be a JSON object, got {value!r}")


def _check_rope(text: Any, where: str, prefix: str) -> None:
    params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"{where}: {prefix}rope_parameters must be an object, got {params!r}")
    theta = params.get("rope_theta", getattr(text, "rope_theta", None))
    for field, value in (("rope_theta", theta), ("factor", params.get("factor"))):
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                      and math.isfinite(value) and value > 0):
            raise CheckpointError(f"{where}: {prefix}rope_parameters.{field} must be a positive number, got {value!r}")


def _check_quantization(hf_config: Any, where: str) -> None:
    qcfg = getattr(hf_config, "quantization_config", None)
    if qcfg is None or isinstance(qcfg, dict) or hasattr(qcfg, "to_dict"):
        return
    raise CheckpointError(f"{where}: quantization_config must be an object (with quant_method), got {qcfg!r}")


def _check_vision(hf_config: Any, where: str) -> None:
    vision = getattr(hf_config, "vision_config", None)
    if vision is None:
        return
    for field in VISION_SIZES:
        value = getattr(vision, field, None)
        if value is not None and not _is_size(value):
            raise CheckpointError(f"{where}: vision_config.{field} must be a positive integer, got {value!r}")


def _check_table(text: Any, host: Any, where: str, prefix: str) -> None:
    positions = text.max_position_embeddings
    if host is not None and getattr(host, "max_positions", None) is None and positions > MAX_TABLE_POSITIONS:
        raise UnsupportedConfigError(
            f"{where}: {prefix}max_position_embeddings is {positions}; the rotary tables would cover that many "
            f"positions, and ATOM builds them for at most {MAX_TABLE_POSITIONS} (set max_position_embeddings to the "
            "longest sequence the model is meant for)"
        )
