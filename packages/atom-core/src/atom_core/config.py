"""Typed view of a Hugging Face ``config.json``: the fields ATOM's models read, normalised across
transformers' spellings (``rope_parameters`` vs ``rope_theta``/``rope_scaling``, missing ``head_dim``,
multimodal configs that nest a ``text_config``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atom_core.config_checks import validate_config, validate_raw_config
from atom_core.errors import CheckpointError, UnsupportedArchitectureError
from atom_core.paths import inside, read_json_object


def load_hf_config(model_dir: str | Path):
    """The transformers config object of a local checkpoint directory, validated
    (:func:`atom_core.config_checks.validate_config`); a missing directory, a missing or malformed ``config.json``
    (a link out of the directory, no ``model_type``) is a :class:`CheckpointError` naming it, an unknown
    ``model_type`` an :class:`UnsupportedArchitectureError`.  Checkpoint code (``auto_map``) never runs:
    transformers is called with ``trust_remote_code=False``."""
    path = Path(model_dir)
    if not path.is_dir():
        raise CheckpointError(f"{path} {'is not a directory' if path.exists() else 'does not exist'}")
    file = inside(path, "config.json")
    if not file.is_file():
        raise CheckpointError(f"{path} has no config.json")
    data = read_json_object(file)
    validate_raw_config(data, str(file))
    from transformers import CONFIG_MAPPING, AutoConfig

    model_type = data.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise CheckpointError(f"{file}: model_type must be a string, got {model_type!r}")
    if model_type is None:
        code = " (it names checkpoint code in auto_map, which ATOM never runs)" if "auto_map" in data else ""
        raise CheckpointError(f"{file} has no model_type{code}; ATOM supports: {', '.join(_supported())}")
    if model_type not in CONFIG_MAPPING:
        raise UnsupportedArchitectureError(
            f"{file}: model_type {model_type!r} is unknown to transformers; ATOM supports: {', '.join(_supported())}"
        )
    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except (ValueError, TypeError, KeyError, _strict_dataclass_error()) as err:
        raise CheckpointError(f"{file}: {' '.join(str(err).split())}") from err
    validate_config(config, where=str(file))
    return config


def _supported() -> list[str]:
    from atom_core import catalog

    return catalog.supported()


def _strict_dataclass_error() -> type[Exception]:
    """What transformers 5's config validators raise (huggingface_hub's, not a ValueError)."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ValueError
    return StrictDataclassError


def text_config(hf_config: Any) -> Any:
    """The language-model part of a (possibly multimodal) config."""
    getter = getattr(hf_config, "get_text_config", None)
    return getter() if getter is not None else hf_config


def rope_parameters(cfg: Any) -> dict[str, Any]:
    """Rope settings as one flat dict with at least ``rope_type`` and ``rope_theta``."""
    params = getattr(cfg, "rope_parameters", None)
    if params:
        params = dict(params)
    else:
        params = dict(getattr(cfg, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.pop("type", "default"))
    if params["rope_type"] in ("llama3", "yarn", "longrope"):
        params.setdefault("original_max_position_embeddings", cfg.max_position_embeddings)
    prf = getattr(cfg, "partial_rotary_factor", None)
    if prf is None and getattr(cfg, "rotary_dim", None):  # the legacy spelling (MiniMax-M2's configs)
        prf = cfg.rotary_dim / (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    if prf is not None:
        params.setdefault("partial_rotary_factor", prf)
    return params


@dataclass(frozen=True)
class DecoderConfig:
    """What a standard decoder-only transformer reads from its config."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int | None  # None: the config has no dense MLP size (every layer a mixture of experts)
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position: int
    rope: dict[str, Any]
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    sliding_windows: tuple[int | None, ...]  # per layer; None = full attention

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rope.get("partial_rotary_factor", 1.0))

    @classmethod
    def from_hf(cls, hf_config: Any) -> DecoderConfig:
        cfg = text_config(hf_config)
        num_heads = cfg.num_attention_heads
        num_kv_heads = getattr(cfg, "num_key_value_heads", None) or num_heads
        where = Path(getattr(hf_config, "name_or_path", "") or "") / "config.json"
        check_heads(cfg.hidden_size, num_heads, num_kv_heads, getattr(cfg, "head_dim", None), where=str(where))
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads
        num_layers = cfg.num_hidden_layers
        return cls(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=getattr(cfg, "intermediate_size", None),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=getattr(cfg, "rms_norm_eps", 1e-6),
            max_position=cfg.max_position_embeddings,
            rope=rope_parameters(cfg),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            attention_bias=bool(getattr(cfg, "attention_bias", False)),
            mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
            sliding_windows=sliding_windows(cfg, num_layers),
        )


def check_heads(hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int | None, *,
                where: str = "config.json") -> None:
    """Attention head counts that fit together: a :class:`CheckpointError` naming the config fields otherwise."""
    for name, value in (("hidden_size", hidden_size), ("num_attention_heads", num_heads),
                        ("num_key_value_heads", num_kv_heads), ("head_dim", head_dim)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise CheckpointError(f"{where}: {name} must be a positive integer, got {value!r}")
    if num_heads % num_kv_heads:
        raise CheckpointError(
            f"{where}: num_attention_heads ({num_heads}) is not a multiple of num_key_value_heads ({num_kv_heads})"
        )
    if head_dim is None and hidden_size % num_heads:
        raise CheckpointError(
            f"{where}: hidden_size ({hidden_size}) is not a multiple of num_attention_heads ({num_heads}) "
            "and no head_dim is given"
        )


def hybrid_layer_types(cfg: Any) -> list[str]:
    """Per-layer mixer of a hybrid linear-attention decoder (``"linear_attention"`` or ``"full_attention"``):
    ``layer_types`` when the config has it, else transformers' rule for configs that give
    ``full_attention_interval`` instead (every interval-th layer full attention, default 4) — SGLang builds
    models with its own config classes, which keep the interval and drop ``layer_types``."""
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types:
        return list(layer_types)
    interval = getattr(cfg, "full_attention_interval", None) or 4
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(cfg.num_hidden_layers)]


def sliding_windows(cfg: Any, num_layers: int) -> tuple[int | None, ...]:
    """Per-layer sliding window, following transformers' rules: ``layer_types`` when present,
    else ``sliding_window`` for every layer unless ``use_sliding_window`` is False."""
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types:
        return tuple(window if t == "sliding_attention" else None for t in layer_types[:num_layers])
    if getattr(cfg, "use_sliding_window", True) is False:
        return (None,) * num_layers
    return (window,) * num_layers
