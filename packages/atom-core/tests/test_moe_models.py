"""Mixture-of-experts models and layers.

* Parity (fp32, CPU) of every MoE catalog model with its transformers class on tiny random checkpoints:
  prefill logits of three prompts within 1e-4, identical greedy tokens, decode log-probabilities
  within 1e-4 (``parity.check_model``).  GLM-4.5's correction bias is randomised (transformers
  initialises it to zero, which would hide a bias bug).
* Both checkpoint layouts: per-expert tensors (what ``save_pretrained`` and the Hub's checkpoints hold)
  and transformers 5's stacked ``experts.gate_up_proj``/``down_proj``.
* Tensor and expert parallelism of the MoE block, simulated on one process: the ranks' partial outputs
  add up to the single-rank output.
* The name mapping and the coverage check.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import hf_model, with_random_correction_bias
from parity import BF16_LOGIT_ATOL, check_model
from safetensors.torch import save_file

from atom_core.errors import CheckpointError
from atom_core.host import SingleRank
from atom_core.layers.moe import FusedMoE, RouterConfig, SparseMoeBlock, expert_partition
from atom_core.loader.experts import EXPERT_RULE
from atom_core.loader.mapper import Target
from atom_core.models.glm4_moe import Glm4MoeForCausalLM
from atom_core.models.llama import GatedMLP
from atom_core.models.mixtral import MIXTRAL_MAPPER

MOE = ["Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM", "Glm4MoeForCausalLM"]


@pytest.fixture(scope="session")
def moe_dir(tiny, tmp_path_factory):
    def build(arch: str, **overrides) -> str:
        model_dir = tiny(arch, **overrides)
        if arch == "Glm4MoeForCausalLM":
            key = "-".join(f"{k}{v}" for k, v in sorted(overrides.items()))
            model_dir = with_random_correction_bias(model_dir, tmp_path_factory.getbasetemp() / f"glm-bias{key}")
        return model_dir

    return build


@pytest.mark.parametrize("arch", MOE)
def test_fp32_cpu_parity(moe_dir, arch):
    model_dir = moe_dir(arch)
    runner = check_model(model_dir, hf_model(model_dir))
    assert any(isinstance(m, FusedMoE) for m in runner.model.modules())
    if arch == "Glm4MoeForCausalLM":
        _check_correction_bias_matters(runner.model.model.layers[1].mlp.gate)


def _check_correction_bias_matters(gate):
    """The randomised bias changes the routing (so the parity test would catch ignoring it)."""
    x = torch.randn(64, gate.weight.shape[1], generator=torch.Generator().manual_seed(0))
    with_bias = gate(x)[1].sort(dim=-1).values
    bias = gate.e_score_correction_bias.detach().clone()
    gate.e_score_correction_bias.zero_()
    without = gate(x)[1].sort(dim=-1).values
    gate.e_score_correction_bias.copy_(bias)
    assert not torch.equal(with_bias, without)


def test_glm4_moe_variant(moe_dir):
    """No q/k norm, full rotary, ungrouped routing without renormalisation, two shared experts."""
    model_dir = moe_dir("Glm4MoeForCausalLM", use_qk_norm=False, partial_rotary_factor=1.0, n_group=1, topk_group=1,
                        norm_topk_prob=False, routed_scaling_factor=1.0, n_shared_experts=2, attention_bias=False)
    check_model(model_dir, hf_model(model_dir), max_new_tokens=4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("arch", MOE)
def test_bf16_cuda_parity(moe_dir, arch):
    model_dir = moe_dir(arch)
    check_model(model_dir, hf_model(model_dir), device="cuda", dtype=torch.bfloat16, atol=BF16_LOGIT_ATOL)


@pytest.mark.parametrize("arch", ["Qwen2MoeForCausalLM"])
def test_stacked_expert_checkpoint(moe_dir, tmp_path, arch):
    """transformers 5 holds experts stacked (``experts.gate_up_proj`` [E, 2I, H]); a checkpoint saved
    from that state dict loads too."""
    src = Path(moe_dir(arch))
    hf = hf_model(str(src))
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert any(k.endswith("experts.gate_up_proj") for k in state)
    save_file(state, str(tmp_path / "model.safetensors"))
    for extra in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / extra, tmp_path / extra)
    check_model(str(tmp_path), hf, max_new_tokens=2)


def test_moe_model_on_triton_kernels(moe_dir, monkeypatch):
    """The same MoE model with every op forced onto the Triton kernels (CPU interpreter)."""
    from atom_core.runtime.runner import Runner

    model_dir = moe_dir("Qwen2MoeForCausalLM")
    ref = Runner(model_dir).prompt_logits([[1, 2, 3, 4, 5, 6, 7]])[0]
    monkeypatch.setenv("ATOM_KERNEL_BACKEND", "triton")
    out = Runner(model_dir).prompt_logits([[1, 2, 3, 4, 5, 6, 7]])[0]
    assert (out - ref).abs().max().item() < 1e-4


# ----------------------------------------------------------------------------------------- parallelism
EXPERTS, HIDDEN, INTER = 8, 32, 24


def _checkpoint(gen, layout: str) -> dict[str, torch.Tensor]:
    gate = torch.randn(EXPERTS, INTER, HIDDEN, generator=gen) * 0.2
    up = torch.randn(EXPERTS, INTER, HIDDEN, generator=gen) * 0.2
    down = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) * 0.2
    tensors = {
        "gate.weight": torch.randn(EXPERTS, HIDDEN, generator=gen),
        "shared_expert.gate_proj.weight": torch.randn(48, HIDDEN, generator=gen) * 0.2,
        "shared_expert.up_proj.weight": torch.randn(48, HIDDEN, generator=gen) * 0.2,
        "shared_expert.down_proj.weight": torch.randn(HIDDEN, 48, generator=gen) * 0.2,
        "shared_expert_gate.weight": torch.randn(1, HIDDEN, generator=gen),
    }
    if layout == "stacked":
        tensors["experts.gate_up_proj"] = torch.cat([gate, up], dim=1)
        tensors["experts.down_proj"] = down
    else:
        for e in range(EXPERTS):
            tensors |= {f"experts.{e}.gate_proj.weight": gate[e], f"experts.{e}.up_proj.weight": up[e],
                        f"experts.{e}.down_proj.weight": down[e]}
    return tensors


def _block(rank: int, world: int, expert_parallel: bool) -> SparseMoeBlock:
    host = SimpleNamespace(tp=SingleRank(rank, world), quant=None, expert_parallel=expert_parallel)
    shared = GatedMLP(HIDDEN, 48, bias=False, host=host, prefix="shared_expert")
    router = RouterConfig(num_experts=EXPERTS, top_k=3, renormalize=False)
    return SparseMoeBlock(HIDDEN, router, INTER, host=host, prefix="", shared_expert=shared, shared_expert_gate=True)


def _load(block: SparseMoeBlock, tensors: dict[str, torch.Tensor]) -> None:
    from atom_core.loader import load_weights
    from atom_core.models.qwen_moe import MOE_MAPPER

    load_weights(block, tensors.items(), MOE_MAPPER)


@pytest.mark.parametrize("layout", ["per_expert", "stacked"])
@pytest.mark.parametrize("world,expert_parallel", [(2, False), (3, True), (2, True)])
def test_parallel_ranks_add_up(layout, world, expert_parallel):
    rng = torch.Generator().manual_seed(world)
    tensors = _checkpoint(rng, layout)
    x = torch.randn(19, HIDDEN, generator=rng)
    single = _block(0, 1, False)
    _load(single, tensors)
    want = single(x)
    parts = []
    for rank in range(world):
        block = _block(rank, world, expert_parallel)
        _load(block, tensors)
        experts = block.experts
        if expert_parallel:
            first, count = expert_partition(EXPERTS, rank, world)
            assert experts.w13_weight.shape == (count, 2 * INTER, HIDDEN)
            assert int((experts.expert_map >= 0).sum()) == count and int(experts.expert_map[first]) == 0
        else:
            assert experts.w13_weight.shape == (EXPERTS, 2 * INTER // world, HIDDEN) and experts.expert_map is None
        parts.append(block(x))
    torch.testing.assert_close(sum(parts), want, rtol=1e-5, atol=1e-5)


@dataclasses.dataclass(frozen=True)
class CountingRank(SingleRank):
    """A simulated rank that counts its all-reduces (and, like :class:`SingleRank`, returns its input)."""

    calls: list = dataclasses.field(default_factory=list)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(tuple(x.shape))
        return x


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_block_with_shared_expert_all_reduces_once(expert_parallel):
    """The routed experts' and the shared expert's partial sums add up before the block's single all-reduce."""
    tp = CountingRank(1, 2)
    host = SimpleNamespace(tp=tp, quant=None, expert_parallel=expert_parallel)
    shared = GatedMLP(HIDDEN, 48, bias=False, host=host, prefix="shared_expert")
    block = SparseMoeBlock(HIDDEN, RouterConfig(num_experts=EXPERTS, top_k=3, renormalize=False), INTER, host=host,
                           prefix="", shared_expert=shared, shared_expert_gate=True)
    _load(block, _checkpoint(torch.Generator().manual_seed(0), "per_expert"))
    block(torch.randn(5, HIDDEN))
    assert tp.calls == [(5, HIDDEN)]


