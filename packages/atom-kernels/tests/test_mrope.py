"""MRoPE: the Triton kernel against the torch reference, and the reference against transformers'
Qwen2-VL / Qwen3-VL / Qwen3.5 rotary embeddings."""


import pytest
import torch
from conftest import INTERPRET
from helpers import assert_close, assert_graph_capturable, randn

from atom_kernels import dispatch, mrope, rms_norm, rotary_embedding
from atom_kernels.ops.mrope import triton as mrope_triton
from atom_kernels.ops.mrope.reference import section_rows
from atom_kernels.ops.mrope.triton import unsupported

MAX_POS = 97

# (q heads, kv heads, head_size, rotary_dim, mrope_section): full and partial rotary, head counts that
# are not powers of two, Qwen3.5's proportions (rotary = head / 4).
SHAPES = [
    (4, 2, 32, 32, (6, 5, 5)),
    (3, 1, 64, 16, (3, 3, 2)),
    (6, 5, 24, 24, (4, 4, 4)),
]


def _positions(num_tokens, rng, device, rows=3, dtype=torch.int64):
    shape = (rows, num_tokens) if rows == 3 else (num_tokens,)
    return torch.randint(0, MAX_POS, shape, generator=rng).to(device=device, dtype=dtype)


def _run(backend, qkv, positions, cache, shape, interleaved, norm=None, qk_view=None):
    """Apply ``backend`` to a copy of the fused qkv rows; returns the whole buffer (v must stay untouched)."""
    num_heads, num_kv_heads, head_size, _, section = shape
    buf = qkv.clone()
    q, k, _ = buf.split([num_heads * head_size, num_kv_heads * head_size, num_kv_heads * head_size], dim=-1)
    if qk_view is not None:
        q, k = qk_view(q), qk_view(k)
    mrope.call_backend(backend, positions, q, k, cache, head_size, section, interleaved, **(norm or {}))
    return buf


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True], ids=["chunked", "interleaved"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"h{s[0]}-kv{s[1]}-d{s[2]}-r{s[3]}")
@pytest.mark.parametrize("num_tokens", [1, 13])
def test_kernel_matches_reference(device, rng, dtype, interleaved, shape, num_tokens):
    num_heads, num_kv_heads, head_size, rotary_dim, _ = shape
    cache = randn(MAX_POS, rotary_dim, device=device, gen=rng)
    positions = _positions(num_tokens, rng, device)
    qkv = randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_size, dtype=dtype, device=device, gen=rng)
    out = _run("triton", qkv, positions, cache, shape, interleaved)
    ref = _run("reference", qkv, positions, cache, shape, interleaved)
    assert_close(out, ref, dtype)
    # v and every dim past rotary_dim are untouched
    q_k_heads = out[:, : (num_heads + num_kv_heads) * head_size].view(num_tokens, -1, head_size)
    q_k_orig = qkv[:, : (num_heads + num_kv_heads) * head_size].view(num_tokens, -1, head_size)
    assert torch.equal(q_k_heads[..., rotary_dim:], q_k_orig[..., rotary_dim:])
    assert torch.equal(out[:, (num_heads + num_kv_heads) * head_size :], qkv[:, (num_heads + num_kv_heads) * head_size :])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weight_offset", [0.0, 1.0])
@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[1]], ids=["full-rotary", "partial-rotary"])
def test_fused_qk_norm_matches_reference(device, rng, dtype, weight_offset, shape):
    num_heads, num_kv_heads, head_size, rotary_dim, _ = shape
    num_tokens = 7
    cache = randn(MAX_POS, rotary_dim, device=device, gen=rng)
    positions = _positions(num_tokens, rng, device, dtype=torch.int32)
    qkv = randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_size, dtype=dtype, device=device, gen=rng, scale=3.0)
    norm = dict(q_weight=randn(head_size, dtype=dtype, device=device, gen=rng),
                k_weight=randn(head_size, dtype=dtype, device=device, gen=rng), eps=1e-6, weight_offset=weight_offset)
    out = _run("triton", qkv, positions, cache, shape, True, norm)
    ref = _run("reference", qkv, positions, cache, shape, True, norm)
    assert_close(out, ref, dtype)


