"""ATOM's paged attention as SGLang's ``--attention-backend atom`` (atom_sglang.attention_backend), on the CPU.

* the plugin's registration: SGLang's own argument parser accepts ``--attention-backend atom`` once the plugins
  have loaded (and not before), its default backend is unchanged; gpt-oss is refused by SGLang's own server
  arguments (a fixed backend list for that architecture, no extension point);
* the forward path of test_forward (SGLang's KV pools, ForwardBatches laid out as its ModelRunner lays them out,
  chunked prefill then greedy decode) with the backend built through SGLang's registry: the same logits as
  SGLang's torch-native backend at every step and transformers' greedy tokens, at page sizes 1 and 4 (pages
  interleaved across requests, so block tables have holes); gpt-oss (attention sinks, a sliding window of 16
  crossed by the chunked prompt) against transformers, which the torch-native backend cannot run;
* decode steps through the CUDA-graph hooks (static buffers refilled for padded batches; no graph is captured on
  the CPU) = the eager steps;
* what it lacks is refused in one line naming the cause.

On the CPU ``atom_kernels`` runs its torch references; ``test_triton_kernels_through_the_interpreter`` runs the
Triton kernels (TRITON_INTERPRET=1) through the same path.  GPU speed and CUDA-graph capture are not exercised here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from _sglang_batch import MAX_CONTEXT, SGLangCPUBatch
from _sglang_env import load_with_sglang
from test_forward import FIRST_CHUNK, NEW_TOKENS, PROMPTS, check_against_transformers

from atom_core.errors import UnsupportedConfigError

pytestmark = pytest.mark.sglang

# Dense with GQA, a sliding window (Mistral's tiny window is 32, the longest prompt 50), hybrid GDN (the backend as
# the full-attention half of SGLang's HybridLinearAttnBackend).
ARCHS = ["Qwen3ForCausalLM", "MistralForCausalLM", "Qwen3NextForCausalLM"]
PAGE_SIZES = [1, 4]
SAME = 1e-5  # ATOM's reference vs SGLang's torch-native SDPA, fp32: measured ~1e-7


@pytest.fixture(scope="module", autouse=True)
def registered():
    """What atom-sglang's plugin does in every SGLang process."""
    from atom_sglang import attention_backend

    attention_backend.register()


@pytest.fixture(scope="module")
def models(cpu_runtime, tiny_checkpoints):
    cache = {}

    def get(arch):
        if arch not in cache:
            cache[arch] = load_with_sglang(tiny_checkpoints[arch])
        return cache[arch]

    return get


def run_steps(model, backend: str, page_size: int, graph_bs: int | None = None) -> list[torch.Tensor]:
    """Chunked prefill of test_forward's prompts, then greedy decode; each step's next-token logits."""
    batch = SGLangCPUBatch(model, len(PROMPTS), backend=backend, page_size=page_size)
    first = batch.step({0: PROMPTS[0], 1: PROMPTS[1], 2: PROMPTS[2][:FIRST_CHUNK]})
    rest = batch.step({2: PROMPTS[2][FIRST_CHUNK:]})
    logits = torch.stack([first[0], first[1], rest[0]])
    steps = [logits]
    for _ in range(NEW_TOKENS - 1):
        tokens = {b: [t] for b, t in enumerate(logits.argmax(-1).tolist())}
        logits = batch.step(tokens, graph_bs=graph_bs)
        steps.append(logits)
    return steps


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("arch", ARCHS)
@torch.inference_mode()
def test_same_as_torch_native_and_transformers(arch, page_size, models, tiny_checkpoints):
    model = models(arch)
    ours = run_steps(model, "atom", page_size)
    theirs = run_steps(model, "torch_native", page_size)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        err = (a - b).abs().max().item()
        assert err < SAME, f"{arch} page {page_size}, step {step}: max |atom - torch_native| = {err:.3g}"
    batch = check_against_transformers(arch, tiny_checkpoints[arch], model, backend="atom", page_size=page_size)
    assert type(batch.backend).__name__ in ("AtomAttnBackend", "HybridLinearAttnBackend")


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@torch.inference_mode()
def test_gpt_oss_sinks_and_sliding_window(page_size, models, tiny_checkpoints):
    """gpt-oss: sinks on every layer, a window of 16 on every other one, the 50-token prompt prefilled 30 + 20."""
    arch = "GptOssForCausalLM"
    model = models(arch)
    windows = {layer.attn.sliding_window_size for layer in model.atom_host.attention_layers}
    assert windows == {-1, 15}, windows  # SGLang's convention: transformers' 16 minus the query itself
    check_against_transformers(arch, tiny_checkpoints[arch], model, backend="atom", page_size=page_size)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@torch.inference_mode()
