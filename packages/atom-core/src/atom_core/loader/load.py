"""Placing checkpoint tensors into a model, with strict dtype, value and coverage checks.

* dtype, per tensor from the safetensors header (nothing extra is read): an unquantized (floating)
  parameter takes float16 / bfloat16 / float32 / float64 tensors (converted to the run dtype); a quantized
  one the dtype its scheme stores (FP8 e4m3 weights; uint8 or e8m0 bytes for MXFP4).  So FP8 or uint8
  weights in a checkpoint without a ``quantization_config`` are an error, not a silent cast.
* values: a parameter holding NaN or infinity after loading is an error (an error, not a warning: such a
  model produces NaN logits on every prompt that reaches the tensor).  The check is one ``aminmax``
  reduction per parameter on the device it lives on (FP8: two ``amax`` over its bytes), about 0.1 s per
  GB on a CPU core and negligible on a GPU.
* shapes and coverage: a tensor of the wrong shape, one the model does not use, or a parameter (or a
  shard of a fused one) no tensor wrote.
* files: a host that reads the checkpoint itself (vLLM, SGLang) sets ``model.checkpoint_dir``; a file its
  reader cannot open is then the :class:`CheckpointError` ATOM's own reader gives, naming the file
  (:func:`~atom_core.loader.checkpoint.host_tensors`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from atom_core.config_checks import config_file
from atom_core.errors import CheckpointError
from atom_core.layers.params import default_weight_loader
from atom_core.loader.checkpoint import host_tensors
from atom_core.loader.mapper import WeightMapper

logger = logging.getLogger(__name__)


def _expected_shards(param: nn.Parameter) -> frozenset:
    return frozenset(getattr(param, "shard_ids", (None,)))


def load_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, Any]],
    mapper: WeightMapper,
    *,
    strict: bool = True,
    skip_param: Any = None,
) -> set[str]:
    """Load ``(checkpoint_name, tensor)`` pairs into ``model``; returns the names of the parameters
    written completely.

    With ``strict``, a checkpoint tensor that maps to no parameter, or a parameter (or shard of a fused
    parameter) that no tensor wrote, is a :class:`CheckpointError` naming them.  ``skip_param``
    (name -> bool) marks parameters this process does not hold (pipeline stages elsewhere).  A safetensors
    file the iterator's reader cannot open is a :class:`CheckpointError` naming the file of
    ``model.checkpoint_dir`` (set by hosts that read the checkpoint themselves) that is broken.
    """
    params = dict(model.named_parameters())
    written: dict[str, set] = {}
    unconsumed: list[str] = []
    tied_copies: list[tuple[str, Any]] = []
    for checkpoint_name, tensor in host_tensors(weights, getattr(model, "checkpoint_dir", None)):
        if mapper.is_tied(checkpoint_name):
            tied_copies.append((checkpoint_name, tensor))
            continue
        targets = mapper.map(checkpoint_name)
        if targets is None:
            continue
        for target in targets:
            if skip_param is not None and skip_param(target.param):
                continue
            param = params.get(target.param)
            if param is None:
                unconsumed.append(checkpoint_name if target.param == checkpoint_name else f"{checkpoint_name} (as {target.param})")
                continue
            check_dtype(checkpoint_name, tensor, target.param, param.dtype)
            loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                loader(param, tensor, target.shard_id, **dict(target.kwargs))
            except (ValueError, RuntimeError) as err:
                raise CheckpointError(f"cannot load checkpoint tensor {checkpoint_name} into {target.param}: {err}") from err
            written.setdefault(target.param, set()).add(target.shard_id)
    for checkpoint_name, tensor in tied_copies:
        check_tied_copy(model, params, written, checkpoint_name, tensor, mapper, skip_param)
    complete = {name for name, shards in written.items() if None in shards or shards >= _expected_shards(params[name])}
    if strict:
        problems = []
        if unconsumed:
            problems.append(f"checkpoint tensors not used by the model: {_listing(unconsumed)}")
        missing = []
        for name, param in params.items():
            if name in complete or (skip_param is not None and skip_param(name)):
                continue
            got = written.get(name)
            if got:
                missing.append(f"{name} (shards {sorted(map(str, _expected_shards(param) - got))} never written)")
            else:
                missing.append(name)
        if missing:
            problems.append(f"model parameters the checkpoint did not provide: {_listing(missing)}")
        if problems:
            raise CheckpointError("; ".join(problems))
    check_finite(params, complete - {name for name in complete if skip_param is not None and skip_param(name)})
    process_after_loading(model)
    return complete


def check_tied_copy(model: nn.Module, params: dict[str, nn.Parameter], written: dict[str, set], checkpoint_name: str,
                    tensor: Any, mapper: WeightMapper, skip_param: Any) -> None:
    """A checkpoint tensor of a parameter the model ties to another (``lm_head.weight`` under
    ``tie_word_embeddings``), handled as transformers 5 handles it: when the shared parameter came from the
    checkpoint too, the two must be equal (transformers would otherwise keep them apart: ATOM refuses rather than
    give other answers); when it did not, the shared parameter is loaded from this tensor."""
    param = model.get_parameter(mapper.rename(checkpoint_name))
    shared = next(name for name, p in params.items() if p is param)
    if skip_param is not None and skip_param(shared):
        return
    loader = getattr(param, "weight_loader", default_weight_loader)
    if shared not in written:
        check_dtype(checkpoint_name, tensor, shared, param.dtype)
        loader(param, tensor)
        written[shared] = {None}
        return
    copy = nn.Parameter(torch.empty_like(param.data), requires_grad=False)
    try:
        loader(copy, tensor)
    except (ValueError, RuntimeError) as err:
        raise CheckpointError(f"cannot compare checkpoint tensor {checkpoint_name} with {shared}: {err}") from err
    if not torch.equal(copy.data, param.data):
        where = config_file(getattr(model, "config", None)) if getattr(model, "config", None) is not None else "config.json"
        raise CheckpointError(
            f"{where} sets tie_word_embeddings, but the checkpoint's {checkpoint_name} differs from its {shared}: "
            f"transformers would use {checkpoint_name} untied, ATOM ties them; set tie_word_embeddings to false to "
            f"use {checkpoint_name}, or remove it from the checkpoint to tie"
        )


FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# one-byte codes ATOM reads as raw bytes (MXFP4 weights and e8m0 scales); "F8_E8M0" when torch has no e8m0 dtype
RAW_BYTES = (torch.uint8, "F8_E8M0", *((torch.float8_e8m0fnu,) if hasattr(torch, "float8_e8m0fnu") else ()))
QUANTIZED = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, *RAW_BYTES)


def accepted_dtypes(param_dtype: torch.dtype) -> tuple:
    """The checkpoint dtypes a parameter of ``param_dtype`` loads from."""
    if param_dtype in FLOATS:
        return FLOATS
    if param_dtype == torch.uint8:
        return RAW_BYTES
    return (param_dtype,)


def check_dtype(checkpoint_name: str, tensor: Any, param_name: str, param_dtype: torch.dtype) -> None:
    """A :class:`CheckpointError` when ``tensor``'s dtype cannot be what ``param_name`` stores."""
    dtype = getattr(tensor, "dtype", None)
    accepted = accepted_dtypes(param_dtype)
    if dtype is None or dtype in accepted:
        return
    hint = ""
    if param_dtype in FLOATS and dtype in QUANTIZED:
        hint = ("; quantized weights need the checkpoint's quantization_config in config.json (missing, or one "
                "that leaves this layer unquantized)")
    into = f" (into {param_name})" if param_name != checkpoint_name else ""
    expected = " / ".join(dict.fromkeys(_dtype_name(d) for d in accepted))
    raise CheckpointError(f"checkpoint tensor {checkpoint_name} is {_dtype_name(dtype)}, expected {expected}{into}{hint}")


