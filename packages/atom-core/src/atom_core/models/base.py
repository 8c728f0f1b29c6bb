"""What every ATOM causal language model offers its host."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from atom_core.config_checks import validate_config
from atom_core.env import check_environment
from atom_core.loader import WeightMapper, load_weights


class CausalLM(nn.Module):
    """``forward`` returns hidden states; ``compute_logits`` turns the ones a host samples from into
    logits; ``load_weights`` consumes ``(checkpoint_name, tensor)`` pairs."""

    weight_mapper: ClassVar[WeightMapper]
    # Rows of the positions ``forward`` takes: 1 (``[T]``), or 3 (``[T/H/W, T]``, MRoPE) — then the model
    # also provides ``prompt_positions(token_ids, image_grid_thw) -> ([3, L], delta)`` for its prompts.
    position_rows: ClassVar[int] = 1

    def __init__(self, hf_config: Any, host: Any):
        """Every host builds every model through here: the config and ATOM's environment switches are checked
        before anything is allocated (:func:`atom_core.config_checks.validate_config`,
        :func:`atom_core.env.check_environment`)."""
        super().__init__()
        validate_config(hf_config, host=host)
        check_environment(torch.get_default_device().type)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    def mapper(self) -> WeightMapper:
        """The mapper for this instance (tied embeddings make the checkpoint's lm_head an extra)."""
        return self.weight_mapper

    @staticmethod
    def checkpoint_tensors(weights: Iterable[tuple[str, Any]]) -> Iterable[tuple[str, Any]]:
        """The checkpoint's ``(name, tensor)`` pairs as the weight mapper reads them: a family whose checkpoints
        store tensors in a layout of their own (gpt-oss' stacked experts) converts them here."""
        return weights

    def load_weights(self, weights: Iterable[tuple[str, Any]], *, strict: bool = True) -> set[str]:
        return load_weights(self, self.checkpoint_tensors(weights), self.mapper(), strict=strict)

    @classmethod
    def packed_modules_mapping(cls) -> dict[str, list[str]]:
        return cls.weight_mapper.packed_modules_mapping
