"""The transformer body SGLang's prefill CUDA graphs capture (the ``breakable`` and ``full`` prefill backends, on by
default on CUDA from 0.5.17).

SGLang resolves the body as the model's ``.model`` (descending ``.model`` until a module with ``layers``), calls
``body.forward(input_ids, positions, forward_batch, input_embeds)`` for the final hidden states while capturing (0.5.23
passes the embeddings by keyword), and at replay puts the graph in place of ``body.forward`` and runs the wrapper's
forward eagerly around it (the LM head and logits tail).  ATOM's body takes ``(input_ids, positions, inputs_embeds)``
and reads the batch from the host, so :func:`install_body_forward` gives the body instance a forward that takes both
calls, and ATOM's model reaches its body only through ``self.model(..., inputs_embeds=...)``, i.e. that attribute.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def layer_model(model: nn.Module) -> nn.Module | None:
    """The module SGLang's prefill graph runner takes for the body, or None where it finds none (ATOM's multimodal
    classes keep their language model under ``model.language_model``)."""
    body = getattr(model, "model", None)
    seen = set()
    while body is not None and not hasattr(body, "layers") and hasattr(body, "model") and id(body) not in seen:
        seen.add(id(body))
        body = body.model
    return body if body is not None and hasattr(body, "layers") else None


def install_body_forward(model: nn.Module, host: Any) -> None:
    """Give ``model``'s body (:func:`layer_model`) a forward taking ATOM's call and SGLang's: with a
    ``forward_batch`` (SGLang's graph runner calling the body itself) the batch is published on ``host`` for the
    call; without one (ATOM's own call, inside the wrapper's forward) it is already there."""
    body = layer_model(model)
    if body is None:
        return
    atom_forward = type(body).forward

    def forward(input_ids, positions, forward_batch=None, input_embeds=None, inputs_embeds=None):
        embeds = inputs_embeds if inputs_embeds is not None else input_embeds
        if forward_batch is None:
            return atom_forward(body, input_ids, positions, embeds)
        if embeds is not None:  # SGLang hands over bf16 whatever the model's dtype
            embeds = embeds.to(model.get_input_embeddings().weight.dtype)
        previous, host.forward_batch = host.forward_batch, forward_batch
        try:
            return atom_forward(body, input_ids, positions, embeds)
        finally:
            host.forward_batch = previous

    body.forward = forward
