"""Temperature and top-p at the extremes of their valid ranges: finite distributions, tiny
temperatures and top-p a point mass at the argmax (as greedy), huge temperatures near uniform."""

import pytest
import torch

from specray.kernels.sampling import SamplingConfig, processed_probs


@pytest.fixture()
def logits():
    return torch.randn(4, 97, generator=torch.Generator().manual_seed(0)) * 30  # [rows, vocab_size]


@pytest.mark.parametrize("config", [SamplingConfig(1e-38), SamplingConfig(5e-324), SamplingConfig(1e-30, top_k=5),
                                    SamplingConfig(1.0, top_p=1e-38), SamplingConfig(1.0, top_p=1e-50),
                                    SamplingConfig(1.0, top_p=5e-324), SamplingConfig(1e-20, top_p=0.5)])
def test_tiny_temperature_or_top_p_is_a_point_mass_at_the_argmax(logits, config):
    probs = processed_probs(logits, [config] * 4)
    assert torch.isfinite(probs).all()
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 97).float())


def test_huge_temperature_is_near_uniform(logits):
    probs = processed_probs(logits, [SamplingConfig(1e30)] * 4)
    assert torch.isfinite(probs).all() and torch.allclose(probs, torch.full_like(probs, 1 / 97))


def test_the_shift_leaves_ordinary_temperatures_alone(logits):
    """Subtracting the row max first is softmax's own shift: the same law to float rounding."""
    for t in (0.3, 1.0, 2.5):
        want = (logits.double() / t).softmax(-1).float()
        assert torch.allclose(processed_probs(logits, [SamplingConfig(t)] * 4), want, atol=1e-6)


@pytest.mark.parametrize("other", [SamplingConfig(top_p=0.9), SamplingConfig(top_k=5), SamplingConfig(min_p=0.1)])
def test_a_rows_distribution_does_not_depend_on_its_batchs_options(other):
    """Another row's top_p ran the top-p cut on every row: a row without one lost the tail tokens
    whose float32 running sum had rounded to 1.0 (46k of a 49k vocabulary at these logits), so a
    request's target distribution depended on who shared its batch. Top-k and min-p as a check."""
    logits = torch.randn(2, 49152, generator=torch.Generator().manual_seed(1)) * 8  # [rows, vocab_size]
    alone = processed_probs(logits[:1], [SamplingConfig()])[0]
    beside = processed_probs(logits, [SamplingConfig(), other])[0]
    assert torch.equal(alone, beside)
    assert (alone > 0).sum() == 49152


def test_uniforms_are_finer_than_float32s_grid():
    """float32's uniforms sit on a 2^-24 grid: a token under 2^-24 of the mass was drawn with
    probability 0 or 2^-24, and the acceptance test u * p < q was quantised the same way."""
    from specray.kernels.sampling import make_generator, uniforms

    for generators in (make_generator(3), [make_generator(4), None]):
        u = uniforms([500, 500] if isinstance(generators, list) else [1000], generators)
        assert u.dtype == torch.float64 and ((u * 2**24) % 1 != 0).float().mean() > 0.9
