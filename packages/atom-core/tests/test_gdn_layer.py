"""The Gated DeltaNet layer against the host contract (``LinearAttentionStep``), with a host that hands
it arbitrary steps: a mixed step (decode tokens first, then packed prefills, then padding) equals the
same sequences run in separate decode and prefill steps; speculative decode writes per-token states."""

from __future__ import annotations

import pytest
import torch

from atom_core.host import LinearAttentionStep, SingleRank
from atom_core.layers.gdn import GatedDeltaNet, GDNConfig, gdn_state_shapes
from atom_kernels.gdn import K_MAJOR, V_MAJOR, ssm_state_shape

CFG = GDNConfig(hidden_size=64, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, conv_kernel=4, rms_norm_eps=1e-6)
SLOTS = 6


@pytest.fixture
def rng():
    seed = torch.seed() % 2**31
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


class StepHost:
    """A host whose linear-attention state returns whatever step the test sets."""

    tp = SingleRank()
    quant = None

    def __init__(self, layout: str, cfg: GDNConfig = CFG):
        self.layout, self.cfg = layout, cfg
        self.step: LinearAttentionStep | None = None

    def linear_attention_state(self, prefix, layer_id, conv_shape, ssm_shape, dtype, mix):
        assert (tuple(conv_shape), tuple(ssm_shape)) == gdn_state_shapes(self.cfg)
        host = self

        class State:
            ssm_layout = host.layout

            def step(self):
                return host.step

            def run(self, *inputs):
                return mix(*inputs, self.step())

        return State()


def make_layer(rng, layout):
    host = StepHost(layout)
    layer = GatedDeltaNet(CFG, 0, host=host, prefix="layers.0.linear_attn")
    with torch.no_grad():
        for name, param in layer.named_parameters():
            param.copy_(torch.randn(param.shape, generator=rng) * (0.3 if "weight" in name else 1.0))
        layer.A_log.copy_(torch.empty(4).uniform_(0.05, 0.5, generator=rng).log())
    conv_shape, ssm_shape = gdn_state_shapes(CFG)
    pools = (torch.randn(SLOTS, *conv_shape, generator=rng),
             torch.randn(SLOTS, *ssm_state_shape(layout, *ssm_shape), generator=rng))
    return layer, host, pools


def step(pools, layout, **fields):
    return LinearAttentionStep(conv_state=pools[0], ssm_state=pools[1], ssm_layout=layout, **fields)


def cu_seqlens(lengths) -> torch.Tensor:
    """``[0, l0, l0 + l1, ...]`` (int32): the offsets of packed sequences of these lengths."""
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def clone(pools):
    return tuple(p.clone() for p in pools)


@pytest.mark.parametrize("layout", [K_MAJOR, V_MAJOR])
def test_mixed_step_equals_separate_steps(rng, layout):
    layer, host, pools = make_layer(rng, layout)
    decode_x = torch.randn(2, 64, generator=rng)  # sequences in slots 4 and 1, one token each
    prefill_x = torch.randn(9, 64, generator=rng)  # two prefills: 6 tokens continuing slot 0, 3 fresh in slot 5
    pad = torch.randn(2, 64, generator=rng)
    decode = dict(num_decode_tokens=2, decode_slots=torch.tensor([4, 1]))
    prefill = dict(num_prefill_tokens=9, prefill_cu_seqlens=torch.tensor([0, 6, 9], dtype=torch.int32),
                   prefill_slots=torch.tensor([0, 5]), prefill_has_initial_state=torch.tensor([True, False]))
    with torch.no_grad():
        mixed_pools = clone(pools)
        host.step = step(mixed_pools, layout, **decode, **prefill)
        mixed = layer(torch.cat([decode_x, prefill_x, pad]))
        separate_pools = clone(pools)
        host.step = step(separate_pools, layout, **decode)
        want_decode = layer(decode_x)
        host.step = step(separate_pools, layout, **prefill)
        want_prefill = layer(prefill_x)
    torch.testing.assert_close(mixed[:2], want_decode)
    torch.testing.assert_close(mixed[2:11], want_prefill)
    torch.testing.assert_close(mixed[11:], torch.zeros_like(mixed[11:]))
    for got, want, original in zip(mixed_pools, separate_pools, pools):
        torch.testing.assert_close(got, want)
        assert not torch.equal(got[[0, 1, 4, 5]], original[[0, 1, 4, 5]])
        assert torch.equal(got[[2, 3]], original[[2, 3]])


