"""The quantization interface every scheme implements, and the scheme registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from atom_core.config_checks import config_file
from atom_core.errors import CheckpointError, UnsupportedQuantizationError
from atom_core.layers.params import make_param
from atom_core.quant.exclusions import in_model_names

if TYPE_CHECKING:
    from atom_core.layers.linear import LinearBase


class LinearMethod:
    """How one linear layer stores and applies its weight."""

    def create_weights(self, layer: LinearBase, params_dtype: torch.dtype) -> None:
        raise NotImplementedError

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        """Convert on-disk layouts into the layout the kernel wants (after every tensor is loaded)."""


class UnquantizedLinearMethod(LinearMethod):
    def create_weights(self, layer: LinearBase, params_dtype: torch.dtype) -> None:
        layer.weight = make_param(
            (sum(layer.out_partitions), layer.in_partition), params_dtype, output_dim=0, input_dim=1
        )

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)


class QuantConfig:
    """A parsed ``quantization_config``.  Subclasses register under their ``quant_method`` names."""

    name: str = ""
    # The model's fused modules and the checkpoint modules each is made of (``{"qkv_proj": ["q_proj",
    # "k_proj", "v_proj"]}``): exclusion lists name checkpoint modules.  Set by parse_quant_config.
    packed_modules_mapping: dict[str, list[str]] = {}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> QuantConfig:
        raise NotImplementedError

    def linear_method(self, layer: LinearBase, prefix: str) -> LinearMethod | None:
        """The method for the layer at ``prefix``; None keeps it unquantized (excluded layers)."""
        raise NotImplementedError


_SCHEMES: dict[str, type[QuantConfig]] = {}


def register_scheme(*quant_methods: str):
    def wrap(cls: type[QuantConfig]) -> type[QuantConfig]:
        for method in quant_methods:
            _SCHEMES[method] = cls
        return cls

    return wrap


_ONLINE: list[type[QuantConfig]] = []  # the scheme that quantizes unquantized checkpoints at load (quant.online)


def register_online_scheme(cls: type[QuantConfig]) -> type[QuantConfig]:
    _ONLINE[:] = [cls]
    return cls


def supported_schemes() -> list[str]:
    return sorted(_SCHEMES)


def parse_quant_config(hf_config: Any, online: str | None = None,
                       packed_modules: dict[str, list[str]] | None = None,
                       rename: Callable[[str], str] | None = None) -> QuantConfig | None:
    """The scheme of a checkpoint's ``quantization_config`` (None when unquantized), or, with
    ``online``, the scheme that quantizes an unquantized checkpoint's weights at load.
    ``packed_modules``: the model's ``packed_modules_mapping`` (how exclusions reach fused layers); ``rename``: the
    model's checkpoint-to-parameter renames (``WeightMapper.rename``), which exclusion lists' module names go
    through (:func:`atom_core.quant.exclusions.in_model_names`)."""
    qcfg = getattr(hf_config, "quantization_config", None)
    if qcfg and not isinstance(qcfg, dict):
        if not hasattr(qcfg, "to_dict"):
            raise CheckpointError(f"{config_file(hf_config)}: quantization_config must be an object (with "
                                  f"quant_method), got {qcfg!r}")
        qcfg = qcfg.to_dict()
    if qcfg and rename is not None:
        qcfg = in_model_names(qcfg, rename)
    if online:
        if qcfg:
            raise UnsupportedQuantizationError(
                f"the checkpoint is already quantized ({qcfg.get('quant_method')!r}); online {online!r} applies to "
                "unquantized checkpoints only"
            )
        config = _ONLINE[0].from_config({"quant_method": online, "online": True})
    elif not qcfg:
        return None
    else:
        config = _scheme_of(qcfg)
    config.packed_modules_mapping = dict(packed_modules or {})
    return config


def _scheme_of(qcfg: dict[str, Any]) -> QuantConfig:
    method = qcfg.get("quant_method")
    if method not in _SCHEMES:
        raise UnsupportedQuantizationError(
            f"unsupported quantization scheme {method!r}; supported: {', '.join(supported_schemes()) or 'none'}"
        )
    return _SCHEMES[method].from_config(qcfg)
