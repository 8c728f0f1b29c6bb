"""Functions vllm_probe's ``generate`` runs on the model through ``LLM.apply_model``: in a module of their own, so
they pickle by reference to the process that runs the model (vLLM's engine core or a TP worker, spawned or forked),
which imports this module by name (a function of the probe script would be ``__main__``'s, a different object in
a spawned process)."""

from __future__ import annotations


def model_class(model) -> tuple[str, str]:
    return type(model).__module__, type(model).__qualname__


def compiled_class(model) -> str:
    return type(model).__name__ if getattr(model, "compiled", False) else ""


def attention_layers(model) -> dict:
    """Each vLLM attention layer of the model -> ``"backend.module.Class / ImplClass"``."""
    return {name: f"{m.attn_backend.__module__}.{m.attn_backend.__qualname__} / {type(m.impl).__name__}"
            for name, m in model.named_modules() if hasattr(m, "impl") and hasattr(m, "attn_backend")}


# What vLLM's multimodal processor handed the model: every embed_multimodal call's keyword arguments, recorded in the
# process that runs the model.
_RECORDED_MULTIMODAL: list[dict] = []


def _plain(value):
    """A tensor (or a list of them) as JSON: ``{"shape", "dtype", "values"}``."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch."),
            "values": value.detach().cpu().flatten().tolist()}


def record_multimodal(model) -> bool:
    original = model.embed_multimodal

    def recording(**kwargs):
        _RECORDED_MULTIMODAL.append({k: _plain(v) for k, v in kwargs.items() if v is not None})
        return original(**kwargs)

    model.embed_multimodal = recording
    return True


def recorded_multimodal(model) -> list[dict]:
    return list(_RECORDED_MULTIMODAL)