def test_padding_decode_slot_outputs_zero(rng):
    layer, host, pools = make_layer(rng, K_MAJOR)
    x = torch.randn(3, 64, generator=rng)
    before = clone(pools)
    with torch.no_grad():
        host.step = step(pools, K_MAJOR, num_decode_tokens=3, decode_slots=torch.tensor([2, -1, 3]))
        out = layer(x)
    torch.testing.assert_close(out[1], torch.zeros_like(out[1]))  # out_proj(norm(0)) = 0: no bias
    assert not torch.equal(pools[1][2], before[1][2])


def test_speculative_decode_keeps_per_token_states(rng):
    """Two tokens per sequence with per-token SSM slots: slot t holds the state after token t, which equals
    running the tokens one decode step at a time."""
    layer, host, pools = make_layer(rng, V_MAJOR)
    x = torch.randn(4, 64, generator=rng)  # sequence 0: tokens 0, 1; sequence 1: tokens 2, 3
    with torch.no_grad():
        spec_pools = clone(pools)
        host.step = step(spec_pools, V_MAJOR, num_decode_tokens=4, decode_slots=torch.tensor([0, 1]),
                         decode_ssm_slots=torch.tensor([[0, 2], [1, 3]]))
        spec = layer(x)
        one = clone(pools)
        outs = []
        for t in range(2):
            host.step = step(one, V_MAJOR, num_decode_tokens=2, decode_slots=torch.tensor([0, 1]))
            outs.append(layer(x[[t, 2 + t]]))
            if t == 0:
                after_first = one[1][[0, 1]].clone()
    torch.testing.assert_close(spec[[0, 2]], outs[0])
    torch.testing.assert_close(spec[[1, 3]], outs[1])
    torch.testing.assert_close(spec_pools[1][[0, 1]], after_first)  # slots[:, 0]: state after the first token
    torch.testing.assert_close(spec_pools[1][[2, 3]], one[1][[0, 1]])  # slots[:, 1]: after the second


def test_speculative_steps_resume_from_the_accepted_tokens(rng):
    """vLLM's speculative contract: a conv buffer ``W - 2 + 3`` columns wide (plain steps use its first ``W - 1``),
    three SSM blocks per sequence, steps of one token and two drafts of which 2, 1, then 3 are accepted.  Every
    speculative output equals decoding the same tokens one at a time from the accepted prefix; the last step also
    has a second sequence of fewer tokens (ragged ``decode_cu_seqlens``) and a prefill interleaved with them
    (``token_order``)."""
    num_spec, width = 2, CFG.conv_kernel
    layer, host, pools = make_layer(rng, V_MAJOR)
    conv_dim = pools[0].shape[1]
    wide = (torch.zeros(7, width - 1 + num_spec, conv_dim).transpose(1, 2),  # vLLM's (taps, dim) per block
            torch.zeros(7, *pools[1].shape[1:]))
    plain = (torch.zeros_like(pools[0]), torch.zeros_like(pools[1]))  # the reference: one slot per sequence
    blocks = {"a": [0, 1, 2], "b": [3, 4, 5]}
    ref_slot = {"a": 0, "b": 1, "c": 2}
    accepted = {"a": 1, "b": 1}

    def prefill(pools_, slots, xs):
        lens = [len(x) for x in xs]
        host.step = step(pools_, V_MAJOR, num_prefill_tokens=sum(lens),
                         prefill_cu_seqlens=cu_seqlens(lens),
                         prefill_slots=torch.tensor(slots), prefill_has_initial_state=torch.tensor([False] * len(xs)))
        return layer(torch.cat(xs))

    def decode_one_at_a_time(name, x):
        """Outputs of ``x``'s tokens decoded one by one from the reference state, and the states after each."""
        saved = clone(plain)
        outs, states = [], []
        for row in x:
            host.step = step(plain, V_MAJOR, num_decode_tokens=1, decode_slots=torch.tensor([ref_slot[name]]))
            outs.append(layer(row[None]))
            states.append((plain[0][ref_slot[name]].clone(), plain[1][ref_slot[name]].clone()))
        for pool, before in zip(plain, saved):
            pool.copy_(before)
        return torch.cat(outs), states

    def accept(name, states, n):
        for pool, state in zip(plain, states[n - 1]):
            pool[ref_slot[name]] = state
        accepted[name] = n

    def speculative_fields(names, lens):
        return dict(num_decode_tokens=sum(lens), decode_slots=torch.tensor([blocks[n][0] for n in names]),
                    decode_ssm_slots=torch.tensor([blocks[n] for n in names]),
                    num_accepted_tokens=torch.tensor([accepted[n] for n in names], dtype=torch.int32),
                    decode_cu_seqlens=cu_seqlens(lens))

    with torch.no_grad():
        prompts = {"a": torch.randn(5, 64, generator=rng), "b": torch.randn(3, 64, generator=rng)}
        want = prefill(plain, [0, 1], list(prompts.values()))
        torch.testing.assert_close(prefill(wide, [0, 3], list(prompts.values())), want)
        for n_accepted in (2, 1, 3):
            x = torch.randn(1 + num_spec, 64, generator=rng)
            want, states = decode_one_at_a_time("a", x)
            host.step = step(wide, V_MAJOR, **speculative_fields(["a"], [len(x)]))
            torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)
            accept("a", states, n_accepted)
        # a ragged step with an interleaved prefill: rows a0 c0 b0 c1 a1 b1 b2 c2 -> order a0 a1 b0 b1 b2 c0 c1 c2
        xa, xb, xc = (torch.randn(n, 64, generator=rng) for n in (2, 3, 3))
        batch = torch.stack([xa[0], xc[0], xb[0], xc[1], xa[1], xb[1], xb[2], xc[2]])
        order = torch.tensor([0, 4, 2, 5, 6, 1, 3, 7])
        want_a, _ = decode_one_at_a_time("a", xa)
        want_b, _ = decode_one_at_a_time("b", xb)
        want_c = prefill(plain, [ref_slot["c"]], [xc])
        host.step = step(wide, V_MAJOR, **speculative_fields(["a", "b"], [2, 3]), num_prefill_tokens=3,
                         prefill_cu_seqlens=torch.tensor([0, 3], dtype=torch.int32), prefill_slots=torch.tensor([6]),
                         prefill_has_initial_state=torch.tensor([False]), token_order=order)
        got = layer(torch.cat([batch, torch.randn(2, 64, generator=rng)]))  # and two padding rows
    torch.testing.assert_close(got[order[:2]], want_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[order[2:5]], want_b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[order[5:]], want_c, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[8:], torch.zeros_like(got[8:]))