def test_expert_partition_covers_every_expert():
    for experts, world in [(8, 3), (128, 8), (5, 5)]:
        blocks = [expert_partition(experts, r, world) for r in range(world)]
        assert sum(c for _, c in blocks) == experts
        assert [f for f, _ in blocks] == [sum(c for _, c in blocks[:r]) for r in range(world)]


# ----------------------------------------------------------------------------------------- mapping
@pytest.mark.parametrize("name,target", [
    ("model.layers.3.mlp.experts.17.gate_proj.weight", Target("model.layers.3.mlp.experts.w13_weight", ("gate", 17))),
    ("model.layers.3.mlp.experts.17.up_proj.weight", Target("model.layers.3.mlp.experts.w13_weight", ("up", 17))),
    ("model.layers.3.mlp.experts.0.down_proj.weight", Target("model.layers.3.mlp.experts.w2_weight", ("down", 0))),
    ("model.layers.3.mlp.experts.5.down_proj.weight_scale_inv",
     Target("model.layers.3.mlp.experts.w2_weight_scale_inv", ("down", 5))),
    ("model.layers.0.mlp.experts.gate_up_proj", Target("model.layers.0.mlp.experts.w13_weight")),
    ("model.layers.0.mlp.experts.down_proj", Target("model.layers.0.mlp.experts.w2_weight")),
    ("model.layers.0.mlp.shared_expert.gate_proj.weight", None),
    ("model.layers.0.mlp.gate.weight", None),
])
def test_expert_rule(name, target):
    assert EXPERT_RULE(name) == ([target] if target else None)


