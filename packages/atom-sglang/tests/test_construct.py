"""SGLang's own model loader builds each served architecture on the CPU and loads a tiny random
checkpoint through the wrapper's ``load_weights``; the result equals what ATOM's native loader reads.

SGLang's runtime is set up as its scheduler would, minus the GPU (conftest.cpu_runtime).  The forward
path is test_forward.py."""

from __future__ import annotations

import pytest
import torch
from _sglang_env import load_with_sglang
from conftest import checkpoint_or_skip

from atom_core import catalog
from atom_core.config import sliding_windows, text_config
from atom_core.loader import Checkpoint
from atom_core.runtime.host import NativeHost
from atom_sglang import compat, wrapper
from atom_sglang.compat import ByRelease
from atom_sglang.wrapper import PROCESSED, SGLangCausalLM

pytestmark = pytest.mark.sglang


def load_natively(arch: str, path: str) -> torch.nn.Module:
    from atom_core.config import load_hf_config

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        model = catalog.get(arch).model_class()(load_hf_config(path), NativeHost())
    finally:
        torch.set_default_dtype(previous)
    model.load_weights(Checkpoint(path))
    return model


def test_parallel_layout_is_accepted(cpu_runtime):
    par = compat.parallel()
    assert {field: getattr(par, field) is not None for field in compat.PARALLEL_FIELDS} == dict.fromkeys(
        compat.PARALLEL_FIELDS, True)
    assert compat.unsupported_parallelism() is None
    assert compat.tp_group().world_size == 1


@pytest.mark.parametrize("arch", sorted(catalog.ARCHITECTURES))
def test_sglang_builds_and_loads_every_parameter(arch, cpu_runtime, tiny_checkpoints, monkeypatch):
    path = checkpoint_or_skip(arch, tiny_checkpoints)
    processed: dict[int, int] = {}  # layer -> how often its quant method really converted it
    once_per_load = wrapper._once_per_load

    def counting_once_per_load(process):
        def counted(layer):
            processed[id(layer)] = processed.get(id(layer), 0) + 1
            process(layer)

        return once_per_load(counted)

    monkeypatch.setattr(wrapper, "_once_per_load", counting_once_per_load)

    model = load_with_sglang(path)
    processed_by_sglang_load = dict(processed)
    assert type(model).__name__ == arch and type(model).__module__ == "atom_sglang.models.catalog"
    assert isinstance(model, SGLangCausalLM) and isinstance(model, catalog.get(arch).model_class())
    assert model._weights_loaded, "SGLang's loader did not go through the wrapper's load_weights"

    reference = dict(load_natively(arch, path).named_parameters())
    params = dict(model.named_parameters())
    assert params.keys() == reference.keys()
    for name, param in params.items():
        assert param.dtype == torch.float32, name
        torch.testing.assert_close(param, reference[name], rtol=0, atol=0, msg=f"{arch}: {name} differs")

    # ATOM's loader processed each layer, then SGLang's post-load loop called it again: it ran once.
    layers = [m for m in model.modules() if getattr(m, "quant_method", None) is not None]
    assert layers and all(getattr(m, PROCESSED, False) for m in layers)
    assert processed_by_sglang_load == {id(m): 1 for m in layers}

    text = text_config(model.config)
    radix = compat.radix_attention_class()
    attention = [m for m in model.modules() if isinstance(m, radix)]
    linear = [s.layer_id for s in model.atom_host.linear_attention_states]
    assert [m.layer_id for m in attention] == [i for i in range(text.num_hidden_layers) if i not in linear]
    if catalog.HYBRID in catalog.get(arch).capabilities:
        # SGLang's config plans its mamba state pool for exactly ATOM's GDN layers, in the layout they use.
        assert linear and linear == list(text.mamba2_cache_params.layers)
        assert {s.ssm_layout for s in model.atom_host.linear_attention_states} == {"v_major"}
    else:
        assert not linear
    # ATOM's per-layer windows (transformers' convention) reach SGLang as its exclusive ones.
    atom_windows = [w for i, w in enumerate(sliding_windows(text, text.num_hidden_layers)) if i not in linear]
    assert [m.sliding_window_size for m in attention] == [w - 1 if w else -1 for w in atom_windows]
    windows = {w - 1 for w in atom_windows if w}
    assert model.get_attention_sliding_window_size() == (windows.pop() if windows else None)
    embed, head = model.get_embed_and_head()
    assert (embed is head) == bool(model.config.tie_word_embeddings)
    assert model.get_input_embeddings().num_embeddings == text.vocab_size  # what SGLang's mm routine reads
    # SGLang reads (and may update) this as a dict on the class; ATOM's own is a classmethod.
    mapping = type(model).packed_modules_mapping
    assert isinstance(mapping, dict) and mapping == model.mapper().packed_modules_mapping


def _linear_methods(model: torch.nn.Module) -> dict[str, str]:
    from atom_core.layers.linear import LinearBase

    return {name: type(m.quant_method).__name__ for name, m in model.named_modules() if isinstance(m, LinearBase)}


