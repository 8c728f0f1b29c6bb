"""MXFP4 weights in the "lanes" byte order (``formats.mxfp4_rows_to_lanes``), which the sm_90 small-M ring
kernel decodes with its activations in natural K order: the permutation itself, the op's backends reading it
(the warpgroup-MMA kernel through the interpreter on CPU; the ring kernel on an H200), and the errors.  (The ring
kernel's correctness and every-code-and-scale tests run both layouts: ``test_mxfp4_small_m.py``.)"""

import pytest
import torch
from helpers import assert_close, assert_graph_capturable, every_code_pair_word, randn

from atom_kernels import formats, mxfp4_mm
from atom_kernels.ops.mxfp4_mm import decode, planner, preferred_layout

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _weight(n, k, gen):
    w = randn(n, k, gen=gen, scale=0.05) * torch.rand(n, 1, generator=gen) * 4
    return formats.quantize_mxfp4(w)


def _lanes_bits(word: int) -> int:
    """A byte-ordered word's bits as the lanes layout stores them (bit ``b`` <- bit ``LANES_BIT_SOURCES[b]``)."""
    return sum(((word >> source) & 1) << b for b, source in enumerate(formats.LANES_BIT_SOURCES))


def test_lanes_permutation():
    """Inside each 64-byte block, word ``4 t + j`` of the lanes layout holds bytes ``16 j + 4 p + t`` of the
    checkpoint's (p = 0..3) with its bits permuted by ``LANES_BIT_SOURCES`` (a permutation of the 32 bits); the
    inverse restores it; the scale group of every code is kept within its block."""
    assert sorted(formats.LANES_BIT_SOURCES) == list(range(32))
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 256, (3, 2, 192), generator=gen, dtype=torch.uint8)  # K = 384: 3 blocks
    lanes = formats.mxfp4_rows_to_lanes(rows)
    assert lanes.shape == rows.shape and not torch.equal(lanes, rows)
    for block in range(3):
        for t in range(4):
            for j in range(4):
                byte_word = rows[..., [64 * block + 16 * j + 4 * p + t for p in range(4)]].long()
                byte_word = sum(byte_word[..., p] << (8 * p) for p in range(4))
                got = lanes[..., 64 * block + 16 * t + 4 * j:][..., :4].long()
                got = sum(got[..., p] << (8 * p) for p in range(4))
                want = torch.tensor([_lanes_bits(int(w)) for w in byte_word.flatten()]).view(got.shape)
                assert torch.equal(got, want), (block, t, j)
    assert torch.equal(formats.mxfp4_lanes_to_rows(lanes), rows)
    assert torch.equal(formats.mxfp4_in_rows(lanes, "lanes"), rows) and formats.mxfp4_in_rows(rows, "rows") is rows


def _run_decode_ptx(asm: str, word: int) -> list[int]:
    """The integer part of ``LANES_DECODE_ASM`` on one word, instruction by instruction (its 5 opcodes), returning
    the 4 registers it multiplies by the scale."""
    regs, out = {"$4": word}, []

    def val(a):
        return regs[a] if a in regs else int(a, 0)

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        a = [x.strip() for x in args.split(",")]
        if op == "and.b32":
            regs[a[0]] = val(a[1]) & val(a[2])
        elif op == "or.b32":
            regs[a[0]] = val(a[1]) | val(a[2])
        elif op == "shl.b32":
            regs[a[0]] = (val(a[1]) << val(a[2])) & 0xFFFFFFFF
        elif op == "shr.u32":
            regs[a[0]] = val(a[1]) >> val(a[2])
        elif op == "shf.l.wrap.b32":  # funnel shift of a[2]:a[1] left, upper word
            r = val(a[3]) % 32
            regs[a[0]] = ((val(a[2]) << 32 | val(a[1])) << r >> 32) & 0xFFFFFFFF
        elif op == "mul.rn.bf16x2":
            assert a[2] == "$5"
            out.append(val(a[1]))
        else:
            raise AssertionError(f"unexpected instruction {line!r}")
    return out


def test_lanes_decode_every_code_pair():
    """``LANES_DECODE_ASM`` (run by a model of its 5 PTX opcodes) on a lanes word gives exactly what ``DECODE_ASM``
    gives on the byte-ordered word: the bf16 patterns of ``code * 2**-126``, for all 256 code pairs at all 4
    positions (the other codes of the word random).  10 PTX integer instructions per word, 9 once ptxas merges the
    mask and the OR of register 0 into one LOP3 (the sm_90 SASS tests count them); the byte order takes 13."""
    asm = decode.LANES_DECODE_ASM.value
    integer_ops = [ln for ln in asm.splitlines() if ln.strip().split(" ")[0] in
                   ("and.b32", "or.b32", "shl.b32", "shr.u32", "shf.l.wrap.b32", "prmt.b32")]
    assert len(integer_ops) == 10
    for pair, byte, word, lo, hi in every_code_pair_word():
        regs = _run_decode_ptx(asm, _lanes_bits(word))
        assert regs == [decode.decode_pair_bits(word, p) for p in range(4)], (pair, byte)
        assert decode.decode_lanes_pair_bits(_lanes_bits(word), pair) == regs[pair]
        assert regs[pair] & 0xFFFF == lo and regs[pair] >> 16 == hi, (pair, byte)