WIDE = GDNConfig(hidden_size=64, num_k_heads=4, num_v_heads=32, head_k_dim=16, head_v_dim=16, conv_kernel=4,
                 rms_norm_eps=1e-6)  # 32 value heads (Qwen3-Next's): warm-up steps of 1, 8 and 32 sequences


def wide_layer(layout):
    host = StepHost(layout, WIDE)
    return GatedDeltaNet(WIDE, 0, host=host, prefix="layers.0.linear_attn"), host


@pytest.fixture
def triton_interpreted(monkeypatch):
    from atom_kernels.dispatch import ENV_OVERRIDE, triton_interpreting

    if not triton_interpreting():
        pytest.skip("records the launches Triton's interpreter runs (CPU)")
    monkeypatch.setenv(ENV_OVERRIDE, "triton")
    monkeypatch.setattr("atom_core.layers.gdn._WARMED", set())


def prefill_fields(slots, prompts):
    """A step's prefill part: ``prompts`` (lengths) in ``slots``, every other one continuing from its state."""
    return dict(num_prefill_tokens=sum(prompts), prefill_slots=slots, prefill_cu_seqlens=cu_seqlens(prompts),
                prefill_has_initial_state=torch.arange(len(prompts)) % 2 == 0)


def serving_steps(pools, layout):
    """Steps of the compositions a host sends: one prompt; decodes beside prompts (slots at odd offsets); many of
    both; decode only."""
    gen = torch.Generator().manual_seed(0)
    for decodes, prompts in ((0, [70]), (3, [5, 9]), (13, [4] * 11), (40, [2] * 37), (45, [])):
        nd, T = decodes, decodes + sum(prompts)
        slots = torch.randperm(pools[0].shape[0], generator=gen)[: nd + len(prompts)].to(torch.int32)
        fields = dict(num_decode_tokens=nd, decode_slots=slots[:nd]) if nd else {}
        if prompts:
            fields |= prefill_fields(slots[nd:], prompts)
        yield T, step(pools, layout, **fields)