def test_reference_fused_norm_is_rms_norm_then_mrope(rng):
    """The fused form is exactly rms_norm per head followed by the rotation."""
    from atom_kernels.ops.rms_norm.reference import rms_norm

    shape = SHAPES[1]
    num_heads, num_kv_heads, head_size, rotary_dim, section = shape
    cache = randn(MAX_POS, rotary_dim, gen=rng)
    positions = _positions(5, rng, "cpu")
    q = randn(5, num_heads, head_size, gen=rng)
    k = randn(5, num_kv_heads, head_size, gen=rng)
    wq, wk = randn(head_size, gen=rng), randn(head_size, gen=rng)
    fused_q, fused_k = q.clone(), k.clone()
    mrope.call_backend("reference", positions, fused_q, fused_k, cache, head_size, section, True,
                       q_weight=wq, k_weight=wk, eps=1e-5, weight_offset=1.0)
    two_q, two_k = rms_norm(q, wq, 1e-5, None, 1.0), rms_norm(k, wk, 1e-5, None, 1.0)
    mrope.call_backend("reference", positions, two_q, two_k, cache, head_size, section, True)
    torch.testing.assert_close(fused_q, two_q, rtol=0, atol=0)
    torch.testing.assert_close(fused_k, two_k, rtol=0, atol=0)


def test_strided_heads_and_q_only(device, rng):
    """q heads interleaved with a gate as Qwen3.5's q_proj lays them out ([T, H, 2D] -> [..., :D]); k absent."""
    num_tokens, num_heads, head_size, rotary_dim, section = 5, 3, 32, 16, (3, 3, 2)
    cache = randn(MAX_POS, rotary_dim, device=device, gen=rng)
    positions = _positions(num_tokens, rng, device)
    q_gate = randn(num_tokens, num_heads, 2 * head_size, device=device, gen=rng)
    outs = {}
    for backend in ("reference", "triton"):
        buf = q_gate.clone()
        mrope.call_backend(backend, positions, buf[..., :head_size], None, cache, head_size, section, True)
        outs[backend] = buf
    assert_close(outs["triton"], outs["reference"])
    assert torch.equal(outs["triton"][..., head_size:], q_gate[..., head_size:])


# Every kernel variant of the bench sweep, on layouts that exercise its masks: (name, q heads, kv heads,
# head_size, rotary_dim, section, interleaved, q interleaved with an output gate, fused norm).
VARIANT_CASES = [
    # Qwen3.5's proportions (rotary = head / 4, interleaved, gated q, zero-centred norm), head counts not
    # powers of two
    ("qwen3.5-like", 5, 3, 64, 16, (3, 3, 2), True, True, True),
    ("qwen3.5-like-rope", 5, 3, 64, 16, (3, 3, 2), True, True, False),
    # head_size not a multiple of rotary_dim: the last chunk is partly past the head
    ("uneven-chunks", 3, 2, 40, 16, (3, 3, 2), False, False, True),
    # rotary half (12) not a power of two, full rotary
    ("odd-half", 3, 1, 24, 24, (4, 4, 4), False, True, True),
]
VARIANT_CONFIGS = [mrope_triton.Config(1, 1), mrope_triton.Config(2, 2), mrope_triton.Config(4, 1),
                   mrope_triton.Config(2, 1, "pairs")]


@pytest.mark.parametrize("config", VARIANT_CONFIGS, ids=lambda c: f"{c.kernel}-h{c.block_h}-w{c.num_warps}")
@pytest.mark.parametrize("case", VARIANT_CASES, ids=lambda c: c[0])
def test_kernel_variants_on_poisoned_strided_buffers(device, rng, case, config):
    """Each variant against the reference with q (and its gate) and k as views into one fused projection row
    whose gate and v parts are NaN: a read outside a head poisons the result, a write outside one clears
    the NaNs, and head blocks that overhang the head count must stay inside their tensor."""
    _, num_heads, num_kv_heads, head_size, rotary_dim, section, interleaved, gated, fused = case
    num_tokens, q_width = 5, num_heads * head_size * (2 if gated else 1)
    widths = [q_width, num_kv_heads * head_size, num_kv_heads * head_size]
    rows = randn(num_tokens, sum(widths), device=device, gen=rng, scale=2.0)
    q_part, _, v_part = rows.split(widths, dim=-1)
    if gated:
        q_part.view(num_tokens, num_heads, 2 * head_size)[..., head_size:] = float("nan")
    v_part.fill_(float("nan"))
    cache = randn(MAX_POS, rotary_dim, device=device, gen=rng)
    positions = _positions(num_tokens, rng, device)
    norm = dict(q_weight=randn(head_size, device=device, gen=rng, scale=0.3),
                k_weight=randn(head_size, device=device, gen=rng, scale=0.3), eps=1e-6,
                weight_offset=1.0) if fused else dict(q_weight=None, k_weight=None, eps=1e-6, weight_offset=0.0)

    def views(buf):
        q, k, _ = buf.split(widths, dim=-1)
        q = q.view(num_tokens, num_heads, -1)[..., :head_size]  # strided when gated
        return q, k.view(num_tokens, num_kv_heads, head_size)

    got, want = rows.clone(), rows.clone()
    mrope_triton.launch(positions, *views(got), cache, head_size, section, interleaved, norm["q_weight"],
                        norm["k_weight"], norm["eps"], norm["weight_offset"], config)
    mrope.call_backend("reference", positions, *views(want), cache, head_size, section, interleaved, **norm)
    for got_x, want_x in zip(views(got), views(want)):
        assert_close(got_x, want_x)
    poisoned = torch.isnan(rows)
    assert torch.isnan(got[poisoned]).all(), "a poisoned element (gate or v) was overwritten"
    assert not torch.isnan(got[~poisoned]).any(), "poison leaked into q or k"


