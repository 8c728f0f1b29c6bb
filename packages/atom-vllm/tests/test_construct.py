"""Forced-CPU construction of every served architecture under vLLM, and vLLM's own weight loading
(DefaultModelLoader feeding its iterator to the wrapper's load_weights, then vLLM's coverage tracking):
every parameter written (each was NaN before), the returned set is every parameter, loaded tensors equal
the checkpoint's, each attention layer is vLLM's (its MLA layer for latent attention) and each linear-attention
layer a vLLM mamba-state layer, registered under its layer name, and a hybrid model's state shapes/dtypes/copy
functions are the ones vLLM's own implementation of the architecture declares on the same config.
Architectures the installed vLLM cannot build on the CPU (conftest's ``CPU_LIMITS``) are left out, and a
test skips naming them.  A release whose ci/pins.toml entry says ``construct = "family"`` builds one architecture per
catalog family (conftest's ``construct_architectures``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import construct_architectures, runnable, skip_unrunnable
from test_plugin import assert_served_by_atom

from atom_core import catalog
from atom_core.config import DecoderConfig, text_config
from atom_core.layers.gdn import QWEN3_NEXT_CHECKPOINT
from atom_core.tiny import tiny_config
from atom_vllm import compat

pytestmark = pytest.mark.construct

ATTENTION = "Attention"  # vLLM's attention layer class
LATENT_ATTENTION = "VllmLatentAttention"  # atom-vllm's subclass of vLLM's MLAAttention (atom_vllm.latent)
SPARSE_LATENT_ATTENTION = "VllmSparseLatentAttention"  # atom-vllm's own attention layer (atom_vllm.sparse)
SPARSE_FORWARD_TOL = 1e-4  # fp32: the vLLM-built model's logits against the native runner's, relative to their scale
LINEAR_ATTENTION = "VllmLinearAttentionState"  # atom-vllm's MambaBase layer (atom_vllm.hybrid)
QKV = ("q_proj", "k_proj", "v_proj")


def expected_forward_context(arch: str, params: list[str]) -> dict[str, str]:
    """Layer name -> class of every layer vLLM must find in its forward context, from the tiny config."""
    config = tiny_config(arch)
    (embed,) = [p for p in params if p.endswith("embed_tokens.weight")]
    stem = embed[: -len("embed_tokens.weight")] + "layers"
    layer_types = getattr(text_config(config), "layer_types", None) or ["full_attention"] * DecoderConfig.from_hf(config).num_layers
    capabilities = catalog.get(arch).capabilities
    attention = (SPARSE_LATENT_ATTENTION if catalog.SPARSE_ATTENTION in capabilities
                 else LATENT_ATTENTION if catalog.MLA in capabilities else ATTENTION)
    return {(f"{stem}.{i}.linear_attn" if kind == "linear_attention" else f"{stem}.{i}.self_attn.attn"):
            (LINEAR_ATTENTION if kind == "linear_attention" else attention) for i, kind in enumerate(layer_types)}


@pytest.fixture(scope="module")
def construct_models(tiny_models) -> dict[str, str]:
    """The architectures this session builds (conftest's ``construct_architectures``: every served one, or one per
    catalog family)."""
    return {arch: tiny_models[arch] for arch in construct_architectures()}


@pytest.fixture(scope="module")
def cpu_models(construct_models) -> dict[str, str]:
    """``construct_models`` that the installed vLLM can construct on the CPU."""
    return runnable("construct", construct_models)


@pytest.fixture(scope="module")
def qkv_excluded_fp8(tiny_models, tmp_path_factory) -> str:
    """A tiny Qwen3 in FP8 (compressed-tensors, which vLLM runs on the CPU) whose exclusion list names q_proj,
    k_proj and v_proj of every layer."""
    from atom_core.quant.quantize import quantize_checkpoint

    out = tmp_path_factory.mktemp("fp8") / "qkv-excluded"
    return str(quantize_checkpoint(tiny_models["Qwen3ForCausalLM"], out, "ptpc-fp8", exclude=QKV))


@pytest.fixture(scope="module")
def constructed_all(cpu_models, qkv_excluded_fp8, module_probe) -> dict[str, dict]:
    """Model dir -> its build under vLLM: every served architecture this vLLM can build on the CPU, then
    ``qkv_excluded_fp8``; half of them in each of two vLLM processes running at once (each is mostly one core's
    work; CI has two)."""
    dirs = [*cpu_models.values(), qkv_excluded_fp8]
    halves = [dirs[: len(dirs) // 2], dirs[len(dirs) // 2:]]
    with ThreadPoolExecutor(len(halves)) as pool:
        first, second = pool.map(lambda half: module_probe("construct", half), halves)
    return {r["dir"]: r for r in first + second}


@pytest.fixture(scope="module")
def constructed(cpu_models, constructed_all) -> list[dict]:
    """The builds of ``cpu_models``, in their order."""
    return [constructed_all[d] for d in cpu_models.values()]


def test_construct_and_load_every_architecture(cpu_models, constructed):
    results = constructed
    assert_served_by_atom(results)
    assert sorted(r["arch"] for r in results) == sorted(cpu_models)
    for r in results:
        arch = r["arch"]
        assert r["params"], arch
        assert r["returned"] == r["params"], f"{arch}: load_weights returned {set(r['params']) ^ set(r['returned'])}"
        assert r["nan_params"] == [], f"{arch}: never written: {r['nan_params']}"
        spot = r["spot_checks"]
        assert spot["equal"] > 0 and spot["different"] == [], f"{arch}: {spot}"
        grouped = {name for name, tensor in QWEN3_NEXT_CHECKPOINT.items() if tensor.grouped}  # repacked per key head
        repacked = [n for n in spot["row_permuted"] if n.split(".")[-2] not in grouped]
        assert repacked == [], f"{arch}: loaded as a row permutation of the checkpoint: {repacked}"
        # latent attention keeps its projections apart; every other attention fuses q|k|v
        assert spot.get("fused_qkv_proj") is (None if catalog.MLA in catalog.get(arch).capabilities else True), arch
        assert r["forward_context"] == expected_forward_context(arch, r["params"]), arch
        assert bool(r["state_contract"]) is (catalog.HYBRID in catalog.get(arch).capabilities), arch
        assert catalog.get(arch).name == r["qualname"]


def test_sparse_attention_forward_matches_native(constructed):
    """ATOM's DeepSeek-V3.2 / GLM-5 built by vLLM: a prefill of two prompts longer than the top-k and a decode step
    through vLLM's forward context, over caches bound from each layer's spec (vllm_probe._sparse_forward), give the
    native runner's logits; every other architecture has no sparse layer."""
    sparse = [r for r in constructed if catalog.SPARSE_ATTENTION in catalog.get(r["arch"]).capabilities]
    if not sparse:
        pytest.skip("no sparse-attention architecture among this session's builds")
    assert all(r["sparse_forward"] is None for r in constructed if r not in sparse)
    for r in sparse:
        f = r["sparse_forward"]
        layers = sum(name == SPARSE_LATENT_ATTENTION for name in r["forward_context"].values())
        assert f["layers"] == layers > 0 and min(f["lens"]) > f["top_k"], (r["arch"], f)
        assert f["cache_written"], r["arch"]
        tol = SPARSE_FORWARD_TOL * max(1.0, f["logit_scale"])
        assert f["prefill_max_abs"] <= tol and f["decode_max_abs"] <= tol, (r["arch"], f)


