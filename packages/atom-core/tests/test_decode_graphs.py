"""The native runner's decode graphs (``Runner(cuda_graphs=True)``): decode steps padded to batch buckets over
static buffers give the eager runner's tokens and log-probabilities.  On the CPU the padded steps run eagerly over
those buffers (padding rows, rows a larger batch left behind, table widths growing mid-generation, a reallocated
cache); on a GPU they are captured and replayed."""

from __future__ import annotations

import pytest
import torch

from atom_core.runtime.graphs import bucket_for, table_width
from atom_core.runtime.runner import Runner
from atom_core.runtime.sampler import SamplingParams

# batches of 3 (bucket 4), 4 (bucket 4: no padding), 1, then 3 again after 4 left real rows behind
BATCHES = [
    [[5, 17, 99, 3, 200, 41, 7], [11, 300], list(range(40, 70))],
    [[7, 8, 9], [1, 2, 3, 4, 5, 6], [90, 91], list(range(100, 131))],
    [[42]],
    [[3, 1, 4, 1, 5], [9, 2, 6], list(range(10, 25))],
]
ARCHS = ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM", "Qwen3NextForCausalLM",
         "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"]


def test_buckets_and_widths():
    assert [bucket_for(b) for b in (1, 3, 4, 5, 64, 65, 256)] == [1, 4, 4, 8, 64, 128, 256]
    assert bucket_for(257) is None
    assert [table_width(b) for b in (1, 16, 17, 33)] == [16, 16, 32, 64]


def _generate(runner, prompts, new_tokens=10):
    return runner.generate(prompts, SamplingParams(max_new_tokens=new_tokens, ignore_eos=True))


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_decode_steps_match_eager(tiny, device, arch):
    model_dir = tiny(arch)
    dtype = torch.float32  # on a GPU too: padded GEMMs may take other cuBLAS kernels, so keep rounding small
    # block size 2: the longest prompts cross 16 blocks while decoding, so the table widens (a second graph)
    eager = Runner(model_dir, device=device, dtype=dtype, block_size=2)
    graphs = Runner(model_dir, device=device, dtype=dtype, block_size=2, cuda_graphs=True)
    assert graphs.decode_graphs is not None and graphs.decode_graphs.capture == (device == "cuda")
    for prompts in BATCHES:
        want, got = _generate(eager, prompts), _generate(graphs, prompts)
        for w, g in zip(want, got):
            assert g.token_ids == w.token_ids, (arch, prompts)
            err = max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs))
            assert err < (1e-4 if device == "cpu" else 1e-2), (arch, err)
    used = sorted(graphs.decode_graphs._static)
    assert (4, 16) in used and (4, 32) in used and (1, 16) in used, used
    # the last batch (3 sequences) ran in buffers a batch of 4 had filled: its fourth row is padding again
    last = graphs.decode_graphs._static[(4, 16)]
    assert last.slot_mapping[3] == -1 and last.state_slots[3] == -1 and last.seq_lens[3] == 1, arch
    assert last.input_ids[3] == 0 and not last.block_table[3].any() and not last.positions[:, 3].any(), arch


def test_a_larger_cache_drops_the_graphs(tiny):
    runner = Runner(tiny("Qwen3ForCausalLM"), block_size=2, cuda_graphs=True)
    want = _generate(Runner(tiny("Qwen3ForCausalLM"), block_size=2), BATCHES[0] * 3, new_tokens=4)
    _generate(runner, BATCHES[0], new_tokens=4)
    cache = runner.host.kv_cache
    got = _generate(runner, BATCHES[0] * 3, new_tokens=4)  # needs more blocks: a new cache, new buffers
    assert runner.host.kv_cache is not cache and [g.token_ids for g in got] == [w.token_ids for w in want]
    assert {bucket for bucket, _ in runner.decode_graphs._static} == {16}  # the batch-of-3 buffers were dropped