def speculative_steps(pools, layout, num_spec):
    """Steps of a speculative host (rolling conv buffer, per-token SSM blocks): ragged draft sequences (1 to
    ``1 + num_spec`` tokens, some accepted) beside prompts; many of them; decode only."""
    gen = torch.Generator().manual_seed(1)
    for lens, prompts in (([3, 1, 2], [5, 9]), ([1 + num_spec] * 13, [4] * 11), ([2] * 40, [])):
        nd, n = sum(lens), len(lens)
        T = nd + sum(prompts)
        slots = torch.randperm(pools[0].shape[0], generator=gen)[: n + len(prompts)].to(torch.int32)
        blocks = torch.randint(0, pools[1].shape[0], (n, 1 + num_spec), generator=gen)
        fields = dict(num_decode_tokens=nd, decode_slots=slots[:n], decode_ssm_slots=blocks.to(torch.int32),
                      num_accepted_tokens=torch.randint(1, 1 + num_spec, (n,), generator=gen, dtype=torch.int32),
                      decode_cu_seqlens=cu_seqlens(lens))
        if prompts:
            fields |= prefill_fields(slots[n:], prompts)
        yield T, step(pools, layout, **fields)


@pytest.mark.parametrize("num_spec", [0, 2], ids=["plain", "speculative"])
@pytest.mark.parametrize("layout", [K_MAJOR, V_MAJOR])
def test_warm_up_step_compiles_what_serving_needs(triton_interpreted, layout, num_spec):
    """A step without tokens (a host's warm-up or profiling run) outputs zeros and runs the GDN kernels once per
    launch class on scratch pools laid out as the host's (here vLLM's: conv taps-major, no rows yet; with
    speculative decoding a rolling conv buffer ``num_spec`` columns wider), so no serving step of any composition
    launches a kernel variant (Triton specialization) not compiled then."""
    from atom_kernels.compile_keys import recording

    layer, _ = wide_layer(layout)
    conv_shape, ssm_shape = gdn_state_shapes(WIDE)
    conv_shape = (conv_shape[0], conv_shape[1] + num_spec)  # (conv_dim, W - 1 + num_spec)
    empty = (torch.empty(0, conv_shape[1], conv_shape[0]).transpose(1, 2),
             torch.empty(0, *ssm_state_shape(layout, *ssm_shape)))
    pools = (torch.zeros(96, conv_shape[1], conv_shape[0]).transpose(1, 2),
             torch.zeros(96, *ssm_state_shape(layout, *ssm_shape)))
    with torch.no_grad(), recording(launch=False) as warm:
        out = layer.mix(torch.randn(16, WIDE.conv_dim()), torch.randn(16, 2 * WIDE.num_v_heads), step(empty, layout))
    assert out.shape == (16, WIDE.num_v_heads, WIDE.head_v_dim) and not out.any()
    assert {"_intra_kernel", "_wu_kernel", "_state_kernel", "_out_kernel", "_conv_out_kernel", "_conv_state_kernel",
            "_conv_update_kernel"} <= set(warm), sorted(warm)
    steps = list(serving_steps(pools, layout)) + (list(speculative_steps(pools, layout, num_spec)) if num_spec else [])
    with torch.no_grad(), recording(launch=False) as serving:
        for T, serving_step in steps:
            layer.mix(torch.randn(T, WIDE.conv_dim()), torch.randn(T, 2 * WIDE.num_v_heads), serving_step)
    new = {kernel: keys - warm.get(kernel, set()) for kernel, keys in serving.items()}
    assert not any(new.values()), {kernel: len(keys) for kernel, keys in new.items() if keys}


def test_warm_up_runs_once_per_layer_shape_and_needs_the_pools_layout(triton_interpreted):
    from atom_kernels.compile_keys import recording

    def mix(layer, host):
        return layer.mix(torch.randn(4, WIDE.conv_dim()), torch.randn(4, 2 * WIDE.num_v_heads), host.step)

    layer, host = wide_layer(V_MAJOR)
    other, other_host = wide_layer(V_MAJOR)
    conv_shape, ssm_shape = gdn_state_shapes(WIDE)
    with torch.no_grad(), recording(launch=False) as launched:
        host.step = step((torch.tensor([]), torch.tensor([])), V_MAJOR)  # pools not yet known: nothing to warm
        mix(layer, host)
    assert not launched
    empty = step((torch.empty(0, *conv_shape), torch.empty(0, *ssm_state_shape(V_MAJOR, *ssm_shape))), V_MAJOR)
    with torch.no_grad(), recording(launch=False) as launched:
        host.step = other_host.step = empty
        mix(layer, host)
    assert launched
    with torch.no_grad(), recording(launch=False) as launched:
        mix(layer, host)
        mix(other, other_host)  # another layer of the same shape
    assert not launched