def test_fused_layer_exclusions_as_the_native_build(cpu_runtime, tiny_checkpoints, tmp_path):
    """One build path (atom_core.build): an FP8 checkpoint (compressed-tensors) whose exclusion list names q_proj, k_proj and v_proj
    of every layer leaves the fused qkv_proj unquantized under SGLang exactly as natively, with the same
    parameters loaded."""
    from atom_core.quant.quantize import quantize_checkpoint
    from atom_core.runtime.runner import Runner

    path = str(quantize_checkpoint(tiny_checkpoints["Qwen3ForCausalLM"], tmp_path / "fp8", "ptpc-fp8",
                                   exclude=("q_proj", "k_proj", "v_proj")))
    model = load_with_sglang(path, dtype="bfloat16")  # SGLang takes compressed-tensors in 16-bit dtypes only
    native = Runner(path, dtype=torch.bfloat16).model
    assert _linear_methods(model) == _linear_methods(native)
    assert {m for name, m in _linear_methods(native).items() if name.endswith("qkv_proj")} == {"UnquantizedLinearMethod"}
    reference = dict(native.named_parameters())
    params = dict(model.named_parameters())
    assert params.keys() == reference.keys()
    for name, param in params.items():
        assert torch.equal(param.float(), reference[name].float()), name


def _extra_buffer_in_server_args():
    """ServerArgs answering as with --mamba-radix-cache-strategy extra_buffer (the published one is read-only)."""
    from unittest import mock

    from sglang.srt.server_args import ServerArgs

    return mock.patch.object(ServerArgs, "enable_mamba_extra_buffer", lambda self: True)


def _extra_buffer_in_exec_bag():
    from sglang.srt.runtime_context import get_exec

    return get_exec().mamba.override(enable_mamba_extra_buffer=True)


# The extra-buffer setting switched on where each release keeps it (atom_sglang.compat.MAMBA_EXTRA_BUFFER reads it).
EXTRA_BUFFER_ON = ByRelease("switching the mamba extra buffer on", {
    "<0.5.20": _extra_buffer_in_server_args,
    ">=0.5.20": _extra_buffer_in_exec_bag,
})


@pytest.mark.parametrize("setting", ["extra_buffer", "speculative"])
def test_hybrid_models_refuse_settings_their_gdn_layers_cannot_serve(setting, cpu_runtime, tiny_checkpoints):
    """SGLang's extra_buffer radix strategy (its default for Qwen3-Next with the overlap scheduler) expects the
    GDN layers to save intermediate chunk states; speculative decoding needs per-draft-token states: the
    model refuses to build, naming the way out, instead of producing wrong tokens later."""
    from sglang.srt.runtime_context import get_spec

    hybrid = [a for a in tiny_checkpoints if catalog.HYBRID in catalog.get(a).capabilities]
    if not hybrid:
        pytest.skip("no hybrid architecture is served")
    override, match = {
        "extra_buffer": (EXTRA_BUFFER_ON.get()(), "no_buffer"),
        "speculative": (get_spec().override(speculative_algorithm="EAGLE"), "speculative decoding"),
    }[setting]
    with override, pytest.raises(ValueError, match=match):
        load_with_sglang(tiny_checkpoints[hybrid[0]])


BAD_CHECKPOINTS = {  # how to break a tiny checkpoint -> what ATOM's one-line error says
    "int32 weight": "checkpoint tensor model.layers.0.mlp.down_proj.weight is int32, expected",
    "truncated shard": "model.safetensors: not a readable safetensors file: truncated at byte",
    "garbage header length": "model.safetensors: not a readable safetensors file: the header length at byte 0 says",
    # SGLang's own class would tie and drop lm_head.weight; transformers keeps it: ATOM refuses, saying why
    "tied config, different lm_head": "sets tie_word_embeddings, but the checkpoint's lm_head.weight differs from",
}
FILE_CASES = ("truncated shard", "garbage header length")


@pytest.mark.parametrize("case", BAD_CHECKPOINTS)
def test_bad_checkpoint_fails_with_atoms_message(case, cpu_runtime, tiny_checkpoints, tmp_path):
    """A checkpoint ATOM's loader refuses fails under SGLang's loader with ATOM's one-line CheckpointError naming
    the tensor and the dtypes, or the file SGLang's own safetensors reader could not open, not a host traceback."""
    import json
    import shutil
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    from atom_core.errors import CheckpointError

    model = Path(shutil.copytree(tiny_checkpoints["Qwen3ForCausalLM"], tmp_path / "bad"))
    (shard,) = model.glob("*.safetensors")
    data = shard.read_bytes()
    if case == "tied config, different lm_head":  # the tiny checkpoint is untied: its lm_head.weight is its own
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    elif case == "int32 weight":
        tensors = load_file(str(shard))
        name = "model.layers.0.mlp.down_proj.weight"
        tensors[name] = tensors[name].to(torch.int32)
        save_file(tensors, str(shard), metadata={"format": "pt"})
    elif case == "truncated shard":
        shard.write_bytes(data[: len(data) // 2])
    else:
        shard.write_bytes((0x4141414141414141).to_bytes(8, "little") + data[8:])
    with pytest.raises(CheckpointError) as raised:
        load_with_sglang(str(model))
    message = str(raised.value)
    assert BAD_CHECKPOINTS[case] in message and "\n" not in message, message
    if case in FILE_CASES:
        assert message.startswith(f"{shard}: "), message