def test_decode_through_the_cuda_graph_hooks(page_size, models):
    """Decode steps with metadata from the capture / replay hook, for a graph of 4 requests (3 real, 1 padding):
    the same logits as eager decode, and the metadata lives in the same static buffers at every step."""
    model = models("Qwen3ForCausalLM")
    eager = run_steps(model, "atom", page_size)
    graphed = run_steps(model, "atom", page_size, graph_bs=4)
    for step, (a, b) in enumerate(zip(eager, graphed)):
        assert (a - b).abs().max().item() < SAME, f"page {page_size}, step {step}"

    batch = SGLangCPUBatch(model, len(PROMPTS), backend="atom", page_size=page_size)
    batch.step({b: p for b, p in enumerate(PROMPTS)})
    pointers = set()
    for token in (3, 4):
        batch.step({0: [token], 1: [token], 2: [token]}, graph_bs=4)
        md = batch.backend.forward_metadata
        pointers.add((md.block_table.data_ptr(), md.seq_lens.data_ptr(), md.query_start_loc.data_ptr()))
        assert md.block_table.shape == (4, MAX_CONTEXT // page_size)
        assert md.seq_lens.tolist() == [len(p) + token - 2 for p in PROMPTS] + [1]
    assert len(pointers) == 1


@torch.inference_mode()
def test_fp8_kv_cache(models):
    """SGLang's fp8 e4m3 pool (uint8 storage viewed as fp8): ATOM's op writes and reads it in place.  The prefill
    logits stay within rounding of the fp32-cache run (measured 0.047 of ~1.3) and pick the same tokens."""
    model = models("Qwen3ForCausalLM")
    fp32 = SGLangCPUBatch(model, len(PROMPTS), backend="atom", page_size=4)
    fp8 = SGLangCPUBatch(model, len(PROMPTS), torch.float8_e4m3fn, backend="atom", page_size=4)
    a, b = (batch.step({i: p for i, p in enumerate(PROMPTS)}) for batch in (fp32, fp8))
    assert fp8.kv_pool.k_buffer[0].dtype == torch.uint8 and fp8.kv_pool.get_key_buffer(0).dtype == torch.float8_e4m3fn
    assert fp8.kv_pool.k_buffer[0].any()
    assert (a - b).abs().max().item() < 0.1 and torch.equal(a.argmax(-1), b.argmax(-1))


# ----------------------------------------------------------------------------------------------- refusals
def runner(pool_dtype=torch.float32, **overrides):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    req_pool = ReqToTokenPool(size=2, max_context_len=16, device="cpu", enable_memory_saver=False)
    pool = MHATokenToKVPool(size=32, page_size=1, dtype=pool_dtype, head_num=2, head_dim=8, layer_num=1, device="cpu",
                            enable_memory_saver=False)
    return SimpleNamespace(**{"device": "cpu", "req_to_token_pool": req_pool, "token_to_kv_pool": pool, "page_size": 1,
                              "use_mla_backend": False, "model_config": None, "kv_index_translator": None, **overrides})


def refusal(fn, *args) -> str:
    with pytest.raises(UnsupportedConfigError) as err:
        fn(*args)
    message = str(err.value)
    assert "\n" not in message and message.startswith("SGLang attention backend 'atom' (ATOM paged attention): ")
    return message


def test_refuses_what_it_lacks_in_one_line(cpu_runtime, monkeypatch):
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    from atom_sglang import attention_backend, compat
    from atom_sglang.attention_backend import AtomAttnBackend

    assert type(attention_backend.create_backend(runner())) is AtomAttnBackend
    assert "latent attention (MLA)" in refusal(AtomAttnBackend, runner(use_mla_backend=True))
    assert "encoder-decoder" in refusal(AtomAttnBackend, runner(model_config=SimpleNamespace(is_encoder_decoder=True)))
    assert "unified KV pool" in refusal(AtomAttnBackend, runner(kv_index_translator=SimpleNamespace(is_translating=True)))
    swa = object.__new__(SWAKVPool)
    assert "--disable-hybrid-swa-memory" in refusal(AtomAttnBackend, runner(token_to_kv_pool=swa))
    assert "float8_e5m2" in refusal(AtomAttnBackend, runner(pool_dtype=torch.float8_e5m2))
    AtomAttnBackend(runner(pool_dtype=torch.float8_e4m3fn))  # fp8 e4m3: ATOM's op takes it
    monkeypatch.setattr(compat, "speculative_algorithm", lambda: "EAGLE")
    assert "speculative decoding (EAGLE)" in refusal(AtomAttnBackend, runner())


def test_refuses_layers_and_modes_it_lacks_in_one_line(cpu_runtime):
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from atom_sglang.attention_backend import AtomAttnBackend

    backend = AtomAttnBackend(runner())
    mode = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, encoder_lens=None)
    assert "forward mode TARGET_VERIFY" in refusal(backend.init_forward_metadata, mode)
    backend.init_cuda_graph_state(2, 2)
    extend = SimpleNamespace(forward_mode=ForwardMode.EXTEND, encoder_lens=None)
    assert "CUDA graphs of forward mode EXTEND" in refusal(backend.init_forward_metadata_out_graph, extend)

    q = torch.zeros(1, 2 * 8)
    batch = SimpleNamespace(out_cache_loc=torch.zeros(1, dtype=torch.long))
    cross = RadixAttention(2, 8, 1.0, 2, layer_id=0, is_cross_attention=True)
    assert "cross attention" in refusal(backend.forward_extend, q, q, q, cross, batch)
    layer = RadixAttention(2, 8, 1.0, 2, layer_id=0)
    message = refusal(lambda: backend.forward_decode(q, q, q, layer, batch, True, q_rope=q))
    assert "['q_rope']" in message