def test_paired_scale_multipliers():
    """``SCALE_PAIR_ASM`` (run by a model of its 2 PTX opcodes) on a word of 4 scale bytes gives, in each half of its
    two registers, exactly the bf16 multiplier ``2**(e - 1 - SHIFT)`` that the one-scale-per-register path builds
    (``(e + 127 - SHIFT - 1) * 0x00800080``): groups 0 and 2 in the first register, 1 and 3 in the second, for every
    scale byte the loader admits at every position."""
    asm = decode.SCALE_PAIR_ASM.value
    lines = [ln.strip().rstrip(";") for ln in asm.splitlines() if ln.strip() and ln.strip() not in "{}"
             and not ln.strip().startswith(".reg")]

    def run(word):
        regs = {"$2": word, "0": 0}
        for line in lines:
            op, args = line.split(None, 1)
            a = [x.strip() for x in args.split(",")]
            if op == "prmt.b32":
                regs[a[0]] = decode._prmt(regs[a[1]], regs[a[2]], int(a[3], 0))
            elif op == "mad.lo.u32":
                regs[a[0]] = (regs[a[1]] * int(a[2], 0) + int(a[3], 0)) & 0xFFFFFFFF
            else:
                raise AssertionError(f"unexpected instruction {line!r}")
        return regs["$0"], regs["$1"]

    def single(e):
        return ((e + 127 - decode._SHIFT - 1) * 0x00800080) & 0xFFFF

    max_byte = 254 - (127 - decode._SHIFT - 1)  # the largest scale whose multiplier is a normal bf16 (the loader's cap)
    gen = torch.Generator().manual_seed(0)
    for e in range(max_byte + 1):
        others = torch.randint(0, max_byte + 1, (4,), generator=gen).tolist()
        for pos in range(4):
            groups = others[:pos] + [e] + others[pos + 1:]
            lo, hi = run(sum(g << (8 * i) for i, g in enumerate(groups)))
            assert lo == single(groups[0]) | single(groups[2]) << 16, (e, pos)
            assert hi == single(groups[1]) | single(groups[3]) << 16, (e, pos)


def test_lanes_decode_halves():
    """``LANES_DECODE_ASM_LOW`` / ``_HIGH`` are ``LANES_DECODE_ASM`` with the multiplier taken from one half of the
    paired register (broadcast to both lanes; ptxas folds it into the multiply's operand), the low or the high."""
    plain = decode.LANES_DECODE_ASM.value
    for asm, half in ((decode.LANES_DECODE_ASM_LOW.value, "{h, g}"), (decode.LANES_DECODE_ASM_HIGH.value, "{g, h}")):
        assert f"mov.b32 {half}, $5;" in asm and "mov.b32 m, {h, h};" in asm
        body = [ln for ln in asm.splitlines() if not ln.startswith((".reg .b16", ".reg .b32 m", "mov.b32"))]
        assert "\n".join(body).replace(", m;", ", $5;") == plain


def test_lanes_errors():
    """K not a multiple of 128, or an unknown layout name: a clear error from the op, never a silent result."""
    with pytest.raises(ValueError, match="multiple of 128"):
        formats.mxfp4_rows_to_lanes(torch.zeros(4, 48, dtype=torch.uint8))  # K = 96
    w, s = _weight(64, 96, torch.Generator().manual_seed(1))
    x = torch.randn(2, 96)
    with pytest.raises(ValueError, match="multiple of 128"):
        mxfp4_mm(x, w, s, layout="lanes")
    with pytest.raises(ValueError, match="unknown MXFP4 layout"):
        mxfp4_mm(x, w, s, layout="columns")


@pytest.mark.parametrize("m,n,k", [(1, 64, 256), (5, 100, 384), (17, 64, 512), (40, 130, 1024), (130, 72, 512),
                                   (300, 136, 256)])
def test_lanes_through_the_op(device, rng, m, n, k):
    """The op's Triton backend on lanes weights equals the reference on the checkpoint's (the warpgroup-MMA
    kernel reads lanes above 16 tokens and wherever the ring kernel does not run: CPU, K = 384; 130 and 300 tokens
    take its larger lanes configurations, ``LANES_CONFIGS``); bias, ragged N."""
    w, s = _weight(n, k, rng)
    lanes = formats.mxfp4_rows_to_lanes(w)
    bias = randn(n, gen=rng) if m % 2 else None
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    x = randn(m, k, gen=rng, dtype=dtype)
    ref = mxfp4_mm.call_backend("reference", x, w, s, bias)
    assert torch.equal(mxfp4_mm.call_backend("reference", x, lanes, s, bias, layout="lanes"), ref)
    out = mxfp4_mm.call_backend("triton", x.to(device), lanes.to(device), s.to(device),
                                bias.to(device) if bias is not None else None, layout="lanes")
    assert_close(out.cpu(), ref, dtype)


def test_preferred_layout_off_sm90():
    """Rows wherever the ring kernel cannot run (here: the CPU), lanes never for K % 128 != 0."""
    assert preferred_layout(8192, 8192, "cpu") == "rows"
    assert not planner.lanes_serve(8192, 2880, torch.device("cpu"))


@pytest.mark.skipif(not SM90, reason="the Gluon kernel is sm_90 only")
def test_preferred_layout_on_sm90():
    """On an sm_90 GPU with Triton 3.6: lanes wherever the ring kernel serves 16 tokens (K in whole 256-wide steps,
    at least 2 per split), rows elsewhere (gpt-oss's K = 2880)."""
    assert preferred_layout(8192, 8192, "cuda") == "lanes"
    assert preferred_layout(5760, 2880, "cuda") == "rows"


@pytest.mark.skipif(not SM90, reason="the Gluon kernel is sm_90 only")
def test_ring_kernel_lanes_cuda_graph_capturable(rng):
    x = randn(5, 2048, dtype=torch.bfloat16, device="cuda", gen=rng)
    w, s = _weight(384, 2048, rng)
    lanes, s = formats.mxfp4_rows_to_lanes(w).cuda(), s.cuda()
    bias = randn(384, dtype=torch.bfloat16, device="cuda", gen=rng)
    assert_graph_capturable(lambda: mxfp4_mm(x, lanes, s, bias, layout="lanes"), x)