def test_fused_layer_exclusions_as_the_native_build(qkv_excluded_fp8, constructed_all):
    """One build path (atom_core.build): an exclusion list naming a fused layer's shards leaves the fused layer
    unquantized under vLLM exactly as natively, and vLLM's loader writes the checkpoint's tensors."""
    from atom_core.layers.linear import LinearBase
    from atom_core.runtime.runner import Runner

    r = constructed_all[qkv_excluded_fp8]
    native = {name: type(m.quant_method).__name__ for name, m in Runner(qkv_excluded_fp8).model.named_modules()
              if isinstance(m, LinearBase)}
    assert r["linear_methods"] == native
    assert {m for name, m in native.items() if name.endswith("qkv_proj")} == {"UnquantizedLinearMethod"}
    assert r["nan_params"] == [] and r["returned"] == r["params"]
    assert r["spot_checks"]["equal"] > 0 and r["spot_checks"]["different"] == [], r["spot_checks"]


def test_every_served_architecture_constructed_or_named(construct_models, cpu_models):
    """The architectures to build are those constructed above plus those this vLLM cannot build on the CPU; the
    latter skip this test, each with its reason."""
    skip_unrunnable("construct", construct_models, cpu_models)


def test_hybrid_state_contract(constructed):
    """vLLM sizes a hybrid model's state pages from the class before the model exists, then allocates each
    layer's blocks from the layer's own spec: both must agree, and agree with vLLM's own implementation
    (same conv/SSM shapes in vLLM's layout, same dtypes, same prefix-caching copy functions)."""
    hybrid = [r for r in constructed if catalog.HYBRID in catalog.get(r["arch"]).capabilities]
    if not hybrid:
        pytest.skip("no hybrid architecture is served")
    for r in hybrid:
        contract = r["state_contract"]
        assert "vllm_own_error" not in contract, f"{r['arch']}: {contract.get('vllm_own_error')}"
        assert contract["model"] == contract["vllm_own"], r["arch"]
        linear = [name for name, kind in r["forward_context"].items() if kind == LINEAR_ATTENTION]
        assert sorted(contract["layers"]) == sorted(linear)
        for name, layer in contract["layers"].items():
            assert layer["shapes"] == contract["model"]["shapes"] and layer["dtypes"] == contract["model"]["dtypes"], name
            assert layer["mamba_type"].endswith("GDN_ATTN") and layer["backend"] == "GDNAttentionBackend", name


