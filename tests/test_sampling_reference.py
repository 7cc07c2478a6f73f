"""The NumPy sampler: filters, categorical draws and their statistics."""

import numpy as np
import pytest

from glimmer_cupy.errors import GlimmerError
from glimmer_cupy.reference.philox import Purpose, uniform
from glimmer_cupy.reference.sampling import (
    GREEDY,
    SamplingParams,
    argmax,
    categorical,
    filtered_probs,
    sample_rows,
)


def chi2_critical(df: int) -> float:
    """Upper 1e-4 point of chi-square(df) by Wilson-Hilferty: a false failure in 10^4 runs."""
    z = 3.719
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def empirical(q: np.ndarray, n: int, seed: int) -> np.ndarray:
    us = uniform(seed, np.arange(n), Purpose.SAMPLE)
    counts = np.zeros(q.size)
    for u in us:
        counts[categorical(q, float(u))] += 1
    return counts


def assert_distribution(q: np.ndarray, counts: np.ndarray):
    n = counts.sum()
    assert np.all(counts[q == 0] == 0), "a zero-probability token was drawn"
    nz = q > 0
    exp = q[nz] * n
    stat = float(np.sum((counts[nz] - exp) ** 2 / exp))
    assert stat < chi2_critical(int(nz.sum()) - 1), stat


def test_argmax_ties_and_nan():
    x = np.array([[1.0, 3.0, 3.0, 0.0], [np.nan, 2.0, 5.0, 5.0]], np.float32)
    assert argmax(x).tolist() == [1, 2]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0),
    SamplingParams(temperature=0.7, top_k=5, top_p=1.0),
    SamplingParams(temperature=1.3, top_k=0, top_p=0.8),
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.02),
    SamplingParams(temperature=0.9, top_k=12, top_p=0.9, min_p=0.02),
])
def test_categorical_matches_filtered_distribution(params):
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, 40).astype(np.float32)
    q = filtered_probs(logits, params)
    assert_distribution(q, empirical(q, 20_000, seed=11))


def test_filters_keep_the_right_sets():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.06, 0.04]))
    q = filtered_probs(logits, SamplingParams(temperature=1.0, top_k=2, top_p=1.0))
    assert np.nonzero(q)[0].tolist() == [0, 1]
    q = filtered_probs(logits, SamplingParams(temperature=1.0, top_k=0, top_p=0.85))
    assert np.nonzero(q)[0].tolist() == [0, 1, 2]          # 0.4 + 0.3 < 0.85 <= 0.9
    q = filtered_probs(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.6))
    assert np.nonzero(q)[0].tolist() == [0, 1]             # >= 0.6 * 0.4
    assert abs(q.sum() - 1) < 1e-12
    # ties at the top-k threshold are all kept
    q = filtered_probs(np.array([1.0, 2.0, 2.0, 2.0, 0.0]), SamplingParams(temperature=1.0, top_k=2, top_p=1.0))
    assert np.nonzero(q)[0].tolist() == [1, 2, 3]


def test_rows_are_independent_of_batch():
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 3, (64, 300)).astype(np.float32)
    params = [SamplingParams(temperature=0.8, top_k=int(k), top_p=0.9, seed=int(s))
              for k, s in zip(rng.integers(0, 50, 64), rng.integers(0, 2 ** 63, 64))]
    positions = rng.integers(0, 5000, 64)
    tokens, flags = sample_rows(logits, params, positions)
    perm = rng.permutation(64)
    shuffled, _ = sample_rows(logits[perm], [params[i] for i in perm], positions[perm])
    assert np.array_equal(shuffled, tokens[perm])
    for r in (0, 17, 63):
        alone, _ = sample_rows(logits[r:r + 1], [params[r]], positions[r:r + 1])
        assert alone[0] == tokens[r]
    assert not flags.any()


def test_greedy_and_non_finite_rows():
    logits = np.array([[0.0, 1.0, 9.0], [np.nan, 1.0, 0.0], [-np.inf] * 3, [np.inf, 0.0, 1.0],
                       [-np.inf, -np.inf, 2.0]], np.float32)
    params = [SamplingParams(temperature=1.0, top_k=0, top_p=1.0)] * 4 + [SamplingParams(temperature=1.0)]
    tokens, flags = sample_rows(logits, params, np.zeros(5, int))
    assert flags.tolist() == [0, 1, 1, 1, 0]
    assert tokens[1] == 1 and tokens[2] == 0 and tokens[3] == 0 and tokens[4] == 2
    assert np.all((tokens >= 0) & (tokens < 3))
    g, _ = sample_rows(logits[:1], [GREEDY], [0])
    assert g[0] == 2


@pytest.mark.parametrize("kw,frag", [
    (dict(temperature=-0.1), "temperature"), (dict(top_p=0.0), "top-p"), (dict(top_p=1.01), "top-p"),
    (dict(top_k=-1), "top-k"), (dict(min_p=1.0), "min-p"), (dict(temperature=float("nan")), "temperature"),
])
def test_bad_parameters(kw, frag):
    with pytest.raises(GlimmerError, match=frag):
        SamplingParams(**kw).check(100)
    with pytest.raises(GlimmerError, match="top-k"):
        SamplingParams(top_k=101).check(100)
