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

    def __init__(self, layout: str):
        self.layout = layout
        self.step: LinearAttentionStep | None = None

    def linear_attention_state(self, prefix, layer_id, conv_shape, ssm_shape, dtype):
        assert (tuple(conv_shape), tuple(ssm_shape)) == gdn_state_shapes(CFG)
        host = self

        class State:
            ssm_layout = host.layout

            def step(self):
                return host.step

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