def test_linear_attention_op_splits_the_graph_where_attention_ops_do():
    """Where vLLM splits its compiled graph at its attention ops (piecewise CUDA graphs), it splits at ATOM's GDN
    state op too, so the op runs with each step's metadata outside the captured pieces; where it splits nowhere
    (whole-graph capture, or no compile) nothing is added.  Idempotent: every layer asks."""
    from types import SimpleNamespace

    from atom_vllm.hybrid import LINEAR_ATTENTION_OP, split_graph_at_linear_attention

    for given, want in ((["vllm::unified_attention_with_output"], ["vllm::unified_attention_with_output", LINEAR_ATTENTION_OP]),
                        ([], []), (None, None)):
        config = SimpleNamespace(compilation_config=SimpleNamespace(splitting_ops=given))
        split_graph_at_linear_attention(config)
        split_graph_at_linear_attention(config)
        assert config.compilation_config.splitting_ops == want


def test_linear_attention_op_writes_into_the_output_the_graph_allocated(monkeypatch):
    """vLLM replays piecewise CUDA graphs at the addresses seen at capture, so the op at a split point must leave its
    result in a tensor the traced graph allocated before it (a mutated argument, as vLLM's own GDN core op and
    attention ops take theirs), not return a fresh one the next piece would never read."""
    from types import SimpleNamespace

    import torch

    from atom_vllm import hybrid  # noqa: F401  (registers the op)

    schema = torch.ops.atom_vllm.linear_attention.default._schema
    (out_arg,) = [a for a in schema.arguments if a.name == "out"]
    assert out_arg.alias_info is not None and out_arg.alias_info.is_write and not schema.returns
    layer = SimpleNamespace(mix_step=lambda qkv, ba: qkv * 2 + ba)
    monkeypatch.setattr("vllm.forward_context.get_forward_context",
                        lambda: SimpleNamespace(no_compile_layers={"model.layers.0.linear_attn": layer}))
    qkv, ba, out = torch.randn(5, 3), torch.randn(5, 3), torch.zeros(5, 3)
    torch.ops.atom_vllm.linear_attention([qkv, ba], out, "model.layers.0.linear_attn")
    torch.testing.assert_close(out, qkv * 2 + ba)


