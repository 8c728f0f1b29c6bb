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


# how vision configs spell the side of the patch block that merges into one language-model token
MERGE_SIZE_FIELDS = ("spatial_merge_size", "merge_kernel_size")


def spatial_merge_size(vision_config: Any) -> int:
    """The side of the square patch block one placeholder token stands for (Qwen-VL's ``spatial_merge_size``,
    Kimi-K2.5's ``merge_kernel_size``)."""
    for name in MERGE_SIZE_FIELDS:
        value = getattr(vision_config, name, None)
        if value is not None:
            return int(value[0] if isinstance(value, (list, tuple)) else value)
    raise AttributeError(f"vision_config has none of {', '.join(MERGE_SIZE_FIELDS)}")


def with_image_placeholders(hf_config: Any, text_ids: Sequence[int], image_grid_thw: torch.Tensor) -> list[int]:
    """``<vision_start> <image>×n <vision_end>`` for each image (``n`` = its merged patch count), then the text.

    The ids come from the config (``image_token_id``, ``vision_start_token_id``, ``vision_end_token_id``); ``n`` is
    ``t·h·w / m²`` with ``m`` from :func:`spatial_merge_size`, as the Qwen-VL and Kimi-K2.5 processors expand an
    image's placeholder.
    """
    try:
        start, end, image = hf_config.vision_start_token_id, hf_config.vision_end_token_id, hf_config.image_token_id
        merge = spatial_merge_size(hf_config.vision_config)
    except AttributeError as err:
        raise UnsupportedConfigError(f"this model's config has no image placeholder tokens ({err})") from None
    ids: list[int] = []
    for t, h, w in torch.as_tensor(image_grid_thw).tolist():
        ids += [start] + [image] * (t * h * w // merge**2) + [end]
    return ids + list(text_ids)