def _dtype_name(dtype: Any) -> str:
    return "float8_e8m0fnu" if dtype == "F8_E8M0" else str(dtype).removeprefix("torch.")


def non_finite_flag(t: torch.Tensor) -> torch.Tensor | None:
    """A 0-dim bool tensor on ``t``'s device, True when ``t`` holds a NaN or an infinity (None: not checkable).
    No sync, no temporary the size of ``t``."""
    if t.device.type == "meta" or t.numel() == 0:
        return None
    if t.dtype in FLOATS:
        lo, hi = torch.aminmax(t)  # NaN propagates
        return ~(torch.isfinite(lo) & torch.isfinite(hi))
    if t.dtype == torch.float8_e4m3fn:  # no infinities; NaN is S.1111.111: 0x7F (int8 max) or 0xFF (uint8 max)
        return (t.view(torch.int8).amax() == 127) | (t.view(torch.uint8).amax() == 255)
    return None


def check_finite(params: dict[str, nn.Parameter], names: Iterable[str]) -> None:
    """A :class:`CheckpointError` naming the parameters among ``names`` that hold NaN or infinity."""
    flags = [(name, flag) for name in sorted(names) if (flag := non_finite_flag(params[name].data)) is not None]
    if not flags:
        return
    if len({flag.device for _, flag in flags}) == 1:
        values = torch.stack([flag for _, flag in flags]).tolist()  # one sync
    else:
        values = [bool(flag) for _, flag in flags]
    bad = [name for (name, _), value in zip(flags, values) if value]
    if bad:
        raise CheckpointError(f"the checkpoint's values for {_listing(bad)} hold NaN or infinity")


def process_after_loading(model: nn.Module) -> None:
    """Let each layer's quantization method convert its loaded tensors, then the modules that derive
    tensors of their own from loaded layers (latent attention's absorbed ``kv_b_proj``) make them."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
    for module in model.modules():
        finish = getattr(module, "finish_loading", None)
        if callable(finish):
            finish()


def _listing(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" ... and {len(names) - limit} more" if len(names) > limit else "")
