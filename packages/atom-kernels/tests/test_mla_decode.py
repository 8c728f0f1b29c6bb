"""``mla_decode``: the Triton kernel against the torch reference on random paged latent caches.

Cases: DeepSeek's kv_lora_rank 512 + rope 64 and small odd sizes (64+16, 48+16); 1, 16 and 128 heads; ragged
lengths including 0 (padding rows) and 1, lengths that cross several blocks and the boundaries between splits
(one split, several, more splits than a short sequence has tokens); block tables whose unused entries are -1
and whose blocks are scattered over the cache; bf16 and fp32; and the batch a host sends (256 decode rows, vLLM's
default max_num_seqs).  The interpreter runs few, large cases to stay under a minute on a CPU.

Tolerances (``helpers.REL_TOL``, ‖out - ref‖ / ‖ref‖): fp32 1e-5 (summation order only); bf16 2e-2 (the output
is rounded to bf16 once, and the kernel's dots take bf16 operands on the GPU: p rounded to bf16 before ``p·V``,
as flash attention does).  Padding rows must be exactly zero.
"""


import pytest
import torch
from helpers import assert_close, assert_graph_capturable, rel_err

from atom_kernels import mla_decode
from atom_kernels.compile_keys import recording, size_specializations
from atom_kernels.dispatch import triton_interpreting
from atom_kernels.ops.mla_decode import triton as mla_triton

BF16, FP32 = torch.bfloat16, torch.float32


