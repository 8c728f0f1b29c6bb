"""DeepSeek sparse attention's kernels: ``indexer_scores``, ``topk_indices`` and ``sparse_mla``, Triton against the
torch reference, and the reference against the definitions written out per token.

Odd sizes (3 and 5 heads, head dims 20 and 48, pages of 4 and 16 tokens), padding tokens (``token_seq`` -1, rows
with no finite score, queries with no slot), block tables whose unused entries are -1, ties at the top-k threshold,
``k`` beyond the row length.  Host size: an 8192-token prefill chunk continuing a context to 12000 tokens, with
DeepSeek-V3.2's top-k of 2048, through the reference's chunked paths (checked row by row against the definition on
sampled rows); the Triton kernels run on a slice of it under the interpreter (the whole chunk would take the
interpreter hours).  On a GPU, ``test_dsa_host_size_cuda`` runs every kernel on every row of 8192- and 16384-token
chunks at DeepSeek-V3.2's shapes (its code runs here at a small size: ``test_dsa_host_case_runs_small``).

Tolerances: scores fp32 1e-5 relative (summation order); selections exact; attention fp32 1e-5, bf16 2e-2
(``helpers.REL_TOL``).
"""

import pytest
import torch
from helpers import REL_TOL, assert_close

from atom_kernels import indexer_scores, mla_decode, sparse_mla, topk_indices

FP32, BF16 = torch.float32, torch.bfloat16


def to(device, args):
    """``args`` with every tensor moved to ``device`` (inputs are drawn on the CPU from the test's generator)."""
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def run(backend, op, device, *args):
    """``op``'s ``backend`` on ``args`` moved to ``device``, the result back on the CPU."""
    return op.call_backend(backend, *to(device, args)).cpu()


