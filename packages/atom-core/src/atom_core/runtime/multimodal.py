"""Images for the native runner: pixels through the checkpoint's own image processor (transformers'
processor classes; they are preprocessing, not modeling code), and prompts with their placeholder tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from atom_core.errors import CheckpointError, UnsupportedConfigError, UnsupportedError, UsageError
from atom_core.paths import check_links, inside


@dataclass(frozen=True)
class ImageInputs:
    pixel_values: torch.Tensor  # [patches, channels * temporal_patch * patch * patch], merge-block order
    image_grid_thw: torch.Tensor  # [images, 3] patch grid of each image (before merging)


@dataclass(frozen=True)
class Prompt:
    """One prompt: token ids (with each image's placeholder tokens in place) and its images."""

    token_ids: list[int]
    images: ImageInputs | None = None


def as_prompt(prompt: Sequence[int] | Prompt) -> Prompt:
    return prompt if isinstance(prompt, Prompt) else Prompt(list(prompt))


def load_images(model_dir: str | Path, paths: Sequence[str | Path]) -> ImageInputs:
    """Read image files and preprocess them with the processor the checkpoint's preprocessor_config.json names."""
    try:
        from PIL import Image
    except ImportError:
        raise UnsupportedError("images need pillow: pip install 'atom-core[images]'") from None
    from transformers import AutoImageProcessor

    if not inside(model_dir, "preprocessor_config.json").is_file():
        raise CheckpointError(f"{model_dir} has no preprocessor_config.json: cannot preprocess images for it")
    check_links(model_dir)  # transformers opens files of its choosing in the directory
    try:
        processor = AutoImageProcessor.from_pretrained(str(model_dir), trust_remote_code=False)
    except Exception as err:  # what transformers raises for a processor config it cannot read varies
        raise CheckpointError(f"{model_dir}: transformers cannot load its image processor: "
                              f"{' '.join(str(err).split())}") from err
    images = []
    for path in paths:
        try:
            images.append(Image.open(path).convert("RGB"))
        except (OSError, ValueError) as err:  # missing, unreadable, or not an image PIL knows
            raise UsageError(f"--image {path}: cannot read it as an image: {err}") from None
    batch = processor(images=images, return_tensors="pt")
    return ImageInputs(pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"])


def with_image_placeholders(hf_config: Any, text_ids: Sequence[int], image_grid_thw: torch.Tensor) -> list[int]:
    """``<vision_start> <image>×n <vision_end>`` for each image (``n`` = its merged patch count), then the text.

    The Qwen-VL prompt layout; the ids come from the config (``image_token_id``, ``vision_start_token_id``,
    ``vision_end_token_id``, ``vision_config.spatial_merge_size``).
    """
    try:
        start, end, image = hf_config.vision_start_token_id, hf_config.vision_end_token_id, hf_config.image_token_id
        merge = hf_config.vision_config.spatial_merge_size
    except AttributeError as err:
        raise UnsupportedConfigError(f"this model's config has no image placeholder tokens ({err})") from None
    ids: list[int] = []
    for t, h, w in torch.as_tensor(image_grid_thw).tolist():
        ids += [start] + [image] * (t * h * w // merge**2) + [end]
    return ids + list(text_ids)