def test_configs_name_known_kernels():
    for config in mrope_triton.CONFIGS.values():
        assert config.kernel in mrope_triton.KERNELS, config
    q = torch.zeros(1, 32)
    with pytest.raises(ValueError, match="unknown mrope kernel"):
        mrope_triton.launch(torch.zeros(3, 1, dtype=torch.long), q, None, torch.zeros(4, 16), 32, (3, 3, 2), True,
                            None, None, 1e-6, 0.0, mrope_triton.Config(1, 1, "nope"))


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_text_positions_are_plain_neox_rope(device, rng, backend):
    """1-D positions, or three equal rows, are ordinary NeoX rotary embedding whatever the section."""
    num_tokens, num_heads, head_size, rotary_dim = 9, 2, 32, 32
    cache = randn(MAX_POS, rotary_dim, device=device, gen=rng)
    flat = _positions(num_tokens, rng, device, rows=1)
    q, k = randn(num_tokens, num_heads * head_size, device=device, gen=rng), randn(num_tokens, head_size, device=device, gen=rng)
    want_q, want_k = rotary_embedding.call_backend("reference", flat, q.clone(), k.clone(), cache, head_size, True)
    for positions, interleaved in ((flat, True), (flat.expand(3, -1), False), (flat.expand(3, -1), True)):
        got_q, got_k = mrope.call_backend(backend, positions, q.clone(), k.clone(), cache, head_size, (6, 5, 5), interleaved)
        assert_close(got_q, want_q)
        assert_close(got_k, want_k)


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [32, 16], ids=["full-rotary", "partial-rotary"])
def test_one_row_section_with_norm_is_qk_norm_then_rope(device, rng, backend, dtype, rotary_dim):
    """The call atom-core's RotaryEmbedding makes for Qwen3 (q/k norm fused): section (rotary_dim/2, 0, 0), 1-D
    positions, q and k as views of the q|k|v rows, equals rms_norm per head then rotary_embedding; v untouched."""
    num_tokens, num_heads, num_kv_heads, head_size = 11, 3, 1, 32
    cache = randn(MAX_POS, rotary_dim, device=device, gen=rng)
    positions = _positions(num_tokens, rng, device, rows=1)
    qkv = randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_size, device=device, gen=rng).to(dtype)
    q_w, k_w = (randn(head_size, device=device, gen=rng).to(dtype) for _ in range(2))
    sizes = [num_heads * head_size, num_kv_heads * head_size, num_kv_heads * head_size]
    want = qkv.clone()
    q, k, _ = want.split(sizes, dim=-1)
    q_n = rms_norm.call_backend("reference", q.reshape(-1, head_size), q_w, 1e-6).view(q.shape)
    k_n = rms_norm.call_backend("reference", k.reshape(-1, head_size), k_w, 1e-6).view(k.shape)
    q_r, k_r = rotary_embedding.call_backend("reference", positions, q_n, k_n, cache, head_size, True)
    q.copy_(q_r)
    k.copy_(k_r)
    got = qkv.clone()
    q, k, _ = got.split(sizes, dim=-1)
    mrope.call_backend(backend, positions, q, k, cache, head_size, (rotary_dim // 2, 0, 0), False,
                       q_weight=q_w, k_weight=k_w, eps=1e-6)
    assert_close(got, want)


def test_section_rows_of_published_configs():
    chunked = section_rows((16, 24, 24), interleaved=False)  # Qwen2-VL / Qwen2.5-VL
    assert chunked.tolist() == [0] * 16 + [1] * 24 + [2] * 24
    interleaved = section_rows((24, 20, 20), interleaved=True)  # Qwen3-VL
    assert interleaved[:6].tolist() == [0, 1, 2, 0, 1, 2]
    assert interleaved[57:].tolist() == [0, 1, 2, 0, 0, 0, 0]  # H/W stop at 3*20 = 60
    assert [int((interleaved == r).sum()) for r in range(3)] == [24, 20, 20]
    qwen35 = section_rows((11, 11, 10), interleaved=True)  # Qwen3.5, rotary_dim 64
    assert [int((qwen35 == r).sum()) for r in range(3)] == [11, 11, 10]


@pytest.mark.skipif(not INTERPRET, reason="imports kernels in interpreter mode: CPU-only check")
def test_unsupported_calls_fall_back(monkeypatch):
    cache = torch.randn(MAX_POS, 16)
    q, k = torch.randn(4, 2 * 32), torch.randn(4, 32)
    positions = torch.zeros(3, 4, dtype=torch.long)
    assert unsupported(positions, q, k, cache, 32, (3, 3, 2)) is None
    assert "mrope_section" in unsupported(positions, q, k, cache, 32, (4, 4, 4))
    assert "fp32" in unsupported(positions, q, k, cache.half(), 32, (3, 3, 2))
    assert "positions" in unsupported(torch.zeros(2, 4, dtype=torch.long), q, k, cache, 32, (3, 3, 2))
    assert "together" in unsupported(positions, q, k, cache, 32, (3, 3, 2), q_weight=torch.ones(32))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(dispatch.ENV_OVERRIDE, "triton")
    assert mrope.resolve(positions, q, k, cache.half(), 32, (3, 3, 2))[0] == "reference"
    with pytest.raises(ValueError, match="mrope_section"):
        mrope(positions, q, k, cache, 32, (4, 4, 4))


# ------------------------------------------------------------------ the reference against transformers
def _hf_cases():
    from transformers import Qwen2VLTextConfig, Qwen3_5TextConfig, Qwen3VLTextConfig
    from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2_vl
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen3_5
    from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3_vl

    return {
        # chunked sections over the full head
        "qwen2_vl": (qwen2_vl.Qwen2VLRotaryEmbedding, qwen2_vl.apply_rotary_pos_emb, False, 32, 32, (4, 6, 6),
                     Qwen2VLTextConfig(hidden_size=64, num_attention_heads=2, max_position_embeddings=MAX_POS,
                                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                        "mrope_section": [4, 6, 6]})),
        # interleaved sections over the full head
        "qwen3_vl": (qwen3_vl.Qwen3VLTextRotaryEmbedding, qwen3_vl.apply_rotary_pos_emb, True, 32, 32, (6, 5, 5),
                     Qwen3VLTextConfig(head_dim=32, max_position_embeddings=MAX_POS,
                                       rope_parameters={"rope_type": "default", "rope_theta": 5e5,
                                                        "mrope_section": [6, 5, 5], "mrope_interleaved": True})),
        # interleaved sections over a quarter of the head (partial rotary)
        "qwen3_5": (qwen3_5.Qwen3_5TextRotaryEmbedding, qwen3_5.apply_rotary_pos_emb, True, 64, 16, (3, 3, 2),
                    Qwen3_5TextConfig(head_dim=64, max_position_embeddings=MAX_POS,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                                       "partial_rotary_factor": 0.25, "mrope_section": [3, 3, 2],
                                                       "mrope_interleaved": True})),
    }