# ------------------------------------------------------------------------------------ SGLang's own arguments
ARGS_SCRIPT = """
import json, sys
from sglang.srt.server_args import prepare_server_args

def backend(args):
    try:
        server_args = prepare_server_args(args + ["--device", "cpu"])
        getattr(server_args, "resolve_once", lambda: None)()
        try:
            from sglang.srt.arg_groups.overrides import resolved_view
            return resolved_view(server_args).attention_backend
        except ImportError:
            return server_args.attention_backend
    except SystemExit:
        return "argparse refused"
    except AssertionError as error:
        return "AssertionError: " + str(error).splitlines()[0]

qwen, gpt_oss = sys.argv[1:3]
out = {"before": backend(["--model-path", qwen, "--attention-backend", "atom"])}
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
out["registered"] = ATTENTION_BACKENDS["atom"].__module__
out["after"] = backend(["--model-path", qwen, "--attention-backend", "atom"])
out["default"] = backend(["--model-path", qwen])
out["gpt-oss"] = backend(["--model-path", gpt_oss, "--attention-backend", "atom"])
print(json.dumps(out))
"""


def test_sglang_accepts_attention_backend_atom_after_the_plugin(tiny_checkpoints):
    """In a fresh interpreter, through SGLang's plugin loader and argument parser; SGLANG_PLUGINS limits the
    plugins to atom-sglang's."""
    env = dict(os.environ, SGLANG_PLUGINS="atom")
    paths = [tiny_checkpoints["Qwen3ForCausalLM"], tiny_checkpoints["GptOssForCausalLM"]]
    result = subprocess.run([sys.executable, "-c", ARGS_SCRIPT, *paths], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["before"] == "argparse refused"
    assert out["registered"] == "atom_sglang.attention_backend"
    assert out["after"] == "atom"
    assert out["default"] not in ("atom", "argparse refused"), out
    # SGLang's server arguments accept a fixed list of backends for GptOssForCausalLM (no extension point)
    assert out["gpt-oss"].startswith("AssertionError: GptOssForCausalLM requires one of"), out


# ------------------------------------------------------------------------------------------ Triton kernels
TRITON_SCRIPT = """
import json, sys, torch
sys.path[:0] = [sys.argv[3]]
from _sglang_env import load_with_sglang, start_cpu_runtime
from atom_sglang import attention_backend
from atom_kernels import paged_attention, reshape_and_cache
import test_forward

def fallback(*args, **kwargs):
    raise AssertionError("the torch reference ran: a Triton kernel refused this call")
for op in (paged_attention, reshape_and_cache):  # no silent fallback to the reference
    op._impls["reference"] = (fallback, None)
start_cpu_runtime(sys.argv[1])
attention_backend.register()
model = load_with_sglang(sys.argv[1])
with torch.inference_mode():
    test_forward.check_against_transformers(sys.argv[2], sys.argv[1], model, backend="atom", page_size=4)
q = torch.zeros(1, 2, 8)
cache = torch.zeros(2, 4, 1, 8)
args = (q, cache, cache, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32),
        torch.tensor([0, 1], dtype=torch.int32), 1.0)
print(json.dumps({"paged_attention": paged_attention.resolve(*args)[0],
                  "reshape_and_cache": reshape_and_cache.resolve(q[:, :1], q[:, :1], cache, cache,
                                                                 torch.zeros(1, dtype=torch.long))[0]}))
"""


def test_triton_kernels_through_the_interpreter(tiny_checkpoints):
    """gpt-oss (sinks, window, GQA) through the backend with ATOM's Triton kernels (TRITON_INTERPRET=1), paged."""
    arch = "GptOssForCausalLM"
    env = dict(os.environ, TRITON_INTERPRET="1", ATOM_KERNEL_BACKEND="paged_attention=triton,reshape_and_cache=triton")
    tests = os.path.dirname(__file__)
    result = subprocess.run([sys.executable, "-c", TRITON_SCRIPT, tiny_checkpoints[arch], arch, tests], env=env,
                            capture_output=True, text=True, timeout=900, cwd=tests)
    assert result.returncode == 0, result.stderr[-6000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"paged_attention": "triton",
                                                                  "reshape_and_cache": "triton"}
