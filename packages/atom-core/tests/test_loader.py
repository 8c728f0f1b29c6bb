"""Bad checkpoints give clear errors naming what is wrong; lazy slices read only what is asked."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from atom_core.errors import CheckpointError, UnsupportedArchitectureError
from atom_core.loader import Checkpoint
from atom_core.runtime.runner import Runner


def copy_checkpoint(src: str, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def rewrite(path: Path, edit) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_missing_shard_names_the_file(tiny, tmp_path):
    ckpt = copy_checkpoint(tiny("LlamaForCausalLM", max_shard_size="1MB"), tmp_path / "m")
    shard = sorted(ckpt.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=rf"missing shard.*{shard.name}"):
        Runner(ckpt)


def test_wrong_shape_names_tensor_and_shapes(tiny, tmp_path):
    ckpt = copy_checkpoint(tiny("LlamaForCausalLM"), tmp_path / "m")
    name = "model.layers.1.mlp.down_proj.weight"

    def shrink(t):
        t[name] = t[name][:, :-8].contiguous()

    rewrite(ckpt / "model.safetensors", shrink)
    with pytest.raises(CheckpointError, match=rf"{name}.*down_proj.*shape mismatch.*\(256, 504\)"):
        Runner(ckpt)


def test_wrong_shape_of_a_fused_shard(tiny, tmp_path):
    ckpt = copy_checkpoint(tiny("Qwen3ForCausalLM"), tmp_path / "m")
    name = "model.layers.0.self_attn.k_proj.weight"

    def grow(t):
        t[name] = torch.cat([t[name], t[name][:64]])

    rewrite(ckpt / "model.safetensors", grow)
    with pytest.raises(CheckpointError, match=rf"{name} into model.layers.0.self_attn.qkv_proj.weight.*shape mismatch"):
        Runner(ckpt)


def test_unconsumed_tensor_is_an_error(tiny, tmp_path):
    ckpt = copy_checkpoint(tiny("Qwen2ForCausalLM"), tmp_path / "m")
    rewrite(ckpt / "model.safetensors", lambda t: t.update({"model.layers.0.mlp.extra_proj.weight": torch.zeros(2, 2)}))
    with pytest.raises(CheckpointError, match=r"not used by the model: model\.layers\.0\.mlp\.extra_proj\.weight"):
        Runner(ckpt)


def test_missing_tensor_and_missing_shard_of_fused_param(tiny, tmp_path):
    ckpt = copy_checkpoint(tiny("MistralForCausalLM"), tmp_path / "m")

    def drop(t):
        del t["model.norm.weight"]
        del t["model.layers.1.mlp.up_proj.weight"]

    rewrite(ckpt / "model.safetensors", drop)
    with pytest.raises(CheckpointError) as err:
        Runner(ckpt)
    message = str(err.value)
    assert "did not provide" in message
    assert "model.norm.weight" in message
    assert "model.layers.1.mlp.gate_up_proj.weight (shards ['1'] never written)" in message


def test_unknown_architecture_lists_supported(tiny, tmp_path):
    ckpt = copy_checkpoint(tiny("LlamaForCausalLM"), tmp_path / "m")
    config = json.loads((ckpt / "config.json").read_text())
    config["architectures"] = ["FooForCausalLM"]
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match=r"FooForCausalLM.*supported: .*LlamaForCausalLM"):
        Runner(ckpt)


def test_no_weights_at_all(tiny, tmp_path):
    ckpt = copy_checkpoint(tiny("LlamaForCausalLM"), tmp_path / "m")
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="holds no safetensors weights"):
        Runner(ckpt)


def test_lazy_slice_reads_only_the_narrowed_part(tiny):
    ckpt = Checkpoint(tiny("LlamaForCausalLM"))
    tensors = dict(ckpt.tensors())
    full = tensors["model.embed_tokens.weight"]
    part = full.narrow(0, 100, 7).narrow(1, 3, 5)
    assert tuple(part.shape) == (7, 5)
    reference = load_file(str(Path(ckpt.model_dir) / "model.safetensors"))["model.embed_tokens.weight"]
    torch.testing.assert_close(part.to_tensor(), reference[100:107, 3:8])
    with pytest.raises(ValueError, match="out of range"):
        full.narrow(0, 510, 7)
