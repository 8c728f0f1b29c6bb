"""Speculative decoding through SGLang with ATOM's draft models (atom_sglang.drafts).

SGLang 0.5.23 runs no speculative decoding on the CPU with the torch-native attention backend: its EAGLE worker builds
the draft's extend backend from a fixed list of GPU backends (and ``intel_amx``, which needs sgl-kernel's CPU build)
and refuses ``torch_native`` (checked below).  So the tests here run the parts on the CPU: each draft class built and
loaded through SGLang's model loader as its draft worker builds it (``ModelConfig(is_draft_model=True)``, which gives
the draft SGLang's draft architecture name); the EAGLE-3 draft's forward against SGLang's own
``LlamaForCausalLMEagle3`` on the same tokens and target hidden states, and the target's captured layers against
SGLang's own ``LlamaForCausalLM`` (fp32, 1e-5); the MTP drafts' forward against ATOM's draft on the native host.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _sglang_batch import SGLangCPUBatch
from _sglang_env import load_with_sglang
from safetensors.torch import load_file

from atom_core.errors import UnsupportedConfigError
from atom_core.tiny import add_mtp_layer, add_qwen3_next_mtp, make_eagle3_draft, make_tiny
from atom_sglang import compat, drafts, wrapper

pytestmark = pytest.mark.sglang

TOL = 1e-5
TARGET_LAYERS = 8  # SGLang's default layers (2, n // 2, n - 3) are three distinct ones


def load_draft(path: str):
    """What SGLang's EAGLE worker builds: the draft's ModelConfig (is_draft_model) through SGLang's model loader."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    model_config = ModelConfig(model_path=path, dtype="float32", is_draft_model=True)
    return DefaultModelLoader(LoadConfig()).load_model(model_config=model_config, device_config=DeviceConfig("cpu"))


def tensors(path: str) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


@pytest.fixture(scope="module")
def eagle3(tmp_path_factory) -> tuple[str, str]:
    """A tiny Llama target and a random EAGLE-3 draft over it (a draft vocabulary of 128 tokens, d2t), reading the
    output of target layers 0, 1, 2 (in SGLang's convention)."""
    root = tmp_path_factory.mktemp("eagle3")
    target = make_tiny("LlamaForCausalLM", root / "target", num_hidden_layers=TARGET_LAYERS, seed=3)
    draft = make_eagle3_draft(target, root / "draft", seed=4, layer_ids=[0, 1, 2])
    return str(target), str(draft)


@pytest.fixture(scope="module")
def mtp_checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mtp")
    deepseek = add_mtp_layer(make_tiny("DeepseekV3ForCausalLM", root / "ds", seed=5), root / "ds-mtp", seed=6)
    qwen = add_qwen3_next_mtp(make_tiny("Qwen3NextForCausalLM", root / "qn", seed=7), root / "qn-mtp", seed=8)
    return {"DeepseekV3ForCausalLMNextN": str(deepseek), "Qwen3NextForCausalLMMTP": str(qwen)}


@pytest.fixture
def target_is(monkeypatch):
    """Point compat.target_model_path (the published server's model) at a target checkpoint."""

    def point(path: str) -> None:
        monkeypatch.setattr(compat, "target_model_path", lambda: path)

    return point


def test_target_model_path_is_the_published_servers_model(cpu_runtime, tiny_checkpoints):
    assert compat.target_model_path() == next(iter(tiny_checkpoints.values()))


def test_drafts_are_registered_only_beside_atoms_targets():
    names = {cls.__name__ for cls in drafts.draft_classes(["LlamaForCausalLM", "DeepseekV3ForCausalLM"], "m")}
    assert names == {"LlamaForCausalLMEagle3", "DeepseekV3ForCausalLMNextN"}
    assert drafts.draft_classes(["MixtralForCausalLM"], "m") == []
    served = {cls.__name__ for cls in wrapper.entry_classes("m")}  # ATOM_TAKE_OVER=all (conftest)
    assert set(drafts.SGLANG_NAMES.values()) <= served