def test_mixtral_names():
    assert MIXTRAL_MAPPER.map("model.layers.1.block_sparse_moe.experts.3.w3.weight") == [
        Target("model.layers.1.mlp.experts.w13_weight", ("up", 3))
    ]
    assert MIXTRAL_MAPPER.map("model.layers.1.block_sparse_moe.gate.weight") == [Target("model.layers.1.mlp.gate.weight")]


def test_glm4_moe_skips_mtp_layer_and_renames_shared_experts(moe_dir):
    from atom_core.config import load_hf_config
    from atom_core.runtime.host import NativeHost

    config = load_hf_config(moe_dir("Glm4MoeForCausalLM"))
    config.num_nextn_predict_layers = 1
    mapper = Glm4MoeForCausalLM(config, NativeHost()).mapper()
    last = config.num_hidden_layers
    assert mapper.map(f"model.layers.{last}.eh_proj.weight") is None
    assert mapper.map(f"model.layers.{last}.mlp.experts.0.gate_proj.weight") is None
    assert mapper.map(f"model.layers.{last - 1}.mlp.shared_experts.up_proj.weight") == [
        Target(f"model.layers.{last - 1}.mlp.shared_expert.gate_up_proj.weight", 1)
    ]


def test_missing_expert_tensor_is_named(moe_dir, tmp_path):
    from safetensors import safe_open

    from atom_core.runtime.runner import Runner

    src = Path(moe_dir("Qwen3MoeForCausalLM"))
    with safe_open(str(src / "model.safetensors"), "pt") as fh:
        tensors = {k: fh.get_tensor(k) for k in fh.keys() if k != "model.layers.2.mlp.experts.5.up_proj.weight"}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(json.loads((src / "config.json").read_text())))
    with pytest.raises(CheckpointError, match=r"model\.layers\.2\.mlp\.experts\.w13_weight \(shards \[\"\('up', 5\)\"\]"):
        Runner(tmp_path)
