import pytest
import torch

from atom_core.runtime.sampler import SamplingParams, sample, top_p_filter


def test_greedy_picks_argmax_and_reports_logprob():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, -1.0, 0.5]])
    tokens, logprobs = sample(logits, SamplingParams())
    assert tokens.tolist() == [1, 0]
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, -1)[[0, 1], [1, 0]])


def test_top_p_keeps_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    kept = torch.isfinite(top_p_filter(logits, 0.5))
    assert kept.tolist() == [[True, False, False, False]]


def test_temperature_sampling_follows_the_distribution_and_is_seeded():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().expand(20000, 3)
    params = SamplingParams(temperature=1.0, seed=7)
    tokens, _ = sample(logits, params, torch.Generator().manual_seed(7))
    freq = torch.bincount(tokens, minlength=3).float() / tokens.numel()
    assert torch.allclose(freq, probs, atol=0.02)
    again, _ = sample(logits, params, torch.Generator().manual_seed(7))
    assert torch.equal(tokens, again)


def test_low_temperature_approaches_greedy():
    logits = torch.randn(64, 50)
    tokens, _ = sample(logits, SamplingParams(temperature=1e-4, seed=0), torch.Generator().manual_seed(0))
    assert torch.equal(tokens, logits.argmax(-1))


@pytest.mark.parametrize("bad", [dict(max_new_tokens=0), dict(temperature=-1.0), dict(top_p=0.0)])
def test_invalid_params(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)