@pytest.mark.parametrize("arch", ["DeepseekV3ForCausalLMNextN", "Qwen3NextForCausalLMMTP"])
def test_mtp_draft_builds_and_loads_through_sglangs_loader(arch, cpu_runtime, mtp_checkpoints):
    path = mtp_checkpoints[arch]
    model = load_draft(path)
    assert type(model).__name__ == arch and isinstance(model, drafts.SGLangDraft)
    # SGLang's loader runs every quant method's post-load step again after load_weights: once per load here
    methods = [m.quant_method for m in model.modules() if getattr(m, "quant_method", None) is not None]
    assert methods and all(getattr(q.process_weights_after_loading, "_atom_once", False) for q in methods)
    ckpt = tensors(path)
    n = json.loads((Path(path) / "config.json").read_text())["num_hidden_layers"]
    if arch == "DeepseekV3ForCausalLMNextN":
        layer = model._layer(0)
        torch.testing.assert_close(layer.eh_proj.weight, ckpt[f"model.layers.{n}.eh_proj.weight"], rtol=0, atol=0)
        torch.testing.assert_close(layer.shared_head.head.weight, ckpt[f"model.layers.{n}.shared_head.head.weight"], rtol=0, atol=0)
        # its attention is layer 0 of the draft's own KV pool (SGLang sizes it for num_nextn_predict_layers layers)
    else:
        torch.testing.assert_close(model.mtp.fc.weight, ckpt["mtp.fc.weight"], rtol=0, atol=0)
    assert [a.attn.layer_id for a in model.atom_host.attention_layers] == [0]


def test_prefill_graph_capture_of_a_draft_body_is_refused(cpu_runtime, mtp_checkpoints, eagle3, target_is):
    """SGLang's breakable / full prefill CUDA graphs call a draft's body (``model.model.forward``) alone."""
    from atom_sglang.prefill_graph import layer_model

    target_is(eagle3[0])
    for path in (mtp_checkpoints["DeepseekV3ForCausalLMNextN"], eagle3[1]):
        body = layer_model(load_draft(path))
        with pytest.raises(UnsupportedConfigError, match="--cuda-graph-backend-prefill disabled"):
            body.forward(torch.tensor([1]), torch.tensor([0]), None)


def test_deepseek_draft_with_two_mtp_layers_is_refused(cpu_runtime, mtp_checkpoints, tmp_path):
    import shutil

    src = Path(mtp_checkpoints["DeepseekV3ForCausalLMNextN"])
    dst = tmp_path / "two"
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(dict(config, num_nextn_predict_layers=2)))
    with pytest.raises(UnsupportedConfigError, match="num_nextn_predict_layers is 2"):
        load_draft(str(dst))


def sglangs_own(cls_path: str, path: str, monkeypatch):
    """SGLang's own class of a checkpoint, built and loaded as its loader does (imported directly: the registry
    resolves the name to ATOM's class in this process)."""
    import importlib

    import sglang.srt.layers.rotary_embedding.base as rope
    from sglang.srt.configs.model_config import ModelConfig

    module, name = cls_path.split(":")
    cls = getattr(importlib.import_module(module), name)
    # SGLang's rotary embedding takes a CUDA kernel on any platform it does not know as a CPU one, and knows the CPU
    # only under SGLANG_USE_CPU_ENGINE=1 (read at import): its own torch path for this construction
    monkeypatch.setattr(rope, "_is_cpu", True)
    config = ModelConfig(model_path=path, dtype="float32", is_draft_model="Eagle3" in name or "NextN" in name).hf_config
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        model = cls(config=config)
    finally:
        torch.set_default_dtype(previous)
    model.load_weights(iter(tensors(path).items()))
    return model.eval()


PROMPTS = {0: [5, 9, 2, 31, 7], 1: [3, 8, 40]}


