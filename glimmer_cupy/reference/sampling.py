"""Token selection per row of a (rows, vocab) logits array, with per-row parameters.

The filter chain, each step renormalising what survives (ties at a threshold are kept, so the
kept set is a function of the values alone, not of a sort order):
  1. temperature 0 -> argmax (ties to the lowest id); else z = logits / temperature;
  2. top_k > 0: keep z >= the k-th largest z;
  3. p = softmax(z over the kept ids);
  4. top_p < 1: keep p >= t, t the largest value with sum(p >= t) >= top_p (the nucleus);
  5. min_p > 0: keep p >= min_p * max(p);
  6. draw u = uniform(seed, position, SAMPLE) and return the first id, in id order, whose
     cumulative kept probability exceeds u * total.
A row with a NaN or +inf logit, or with no finite logit, is flagged (flag 1) and gets the
argmax with NaN read as -inf: always a valid id.
"""

from dataclasses import dataclass

import numpy as np

from ..errors import GlimmerError
from .philox import Purpose, uniform


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.0
    seed: int = 0

    def check(self, vocab: int | None = None) -> "SamplingParams":
        if not (self.temperature >= 0 and np.isfinite(self.temperature)):
            raise GlimmerError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise GlimmerError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or (vocab is not None and self.top_k > vocab):
            raise GlimmerError(f"top-k must be in [0, {vocab if vocab is not None else 'vocab'}], got {self.top_k}")
        if not 0 <= self.min_p < 1:
            raise GlimmerError(f"min-p must be in [0, 1), got {self.min_p}")
        if not 0 <= self.seed < 2 ** 64:
            raise GlimmerError(f"seed must be in [0, 2^64), got {self.seed}")
        return self


GREEDY = SamplingParams(temperature=0.0, top_k=0, top_p=1.0)


def argmax(logits: np.ndarray) -> np.ndarray:
    """(rows, vocab) -> (rows,) int32, ties to the lowest id, NaN read as -inf."""
    x = np.where(np.isnan(logits), -np.inf, logits)
    return np.argmax(x, axis=-1).astype(np.int32)


def probs(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / temperature) of one row, float64, max subtracted first."""
    z = logits.astype(np.float64) / temperature
    z = np.exp(z - z.max())
    return z / z.sum()


def filtered_probs(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """One row's probabilities after top-k, top-p and min-p, renormalised (float64)."""
    z = logits.astype(np.float64) / p.temperature
    keep = np.ones(z.shape, dtype=bool)
    if 0 < p.top_k < z.size:
        kth = np.partition(z, z.size - p.top_k)[z.size - p.top_k]
        keep = z >= kth
    q = np.where(keep, np.exp(z - z[keep].max()), 0.0)
    q /= q.sum()
    if p.top_p < 1.0:
        desc = np.sort(q[keep])[::-1]
        cut = int(np.searchsorted(np.cumsum(desc), p.top_p))      # first index reaching top_p
        keep &= q >= desc[min(cut, desc.size - 1)]
        q = np.where(keep, q, 0.0)
        q /= q.sum()
    if p.min_p > 0.0:
        keep &= q >= p.min_p * q.max()
        q = np.where(keep, q, 0.0)
        q /= q.sum()
    return q


def categorical(q: np.ndarray, u: float) -> int:
    """The first id whose cumulative probability exceeds u * total (ids in ascending order)."""
    c = np.cumsum(q)
    i = int(np.searchsorted(c, np.float64(u) * c[-1], side="right"))
    if i >= q.size or q[i] == 0.0:                                 # rounding at the top end
        i = int(np.nonzero(q)[0][-1])
    return i


def sample_rows(logits: np.ndarray, params: list[SamplingParams], positions) -> tuple[np.ndarray, np.ndarray]:
    """Next token per row: (rows, vocab) -> (tokens int32, flags int32)."""
    rows = logits.shape[0]
    tokens = argmax(logits)
    flags = np.zeros(rows, np.int32)
    for r in range(rows):
        row = logits[r]
        if np.any(np.isnan(row) | (row == np.inf)) or not np.any(np.isfinite(row)):
            flags[r] = 1
            continue
        p = params[r]
        if p.temperature == 0.0:
            continue
        q = filtered_probs(row, p)
        u = uniform(p.seed, positions[r], Purpose.SAMPLE)
        tokens[r] = categorical(q, float(u))
    return tokens, flags