@pytest.mark.parametrize("dim_first", [False, True])
def test_linear_attention_pools_have_vllms_layout_before_binding(monkeypatch, dim_first):
    """vLLM's profiling run comes before it binds the state blocks: the layer's step then gives empty pools laid out
    as the bound ones will be (atom-core's GDN layer warms its kernels up on scratch pools of that layout)."""
    from types import SimpleNamespace

    import torch

    from atom_vllm import hybrid

    monkeypatch.setattr(compat, "conv_state_dim_first", lambda: dim_first)
    shapes = hybrid.vllm_layout((24, 3), (4, 16, 8))
    config = SimpleNamespace(compilation_config=SimpleNamespace(static_forward_context={}))
    state = hybrid._LinearAttentionState(config, "model.layers.0.linear_attn", shapes, (torch.bfloat16, torch.float32),
                                         mix=None, row_shape=(4, 8))
    before = state._pools()
    state.kv_cache = (torch.zeros(5, *shapes[0], dtype=torch.bfloat16), torch.zeros(5, *shapes[1]))
    bound = state._pools()
    assert [tuple(p.shape[1:]) for p in before] == [tuple(p.shape[1:]) for p in bound] == [(24, 3), (4, 8, 16)]
    assert [p.shape[0] for p in before] == [0, 0] and [p.dtype for p in before] == [p.dtype for p in bound]
    def memory_order(t):
        return sorted(range(t.dim()), key=lambda d: -t.stride(d))

    assert [memory_order(p) for p in before] == [memory_order(p) for p in bound]
    assert bound[0].stride(1) == (3 if dim_first else 1)  # vLLM's default keeps a block's taps outermost


def test_hybrid_classes_compile_only_when_asked(monkeypatch):
    """vLLM compiles ATOM's text-only classes; the hybrid ones only with ATOM_VLLM_COMPILE_HYBRID on (their GPU
    agreement since the split-point fix is not yet measured), the multimodal ones never."""
    from atom_vllm.compilation import COMPILE_HYBRID_ENV, compiles

    hybrid, dense, multimodal = (catalog.get(a) for a in ("Qwen3NextForCausalLM", "Qwen3ForCausalLM",
                                                          "Qwen3_5MoeForConditionalGeneration"))
    monkeypatch.delenv(COMPILE_HYBRID_ENV, raising=False)
    assert (compiles(hybrid), compiles(dense), compiles(multimodal)) == (False, True, False)
    monkeypatch.setenv(COMPILE_HYBRID_ENV, "1")
    assert (compiles(hybrid), compiles(dense), compiles(multimodal)) == (True, True, False)


FP32_ATOL = 1e-4  # atom-core's fp32 parity bound (ATOM and transformers differ in summation order only)


def test_multimodal_path_matches_transformers(constructed):
    """What vLLM drives on a multimodal model, short of the engine (whose Qwen3-VL processor needs
    torchvision, absent here; Kimi-K2.5's runs through the engine in test_generate): embed_multimodal on the
    kwargs vLLM's own processor of the architecture produces (Qwen-VL's image/video grids, Kimi-K2.5's
    ``vision_chunk`` pixels with ``grid_thws``), embed_input_ids at the placeholders, the DeepStack features
    handed to the next forward (padded, then cleared; none for a tower without DeepStack), and MRoPE positions
    from out-of-order per-item features where the model has MRoPE — against transformers on the same
    checkpoint."""
    multimodal = [r for r in constructed if catalog.MULTIMODAL in catalog.get(r["arch"]).capabilities]
    if not multimodal:
        pytest.skip("no multimodal architecture is served")
    for r in multimodal:
        m, arch = r["multimodal"], r["arch"]
        assert m["items_max_diff"] <= FP32_ATOL and m["embeds_max_diff"] <= FP32_ATOL, f"{arch}: {m}"
        handed = m["deepstack_first_forward"]
        if m["deepstack_levels"]:
            assert handed is not None and handed["token_index"] is None and handed["max_diff"] <= FP32_ATOL, f"{arch}: {m}"
        else:
            assert handed is None, f"{arch}: DeepStack features handed to a model without DeepStack"
        assert m["deepstack_second_forward"] is False, f"{arch}: DeepStack features were not cleared after use"
        assert m["supports_mrope"] is (catalog.MROPE in catalog.get(arch).capabilities), f"{arch}: {m}"
        if m["supports_mrope"]:
            assert m["positions_equal"] and m["delta"][0] == m["delta"][1], f"{arch}: {m}"