def paged_case(lens, heads, latent, rope, page, dtype, device, gen, spare_blocks=7, extra_columns=2):
    """q, a cache with ``spare_blocks`` blocks nobody owns, each sequence's blocks drawn at random from it, the
    table's unused entries -1 (and ``extra_columns`` columns past the longest sequence)."""
    dim = latent + rope
    used = [-(-n // page) for n in lens]
    num_blocks = sum(used) + spare_blocks
    cache = torch.randn(num_blocks, page, dim, generator=gen).to(dtype=dtype, device=device)
    q = torch.randn(len(lens), heads, dim, generator=gen).to(dtype=dtype, device=device)
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.full((len(lens), max(used) + extra_columns), -1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(used):
        table[b, :n] = perm[start : start + n].int()
        start += n
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return q, cache, table.to(device), seq_lens.to(device), dim**-0.5


def check(lens, heads, latent, rope, page, dtype, device, gen, config=None):
    q, cache, table, seq_lens, scale = paged_case(lens, heads, latent, rope, page, dtype, device, gen)
    out = mla_triton.mla_decode(q, cache, table, seq_lens, scale, latent, config=config)
    ref = mla_decode.call_backend("reference", q, cache, table, seq_lens, scale, latent)
    assert out.shape == (len(lens), heads, latent) and out.dtype == dtype
    pad = seq_lens == 0
    assert (out[pad] == 0).all(), "padding rows must be zeros"
    assert_close(out[~pad], ref[~pad], dtype)
    print(f"lens={lens[:8]} heads={heads} {latent}+{rope} page={page} {dtype}: rel err {rel_err(out, ref):.2e}, "
          f"max abs {(out.float() - ref.float()).abs().max().item():.2e}")
    return out, ref


def test_reference_matches_a_per_sequence_softmax(rng):
    """The vectorised reference against the definition, one sequence at a time."""
    lens = [0, 1, 5, 23]
    q, cache, table, seq_lens, scale = paged_case(lens, 3, 24, 8, 4, FP32, "cpu", rng)
    out = mla_decode.call_backend("reference", q, cache, table, seq_lens, scale, 24)
    for b, n in enumerate(lens):
        rows = cache[table[b, : -(-n // 4)].long()].reshape(-1, 32)[:n]
        want = torch.softmax(q[b] @ rows.T * scale, dim=-1) @ rows[:, :24] if n else torch.zeros(3, 24)
        torch.testing.assert_close(out[b], want, rtol=1e-5, atol=1e-6)


# (lens, heads, latent, rope, page, dtype, splits): splits None takes the launch's own choice
CASES = {
    "deepseek-bf16-h16-4splits": ([0, 1, 300, 1000], 16, 512, 64, 16, BF16, 4),
    "deepseek-fp32-h128": ([513, 17], 128, 512, 64, 64, FP32, 2),
    "odd-64+16-h1-fp32": ([0, 1, 2, 33, 95, 96, 97, 250], 1, 64, 16, 16, FP32, 3),
    "odd-48+16-h16-bf16-page1": ([1, 7, 64, 65, 130], 16, 48, 16, 1, BF16, 5),
    "odd-48+16-h16-fp32-direct": ([1, 31, 32, 33, 0, 200], 16, 48, 16, 16, FP32, 1),
    "more-splits-than-tokens": ([1, 3, 40], 16, 64, 16, 16, FP32, 8),
}


@pytest.mark.parametrize("name", list(CASES))
def test_triton_matches_reference(name, device, rng):
    lens, heads, latent, rope, page, dtype, splits = CASES[name]
    check(lens, heads, latent, rope, page, dtype, device, rng, mla_triton.Config(splits=splits))


def test_default_launch_splits_long_contexts(device, rng):
    """The default split choice (from shapes only) on one long sequence beside short ones."""
    lens = [2048, 3, 0]
    q, cache, table, seq_lens, scale = paged_case(lens, 16, 64, 16, 16, FP32, device, rng)
    assert mla_triton.num_splits(3, 1, table.shape[1] * 16, q.device) > 1
    out = mla_decode.call_backend("triton", q, cache, table, seq_lens, scale, 64)
    assert_close(out, mla_decode.call_backend("reference", q, cache, table, seq_lens, scale, 64))


def test_host_batch_of_256_decode_rows(device, rng):
    """vLLM's max_num_seqs of decode rows, DeepSeek's latent at TP8's 16 heads, short ragged contexts with padding
    rows (a captured batch larger than the live one).  One split: the interpreter's cost is per program, and the
    reduce would add 256 x 16 of them (the split path is covered above)."""
    gen_lens = torch.randint(1, 64, (256,), generator=rng)
    gen_lens[-13:] = 0
    lens = gen_lens.tolist()
    check(lens, 16, 512, 64, 16, BF16, device, rng, mla_triton.Config(splits=1))


def test_dispatch_falls_back_for_unsupported_calls(rng):
    q, cache, table, seq_lens, scale = paged_case([5, 9], 2, 16, 16, 4, FP32, "cpu", rng)
    assert mla_triton.unsupported(q, cache, table, seq_lens, scale, 16) is None
    strided = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert "contiguous" in mla_triton.unsupported(strided, cache, table, seq_lens, scale, 16)
    assert "kv_lora_rank 2048 > 1024" == mla_triton.unsupported(q, cache, table, seq_lens, scale, 2048)
    assert "float caches only" in mla_triton.unsupported(q, cache.to(torch.float8_e4m3fn), table, seq_lens, scale, 16)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        mla_decode.call_backend("reference", q, cache, table, seq_lens, scale, 32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_replays_new_lengths_and_tables():
    """Captured once, replayed after the lengths and block table change on the device (no host reads)."""
    gen = torch.Generator().manual_seed(0)
    q, cache, table, seq_lens, scale = paged_case([700, 5, 0, 64], 16, 512, 64, 16, BF16, "cuda", gen)

    def run():
        return mla_decode.call_backend("triton", q, cache, table, seq_lens, scale, 512)

    assert_graph_capturable(run, q)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    seq_lens.copy_(torch.tensor([60, 0, 16, 690], dtype=torch.int32))  # within each flipped row's blocks
    table.copy_(table.flip(0))
    graph.replay()
    torch.cuda.synchronize()
    want = mla_decode.call_backend("reference", q, cache, table, seq_lens, scale, 512)
    assert_close(captured, want, BF16)




@pytest.mark.skipif(not triton_interpreting(), reason="records the launches Triton's interpreter runs (CPU)")
def test_new_batch_compositions_compile_nothing_new(rng):
    """The split count and the strides that follow it are runtime arguments: decode steps of 1-200 sequences over
    short and long contexts compile one variant per output path (one split written directly / split and combined)."""
    compositions = [[5], [1, 40, 700], [300] * 17, [9] * 200, [3000] * 3, [0, 12, 64]]
    with recording(launch=False) as keys:
        for lens in compositions:
            q, cache, table, seq_lens, scale = paged_case(lens, 16, 64, 16, 16, FP32, "cpu", rng)
            mla_triton.mla_decode(q, cache, table, seq_lens, scale, 64)
    assert size_specializations(keys) == {}
    assert len({tuple(k for k in key if k[1] == "const") for key in keys["_split_kernel"]}) <= 2, keys["_split_kernel"]
    assert len(keys["_combine_kernel"]) == 1, keys["_combine_kernel"]
