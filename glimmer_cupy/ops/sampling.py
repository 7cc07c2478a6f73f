"""Token selection per row with per-row parameters (rules in reference/sampling.py)."""

from ..reference import sampling as ref
from ..reference.sampling import GREEDY, SamplingParams
from ._dispatch import is_host, no_kernel

__all__ = ["argmax", "sample_rows", "SamplingParams", "GREEDY"]


def argmax(logits):
    """(rows, vocab) -> (rows,) int32, ties to the lowest id."""
    if is_host(logits):
        return ref.argmax(logits)
    raise no_kernel("argmax", logits)


def sample_rows(logits, params, positions):
    """(rows, vocab) logits -> (tokens, flags), one SamplingParams and position per row."""
    if is_host(logits):
        return ref.sample_rows(logits, params, positions)
    raise no_kernel("sample_rows", logits)
