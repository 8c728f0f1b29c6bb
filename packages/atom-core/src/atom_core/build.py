"""The one way every host builds a model: the catalog entry of the config, the quantization scheme of the
checkpoint with the model's fused-layer map and renames (so an exclusion list that names ``q_proj``, ``k_proj``,
``v_proj`` reaches the fused ``qkv_proj``, and one naming modules as a published checkpoint does reaches ATOM's layers,
the same way on every host), the host object over that scheme, then the model.

The native runner, the vLLM adapter and the SGLang adapter all call :func:`build_model`; a host contributes only
its host object (``make_host``) and, for the adapters, the wrapper instance the model is built into (their wrapper
classes inherit from ATOM's model class, so the host's loader sees one module tree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from atom_core import catalog
from atom_core.host import Host
from atom_core.quant import QuantConfig, parse_quant_config

H = TypeVar("H", bound=Host)


@dataclass(frozen=True)
class ModelPlan:
    """What a host needs before it builds: the catalog entry, ATOM's model class and the parsed scheme."""

    spec: catalog.ArchSpec
    model_class: type
    quant: QuantConfig | None


def plan_model(hf_config: Any, *, spec: catalog.ArchSpec | None = None, online: str | None = None) -> ModelPlan:
    """The plan of ``hf_config``'s model.  ``spec``: the catalog entry when the host already chose it (an adapter's
    wrapper class is one entry's); ``online``: a scheme quantizing an unquantized checkpoint at load."""
    spec = spec or catalog.resolve(hf_config)
    model_class = spec.model_class()
    quant = parse_quant_config(hf_config, online=online, packed_modules=model_class.packed_modules_mapping(),
                               rename=model_class.weight_mapper.rename)
    return ModelPlan(spec, model_class, quant)


def build_model(hf_config: Any, make_host: Callable[[QuantConfig | None], H], *, into: Any = None, prefix: str = "",
                spec: catalog.ArchSpec | None = None, online: str | None = None, **model_kwargs: Any) -> tuple[Any, H]:
    """Build ``hf_config``'s model over the host ``make_host(quant)`` returns; returns ``(model, host)``.

    ``into``: an instance of a subclass of the model class, not yet initialised (an adapter's wrapper), which is
    initialised in place; otherwise a new instance of the model class is made.  ``model_kwargs``: the model class's
    own keyword arguments (an EAGLE-3 draft's ``target``)."""
    plan = plan_model(hf_config, spec=spec, online=online)
    host = make_host(plan.quant)
    if into is None:
        return plan.model_class(hf_config, host, prefix, **model_kwargs), host
    if not isinstance(into, plan.model_class):
        raise TypeError(f"{type(into).__name__} is not a {plan.model_class.__name__}: it cannot be built as "
                        f"{plan.spec.name}")
    plan.model_class.__init__(into, hf_config, host, prefix, **model_kwargs)
    return into, host