@pytest.mark.parametrize("model", ["qwen2_vl", "qwen3_vl", "qwen3_5"])
def test_reference_matches_transformers(rng, model):
    pytest.importorskip("transformers")
    rope_cls, apply_rope, interleaved, head_size, rotary_dim, section, config = _hf_cases()[model]
    hf_rope = rope_cls(config)
    num_tokens, num_heads, num_kv_heads = 11, 3, 2
    positions = _positions(num_tokens, rng, "cpu")
    q = randn(num_tokens, num_heads, head_size, gen=rng)
    k = randn(num_tokens, num_kv_heads, head_size, gen=rng)
    cos, sin = hf_rope(q, positions[:, None, :])  # position ids [3, batch, T]
    assert cos.shape[-1] == rotary_dim
    want_q, want_k = apply_rope(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    # ATOM's cache: cos|sin of position * inv_freq, the inverse frequencies transformers uses
    inv_freq = hf_rope.inv_freq.float()
    angles = torch.arange(MAX_POS, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    got_q, got_k = mrope.call_backend("reference", positions, q.clone(), k.clone(), cache, head_size, section, interleaved)
    torch.testing.assert_close(got_q, want_q[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k, want_k[0].transpose(0, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("fused", [False, True], ids=["rope", "qknorm+rope"])
def test_cuda_graph_capturable(rng, fused):
    num_heads, num_kv_heads, head_size, rotary_dim, section = SHAPES[1]
    cache = randn(MAX_POS, rotary_dim, device="cuda", gen=rng)
    positions = _positions(11, rng, "cuda")
    qk = randn(11, (num_heads + num_kv_heads) * head_size, dtype=torch.bfloat16, device="cuda", gen=rng)
    norm = dict(q_weight=randn(head_size, dtype=torch.bfloat16, device="cuda", gen=rng),
                k_weight=randn(head_size, dtype=torch.bfloat16, device="cuda", gen=rng), weight_offset=1.0) if fused else {}

    def rotate_copy():
        out = qk.clone()
        q, k = out[:, : num_heads * head_size], out[:, num_heads * head_size :]
        mrope.call_backend("triton", positions, q, k, cache, head_size, section, True, **norm)
        return out

    assert_graph_capturable(rotate_copy, qk)