def assert_drafts_agree(atom, own, first_hidden: torch.Tensor, *, own_latent: tuple[int, int] | None = None) -> None:
    """ATOM's draft and SGLang's own over the same steps: an extend of PROMPTS with ``first_hidden`` (the target's
    hidden states, one row per token), then two decode steps on each draft's own hidden states (the last row of each
    request), as SGLang's EAGLE worker chains them.  Logits and the hidden states each hands the next step agree."""
    batches = {"atom": SGLangCPUBatch(atom, 2), "own": SGLangCPUBatch(own, 2, latent=own_latent)}
    last_rows = [len(PROMPTS[0]) - 1, len(PROMPTS[0]) + len(PROMPTS[1]) - 1]
    out = {}
    for name, batch in batches.items():
        hidden = first_hidden
        out[name] = []
        for step, tokens in enumerate((PROMPTS, {0: [11], 1: [12]}, {0: [13], 1: [14]})):
            logits = batch.step(tokens, spec_hidden=hidden)
            hidden = batch.last_output.hidden_states
            out[name].append((logits, hidden))
            hidden = hidden[last_rows] if step == 0 else hidden
    for (a_logits, a_hidden), (o_logits, o_hidden) in zip(out["atom"], out["own"], strict=True):
        torch.testing.assert_close(a_logits, o_logits, rtol=TOL, atol=TOL)
        torch.testing.assert_close(a_hidden, o_hidden, rtol=TOL, atol=TOL)


def test_eagle3_draft_forward_matches_sglangs_own(cpu_runtime, eagle3, target_is, monkeypatch):
    target, draft = eagle3
    target_is(target)
    atom = load_draft(draft)
    own = sglangs_own("sglang.srt.models.llama_eagle3:LlamaForCausalLMEagle3", draft, monkeypatch)
    assert type(atom).__name__ == "LlamaForCausalLMEagle3" and isinstance(atom, drafts.SGLangDraft)
    torch.testing.assert_close(atom.hot_token_id, own.hot_token_id, rtol=0, atol=0)
    embed = tensors(target)["model.embed_tokens.weight"]
    for model in (atom, own):  # what SGLang's EAGLE worker does for an EAGLE-3 draft: the target's embedding
        model.set_embed(torch.nn.Parameter(embed.clone(), requires_grad=False))
    hidden = json.loads((Path(draft) / "config.json").read_text())["hidden_size"]
    aux = torch.randn(8, 3 * hidden, generator=torch.Generator().manual_seed(0))  # three target layers, concatenated
    assert atom.logits_processor.config.vocab_size == 128  # over the draft vocabulary; SGLang maps it by hot_token_id
    assert_drafts_agree(atom, own, aux)


@pytest.mark.parametrize("layer_ids", [None, [0, 1, 2]])
def test_eagle3_target_captures_sglangs_layers(layer_ids, cpu_runtime, eagle3, monkeypatch):
    target, _ = eagle3
    atom = load_with_sglang(target)
    own = sglangs_own("sglang.srt.models.llama:LlamaForCausalLM", target, monkeypatch)
    assert isinstance(atom, drafts.Eagle3Target)
    for model in (atom, own):
        model.set_eagle3_layers_to_capture(layer_ids)
        assert model.capture_aux_hidden_states
    results = []
    for model in (atom, own):
        batch = SGLangCPUBatch(model, 2)
        logits = batch.step(PROMPTS, capture=True)
        results.append((logits, batch.last_output.hidden_states))
    (a_logits, a_aux), (o_logits, o_aux) = results
    hidden = atom.decoder_config.hidden_size
    assert a_aux.shape == (8, 3 * hidden)
    torch.testing.assert_close(a_logits, o_logits, rtol=TOL, atol=TOL)
    torch.testing.assert_close(a_aux, o_aux, rtol=TOL, atol=TOL)


