"""MRoPE positions of mixed text + image + video prompts against transformers' Qwen3-VL
``get_rope_index``, and the decode delta against its decode-time positions."""

import pytest
import torch

from atom_core.mrope_positions import MultimodalPromptError, decode_positions, mrope_positions
from atom_core.tiny import tiny_config

ARCH = "Qwen3VLForConditionalGeneration"


@pytest.fixture(scope="module")
def hf_qwen3_vl():
    from transformers import Qwen3VLModel

    return Qwen3VLModel(tiny_config(ARCH)).eval()


def _prompt(config, pieces, rng):
    """Token ids for ``pieces``: ("text", n) random text tokens, ("image", grid), ("video", grid); images and
    each video frame group wrapped in vision start/end tokens, frame groups separated by timestamp text."""
    merge = config.vision_config.spatial_merge_size
    ids, images, videos = [], [], []
    for kind, arg in pieces:
        if kind == "text":
            ids += torch.randint(0, 400, (arg,), generator=rng).tolist()
            continue
        t, h, w = arg
        per_block = h * w // merge**2
        token = config.image_token_id if kind == "image" else config.video_token_id
        (images if kind == "image" else videos).append(arg)
        for frame in range(1 if kind == "image" else t):
            if kind == "video":
                ids += [7 + frame, 9]  # "<t seconds>" text before each frame group
            ids += [config.vision_start_token_id] + [token] * (per_block * (t if kind == "image" else 1))
            ids += [config.vision_end_token_id]
    return ids, (torch.tensor(images) if images else None), (torch.tensor(videos) if videos else None)


PROMPTS = {
    "text-only": [("text", 9)],
    "image": [("text", 3), ("image", (1, 4, 6)), ("text", 5)],
    "image-first-two-images": [("image", (1, 6, 4)), ("text", 2), ("image", (1, 2, 2)), ("text", 1)],
    "mixed": [("text", 4), ("image", (1, 8, 4)), ("text", 3), ("video", (3, 4, 4)), ("text", 2),
              ("image", (1, 2, 6))],
    "ends-with-video": [("text", 2), ("video", (2, 6, 2))],
}


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_positions_match_transformers(hf_qwen3_vl, name):
    config = hf_qwen3_vl.config
    rng = torch.Generator().manual_seed(len(name))
    ids, images, videos = _prompt(config, PROMPTS[name], rng)
    input_ids = torch.tensor([ids])
    token_types = (input_ids == config.image_token_id).int() + 2 * (input_ids == config.video_token_id).int()
    want, want_delta = hf_qwen3_vl.get_rope_index(
        input_ids, token_types, image_grid_thw=images, video_grid_thw=None if videos is None else videos.clone()
    )
    got, delta = mrope_positions(
        ids, image_token_id=config.image_token_id, video_token_id=config.video_token_id,
        spatial_merge_size=config.vision_config.spatial_merge_size, image_grid_thw=images, video_grid_thw=videos,
    )
    assert torch.equal(got, want[:, 0]), (got, want[:, 0])
    assert delta == int(want_delta)
    if name == "text-only":
        assert delta == 0 and torch.equal(got, torch.arange(len(ids)).expand(3, -1))


def test_decode_positions_continue_like_transformers(hf_qwen3_vl):
    """Generated tokens sit where get_rope_index puts text appended to the prompt."""
    config = hf_qwen3_vl.config
    rng = torch.Generator().manual_seed(3)
    ids, images, _ = _prompt(config, PROMPTS["image"], rng)
    kwargs = dict(image_token_id=config.image_token_id, video_token_id=config.video_token_id,
                  spatial_merge_size=config.vision_config.spatial_merge_size, image_grid_thw=images)
    _, delta = mrope_positions(ids, **kwargs)
    longer, _ = mrope_positions(ids + [5, 6, 7], **kwargs)
    assert torch.equal(decode_positions(len(ids), 3, delta), longer[:, len(ids):])


def test_mismatched_placeholders_are_clear_errors():
    kwargs = dict(image_token_id=500, video_token_id=501, spatial_merge_size=2)
    with pytest.raises(MultimodalPromptError, match="does not match its merged grid"):
        mrope_positions([1, 500, 500, 2], image_grid_thw=[[1, 4, 4]], **kwargs)
    with pytest.raises(MultimodalPromptError, match="more image placeholder runs"):
        mrope_positions([1, 500, 2, 500], image_grid_thw=[[1, 2, 2]], **kwargs)
    with pytest.raises(MultimodalPromptError, match="more image grids"):
        mrope_positions([1, 2], image_grid_thw=[[1, 2, 2]], **kwargs)


def test_runner_position_plan_spans_prompt_and_decode():
    """The runner's per-sequence plan: prompt positions, then index + delta on every row, also across the seam."""
    from atom_core.runtime.positions import PositionPlan

    prompt, delta = mrope_positions([1, 500, 500, 500, 500, 2], image_token_id=500, video_token_id=501,
                                    spatial_merge_size=2, image_grid_thw=[[1, 4, 4]])
    plan = PositionPlan(rows=3, prompt=prompt, delta=delta)
    assert torch.equal(plan.positions(0, 6), prompt)
    assert torch.equal(plan.positions(4, 4), torch.cat([prompt[:, 4:], decode_positions(6, 2, delta)], dim=1))
    assert torch.equal(PositionPlan().positions(3, 2), torch.tensor([[3, 4]]))