BAD_CHECKPOINTS = {  # how to break a tiny Qwen3 checkpoint -> what ATOM's one-line error says
    "int32 weight": "checkpoint tensor model.layers.0.mlp.down_proj.weight is int32, expected",
    "truncated shard": "model.safetensors: not a readable safetensors file: truncated at byte",
    "garbage header length": "model.safetensors: not a readable safetensors file: the header length at byte 0 says",
}
FILE_CASES = ("truncated shard", "garbage header length")


def break_checkpoint(model: Path, case: str) -> None:

    import torch
    from safetensors.torch import load_file, save_file

    (shard,) = model.glob("*.safetensors")
    data = shard.read_bytes()
    if case == "int32 weight":
        tensors = load_file(str(shard))
        name = "model.layers.0.mlp.down_proj.weight"
        tensors[name] = tensors[name].to(torch.int32)
        save_file(tensors, str(shard), metadata={"format": "pt"})
    elif case == "truncated shard":
        shard.write_bytes(data[: len(data) // 2])
    else:
        shard.write_bytes((0x4141414141414141).to_bytes(8, "little") + data[8:])


def test_bad_checkpoint_fails_with_atoms_message(every_architecture_built, tiny_models, probe, tmp_path):
    """A checkpoint ATOM's loader refuses fails under vLLM's loader with ATOM's one-line CheckpointError naming
    the tensor and the dtypes (an int32 tensor where a float weight belongs), or the file vLLM's own safetensors
    reader could not open (truncated; a garbage header length), not a host traceback about a copy or a header."""
    import shutil

    dirs = []
    for i, case in enumerate(BAD_CHECKPOINTS):
        model = Path(shutil.copytree(tiny_models["Qwen3ForCausalLM"], tmp_path / f"bad-{i}"))
        break_checkpoint(model, case)
        dirs.append(str(model))
    results = probe("construct", dirs, errors="yes")  # one vLLM process for all of them
    for (case, message), model, r in zip(BAD_CHECKPOINTS.items(), dirs, results, strict=True):
        assert r.get("error_type") == "atom_core.errors.CheckpointError", f"{case}: {r}"
        assert message in r["error"] and "\n" not in r["error"], f"{case}: {r['error']}"
        if case in FILE_CASES:
            assert r["error"].startswith(f"{model}/model.safetensors: "), f"{case}: {r['error']}"


def test_enable_lora_with_atoms_class(tiny_models, probe):
    """vLLM with --enable-lora builds ATOM's class where vLLM's LoRA internals were checked (vLLM's LoRA manager then
    wraps its layers: test_lora); on any other release the class refuses, one line naming the release and the
    switch that keeps vLLM's own class, before any weight is read."""
    model = tiny_models["Qwen3ForCausalLM"]
    (atom,) = probe("construct", [model], errors="yes", enable_lora="yes")
    if compat.lora_internals_checked():
        assert "error" not in atom, atom
        return
    assert atom.get("error_type") == "atom_core.errors.UnsupportedConfigError", atom
    assert atom["error"].startswith("Qwen3ForCausalLM: vLLM's LoRA (--enable-lora) with ATOM's class is checked on "
                                    f"vLLM {', '.join(compat.LORA_INTERNALS_CHECKED)} only"), atom
    assert "ATOM_TAKE_OVER=none" in atom["error"] and "\n" not in atom["error"]