def test_eagle3_target_refuses_layers_past_its_last(cpu_runtime, eagle3):
    atom = load_with_sglang(eagle3[0])
    with pytest.raises(UnsupportedConfigError, match="input of layer id \\+ 1"):
        atom.set_eagle3_layers_to_capture([0, 1, TARGET_LAYERS - 1])


def test_sglang_refuses_drafting_with_the_torch_native_backend(cpu_runtime):
    """Why nothing above runs through SGLang's Engine on the CPU: its EAGLE worker's draft backends."""
    from _sglang_env import HARNESS
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    (symbol,) = [s for s in HARNESS if s.path.endswith("DraftBackendFactory.__init__")]
    if not symbol.present_in():
        pytest.skip(f"DraftBackendFactory takes other arguments before SGLang {symbol.releases}")
    runner = SimpleNamespace(draft_attention_backend="torch_native")
    factory = DraftBackendFactory(runner, topk=1, speculative_num_steps=1)
    with pytest.raises(ValueError, match="EAGLE is not supported in attention backend torch_native"):
        factory.create_draft_extend_backend()


def share_target_weights(atom, own, path: str) -> None:
    """What SGLang's EAGLE worker does for an MTP draft: the target's embedding and head in the draft (SGLang's own
    set_embed_and_head also empties the CUDA cache: its two assignments here)."""
    ckpt = tensors(path)

    def target_weights():
        names = ("model.embed_tokens.weight", "lm_head.weight")
        return (torch.nn.Parameter(ckpt[n].clone(), requires_grad=False) for n in names)

    atom.set_embed_and_head(*target_weights())
    del own.model.embed_tokens.weight, own.lm_head.weight
    own.model.embed_tokens.weight, own.lm_head.weight = target_weights()


def test_deepseek_mtp_draft_forward_matches_sglangs_own(cpu_runtime, mtp_checkpoints, monkeypatch):
    """The MTP draft over the target's hidden states (a prompt, then two draft steps on its own hidden states)."""
    path = mtp_checkpoints["DeepseekV3ForCausalLMNextN"]
    atom = load_draft(path)
    own = sglangs_own("sglang.srt.models.deepseek_nextn:DeepseekV3ForCausalLMNextN", path, monkeypatch)
    # SGLang's own class picks the expanded (MHA) form for a prompt without prefix, which its torch-native backend
    # cannot run over the latent pool on the CPU; its absorbed form (what ATOM's runs, the same math) is its choice under
    # deterministic inference
    import sglang.srt.models.deepseek_common.attention_backend_handler as handler

    deterministic = SimpleNamespace(deterministic=SimpleNamespace(enable_deterministic_inference=True))
    monkeypatch.setattr(handler, "get_exec", lambda: deterministic)
    share_target_weights(atom, own, path)
    config = json.loads((Path(path) / "config.json").read_text())
    latent = (config["kv_lora_rank"], config["qk_rope_head_dim"])
    target_hidden = torch.randn(8, config["hidden_size"], generator=torch.Generator().manual_seed(0))
    assert_drafts_agree(atom, own, target_hidden, own_latent=latent)


def test_qwen3_next_mtp_draft_forward_matches_sglangs_own(cpu_runtime, mtp_checkpoints, monkeypatch):
    path = mtp_checkpoints["Qwen3NextForCausalLMMTP"]
    atom = load_draft(path)
    own = sglangs_own("sglang.srt.models.qwen3_next_mtp:Qwen3NextForCausalLMMTP", path, monkeypatch)
    # SGLang's MoE block fuses its shared-expert gate in a Triton kernel except on NPUs: its unfused torch path here
    import sglang.srt.models.qwen2_moe as qwen2_moe

    monkeypatch.setattr(qwen2_moe, "is_npu", lambda: True)
    share_target_weights(atom, own, path)
    hidden = json.loads((Path(path) / "config.json").read_text())["hidden_size"]
    assert_drafts_agree(atom, own, torch.randn(8, hidden, generator=torch.Generator().manual_seed(0)))