def paged_keys(lens, dim, page, gen, dtype=FP32, spare=3):
    """A key cache with each sequence's blocks scattered over it and -1 past them in the block table."""
    used = [-(-n // page) for n in lens]
    num_blocks = sum(used) + spare
    cache = torch.randn(num_blocks, page, dim, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.full((len(lens), max(used) + 1), -1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(used):
        table[b, :n] = perm[start : start + n].int()
        start += n
    return cache, table


def step_tokens(lens, query_lens):
    """``token_seq``/``token_pos`` of a step whose sequence b adds its last ``query_lens[b]`` tokens (a query length
    of 0 adds one padding token)."""
    seq, pos = [], []
    for b, (n, q) in enumerate(zip(lens, query_lens)):
        if q == 0:
            seq.append(-1)
            pos.append(-1)
        seq += [b] * q
        pos += list(range(n - q, n))
    return torch.tensor(seq, dtype=torch.int32), torch.tensor(pos, dtype=torch.int32)


def indexer_case(lens, query_lens, heads, dim, page, gen, dtype=FP32):
    cache, table = paged_keys(lens, dim, page, gen, dtype)
    token_seq, token_pos = step_tokens(lens, query_lens)
    q = torch.randn(len(token_seq), heads, dim, generator=gen).to(dtype)
    weights = torch.randn(len(token_seq), heads, generator=gen)
    return q, weights, cache, table, token_seq, token_pos, dim**-0.5


def scores_by_definition(q, weights, cache, table, token_seq, token_pos, scale):
    page = cache.shape[1]
    out = torch.full((q.shape[0], table.shape[1] * page), float("-inf"))
    for t in range(q.shape[0]):
        b, last = int(token_seq[t]), int(token_pos[t])
        for j in range(last + 1 if b >= 0 else 0):
            key = cache[table[b, j // page], j % page].float()
            out[t, j] = (weights[t].float() * torch.relu(q[t].float() @ key * scale)).sum()
    return out


@pytest.mark.parametrize("heads,dim,page", [(3, 20, 4), (5, 48, 16)])
def test_indexer_scores(heads, dim, page, rng, device):
    args = indexer_case([1, 13, 40, 7], [1, 5, 0, 7], heads, dim, page, rng)
    ref = run("reference", indexer_scores, device, *args)
    want = scores_by_definition(*args)
    assert torch.equal(torch.isinf(ref), torch.isinf(want)), "visible positions differ from the definition"
    finite = torch.isfinite(want)
    assert_close(ref[finite], want[finite], FP32)
    out = run("triton", indexer_scores, device, *args)
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    assert_close(out[finite], ref[finite], FP32)
    assert torch.isinf(out[args[4] < 0]).all(), "a padding token sees nothing"


def test_indexer_scores_bf16(rng, device):
    args = indexer_case([30, 9], [30, 1], 4, 32, 8, rng, BF16)
    out, ref = (run(b, indexer_scores, device, *args) for b in ("triton", "reference"))
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(out))
    assert_close(out[finite], ref[finite], BF16)


def test_topk_indices(rng, device):
    scores = torch.randn(7, 300, generator=rng)
    scores[0, 10:] = float("-inf")  # fewer finite scores than k
    scores[1] = float("-inf")  # a padding row
    scores[2, 40:80] = 10.0  # ties across the threshold (above every normal draw): the lowest positions win
    scores[3, ::2] = -0.0
    scores[3, 1::2] = 0.0  # signed zeros tie
    for k in (1, 16, 100, 299, 512):
        ref = run("reference", topk_indices, device, scores, k)
        out = run("triton", topk_indices, device, scores, k)
        assert torch.equal(out, ref), f"k={k}"
        assert (ref[1] == -1).all() and (ref[0, 10:] == -1).all()
        if k >= 10:
            assert torch.equal(ref[0, :10], torch.arange(10).int())
    ref = topk_indices.call_backend("reference", scores, 16)
    assert torch.equal(ref[2, :16], torch.arange(40, 56).int())  # 40 tied maxima, the first 16 taken
    for row in (4, 5, 6):  # no ties: the set torch.topk chooses
        want = scores[row].topk(16).indices.sort().values.int()
        assert torch.equal(ref[row], want)


def sparse_case(tokens, heads, latent, rope, page, k, gen, dtype=FP32):
    num_blocks = 9
    cache = torch.randn(num_blocks, page, latent + rope, generator=gen).to(dtype)
    q = torch.randn(tokens, heads, latent + rope, generator=gen).to(dtype)
    slots = torch.stack([torch.randperm(num_blocks * page, generator=gen)[:k] for _ in range(tokens)]).int()
    slots[0, k // 2 :] = -1  # a query with fewer selected rows than k
    slots[1] = -1  # nothing selected: zeros
    return q, cache, slots, (latent + rope) ** -0.5, latent


@pytest.mark.parametrize("heads,latent,rope,page,k,dtype", [(3, 48, 16, 4, 20, FP32), (17, 64, 8, 16, 37, FP32),
                                                           (16, 64, 16, 16, 64, BF16)])
def test_sparse_mla(heads, latent, rope, page, k, dtype, rng, device):
    args = sparse_case(6, heads, latent, rope, page, k, rng, dtype)
    ref = run("reference", sparse_mla, device, *args)
    out = run("triton", sparse_mla, device, *args)
    assert out.dtype == dtype and (out[1] == 0).all() and (ref[1] == 0).all()
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("heads,dim,page,k,dtype", [(3, 32, 4, 20, FP32), (17, 64, 16, 37, BF16)])
def test_sparse_mla_with_sinks_over_whole_rows(heads, dim, page, k, dtype, rng, device):
    """DeepSeek-V4's use: the whole row is key and value (no rope part), per-head sinks join the softmax; the
    reference is the sink formula and the Triton kernel equals it."""
    q, cache, slots, scale, _ = sparse_case(6, heads, dim, 0, page, k, rng, dtype)
    sinks = torch.randn(heads, generator=rng)
    ref = run("reference", sparse_mla, device, q, cache, slots, scale, dim, sinks)
    out = run("triton", sparse_mla, device, q, cache, slots, scale, dim, sinks)
    assert (out[1] == 0).all() and (ref[1] == 0).all()
    assert_close(out, ref, dtype)
    t = 2  # the formula for one query
    rows = cache.reshape(-1, dim)[slots[t].long()].float()
    logits = torch.cat([q[t].float() @ rows.T * scale, sinks[:, None]], dim=-1)
    want = torch.softmax(logits, dim=-1)[:, :-1] @ rows
    assert_close(ref[t].float(), want, FP32 if dtype == FP32 else BF16)
    no_sinks = run("reference", sparse_mla, device, q, cache, slots, scale, dim)
    assert (no_sinks[t].float() - ref[t].float()).abs().max() > 1e-3  # the sinks take a share


def test_sparse_mla_over_every_row_is_dense_mla(rng):
    """Selecting a sequence's whole context gives ``mla_decode``'s dense attention (the reference is the same math
    with a gather in place of the block-table walk)."""
    lens = [5, 23]
    cache, table = paged_keys(lens, 40, 4, rng)
    q = torch.randn(2, 4, 40, generator=rng)
    slots = torch.full((2, 23), -1, dtype=torch.int32)
    for b, n in enumerate(lens):
        j = torch.arange(n)
        slots[b, :n] = (table[b, j // 4] * 4 + j % 4).int()
    dense = mla_decode.call_backend("reference", q, cache, table, torch.tensor(lens, dtype=torch.int32), 0.2, 32)
    assert_close(sparse_mla.call_backend("reference", q, cache, slots, 0.2, 32), dense, FP32)


def test_host_size_prefill_chunk(rng, device):
    """An 8192-token prefill chunk continuing a context to 12000 tokens (every query sees more than 2048), top-k 2048."""
    chunk, context, k, heads, dim, page = 8192, 12000, 2048, 2, 32, 64
    cache, table = paged_keys([context], dim, page, rng)
    token_seq, token_pos = step_tokens([context], [chunk])
    q = torch.randn(chunk, heads, dim, generator=rng)
    weights = torch.randn(chunk, heads, generator=rng)
    args = (q, weights, cache, table, token_seq, token_pos, dim**-0.5)
    scores = indexer_scores.call_backend("reference", *args)
    picked = topk_indices.call_backend("reference", scores, k)
    assert (picked >= 0).all(), "every query of the chunk sees more than k tokens"
    rows = torch.tensor([0, 1, chunk // 2, chunk - 1])
    want = scores_by_definition(q[rows], weights[rows], cache, table, token_seq[rows], token_pos[rows], dim**-0.5)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(scores[rows]))
    assert_close(scores[rows][finite], want[finite], FP32)
    for r in rows.tolist():  # the values torch.topk keeps (relu makes zero scores tie; which tie is free)
        want_values = scores[r].topk(k).values.sort().values
        assert torch.equal(scores[r, picked[r].long()].sort().values, want_values)
    # the Triton kernels on a slice of the same chunk (the interpreter is too slow for all of it)
    sub = rows[[0, 3]]
    assert torch.equal(run("triton", topk_indices, device, scores[sub].contiguous(), k), picked[sub])
    tail = slice(chunk - 2, chunk)
    got = run("triton", indexer_scores, device, q[tail], weights[tail], cache, table, token_seq[tail], token_pos[tail],
              dim**-0.5)
    assert_close(got[torch.isfinite(got)], scores[tail][torch.isfinite(scores[tail])], FP32)
    slots = (table[0, picked[tail].long() // page].long() * page + picked[tail].long() % page).int()
    latent = torch.randn(cache.shape[0], page, 72, generator=rng)
    q_abs = torch.randn(2, 16, 72, generator=rng)
    assert_close(run("triton", sparse_mla, device, q_abs, latent, slots, 72**-0.5, 64),
                 sparse_mla.call_backend("reference", q_abs, latent, slots, 72**-0.5, 64), FP32)


def gpu_rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``‖out - ref‖ / ‖ref‖`` where the tensors live (``helpers.rel_err`` copies both to the CPU in float64)."""
    assert torch.isfinite(out).all(), "non-finite output"
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def dsa_host_case(chunk, context, k, index_heads, index_dim, heads, latent, rope, page, device, dtype):
    """A prefill chunk of ``chunk`` tokens ending a ``context``-token sequence: every kernel on every row against its
    reference (scores relative, selections exact, attention relative)."""
    g = torch.Generator().manual_seed(0)
    cache, table = paged_keys([context], index_dim, page, g, dtype)
    cache, table = cache.to(device), table.to(device)
    token_seq, token_pos = (t.to(device) for t in step_tokens([context], [chunk]))
    dg = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(chunk, index_heads, index_dim, generator=dg, device=device).to(dtype)
    weights = torch.randn(chunk, index_heads, generator=dg, device=device)
    args = (q, weights, cache, table, token_seq, token_pos, index_dim**-0.5)
    ref = indexer_scores.call_backend("reference", *args)
    out = indexer_scores.call_backend("triton", *args)
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(out))
    assert gpu_rel_err(out[finite], ref[finite]) <= REL_TOL[dtype]
    picked = topk_indices.call_backend("reference", ref, k)
    assert torch.equal(topk_indices.call_backend("triton", ref, k), picked)
    used = picked >= 0
    slots = torch.where(used, table[0].long()[picked.long().clamp(min=0) // page] * page + picked.long() % page, -1)
    rows = torch.randn(cache.shape[0], page, latent + rope, generator=dg, device=device).to(dtype)
    q_abs = torch.randn(chunk, heads, latent + rope, generator=dg, device=device).to(dtype)
    mla_args = (q_abs, rows, slots.int(), (latent + rope) ** -0.5, latent)
    got, want = (sparse_mla.call_backend(b, *mla_args) for b in ("triton", "reference"))
    assert gpu_rel_err(got, want) <= REL_TOL[dtype]


def test_dsa_host_case_runs_small(device):
    """The GPU host-size case below, at a size the interpreter runs (so its own code is exercised here)."""
    dsa_host_case(48, 300, 64, 4, 32, 16, 64, 16, 16, device, FP32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host-size tests need a GPU")
@pytest.mark.parametrize("chunk", [8192, 16384])
def test_dsa_host_size_cuda(chunk):
    """DeepSeek-V3.2's shapes (64 index heads of 128, top-k 2048, 128 heads over a 512 + 64 latent, page 64), bf16,
    a prefill chunk ending a 20000-token context (select the GPU run with ``-k host_size``)."""
    dsa_host_case(chunk, 20000, 2048, 64, 128, 128, 512, 64, 64, "cuda", BF16)


def test_bad_shapes_name_the_argument():
    with pytest.raises(ValueError, match="weights"):
        indexer_scores(torch.zeros(2, 3, 8), torch.zeros(2, 4), torch.zeros(1, 4, 8), torch.zeros(1, 1, dtype=torch.int32),
                       torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), 1.0)
    with pytest.raises(ValueError, match="positive int"):
        topk_indices(torch.zeros(2, 3), 0)
    with pytest.raises(ValueError, match="slots"):
        sparse_mla(torch.zeros(2, 3, 8), torch.zeros(1, 4, 8), torch.zeros(3, 2, dtype=torch.int32), 1.0, 4)
    with pytest.raises(ValueError, match="sinks"):
        sparse_mla(torch.zeros(2, 3, 8), torch.zeros(1, 4, 8), torch.zeros(2, 2, dtype=torch.int32), 1.0, 8,
                   torch.zeros(4))
