"""Speculative verification and plain sampling behind one entry point (rules in
reference/speculative.py). NumPy arrays run the reference; there is no CUDA kernel yet, so CuPy
arrays raise UnsupportedError.

    n_accepted, tokens, flags = sample_token(logits, params, positions)              # plain step
    n_accepted, tokens, flags = sample_token(logits, params, positions, drafts, q)   # verify

Row r's new tokens are tokens[r, :n_accepted[r] + 1]: the accepted drafts, then the correction or
the bonus. The runtime calls this for every row of every step; plain sampling gives exactly
sample_rows' tokens (tokens[:, 0]).
"""

from __future__ import annotations

import numpy as np

from ..reference import speculative as ref
from ._check import F32, check, check_out, fail
from ._dispatch import host_result, is_host, no_kernel
from .sampling import check_params, host_positions

__all__ = ["sample_token"]

OP = "sample_token"
INTS = (np.dtype(np.int32), np.dtype(np.int64))


def sample_token(logits, params, positions, drafts=None, draft_probs=None, *, n_drafts=None, out=None):
    """logits (rows, vocab) with drafts None, or (rows, n+1, vocab) float32 with drafts (rows, n)
    int32|int64; draft_probs None (point-mass drafts) or (rows, n, vocab) float32, finite, >= 0;
    params one SamplingParams per row; positions (rows,) ints, the position of each row's first
    new token; n_drafts (rows,) ints in [0, n] or None (all n); out an optional (n_accepted,
    tokens, flags) triple of int32 (rows,), (rows, n+1), (rows,).
    -> (n_accepted, tokens, flags), tokens padded with -1 after each row's n_accepted + 1."""
    for a in (logits, drafts, draft_probs):
        if a is not None and not is_host(a) and type(a).__module__.split(".")[0] == "cupy":
            raise no_kernel(OP, a)
    if drafts is None:
        check(logits, OP, "logits", dtypes=(F32,), shape=("rows", "vocab"))
        if draft_probs is not None or n_drafts is not None:
            raise fail(OP, "draft_probs and n_drafts", "None without drafts", "an argument")
        rows, vocab = logits.shape
        n = 0
    else:
        check(logits, OP, "logits", dtypes=(F32,), shape=("rows", "n+1", "vocab"))
        rows, n1, vocab = logits.shape
        n = n1 - 1
        check(drafts, OP, "drafts", dtypes=INTS, shape=(rows, n))
        if drafts.size and (drafts.min() < 0 or drafts.max() >= vocab):
            bad = int(drafts.min() if drafts.min() < 0 else drafts.max())
            raise fail(OP, "drafts", f"token ids in [0, {vocab})", bad)
        if draft_probs is not None:
            check(draft_probs, OP, "draft_probs", dtypes=(F32,), shape=(rows, n, vocab))
            if not np.all(np.isfinite(draft_probs) & (draft_probs >= 0)):
                raise fail(OP, "draft_probs", "finite and >= 0", "a negative or non-finite entry")
        if n_drafts is not None:
            k = np.asarray(n_drafts)
            if k.shape != (rows,) or k.dtype.kind not in "iu":
                raise fail(OP, "n_drafts", f"{rows} integers", f"{k.dtype.name} {k.shape}")
            if rows and (k.min() < 0 or k.max() > n):
                raise fail(OP, "n_drafts", f"in [0, {n}]", int(k.min() if k.min() < 0 else k.max()))
    if vocab == 0:
        raise fail(OP, "logits", "at least one column", f"{logits.shape}")
    check_params(params, rows, vocab, OP)
    pos = host_positions(positions, rows, OP)
    if rows and int(pos.max()) + n >= 2 ** 31:
        raise fail(OP, "positions", f"below 2^31 - {n} (the last drafted position must fit)", int(pos.max()))
    result = ref.sample_token(logits, list(params), pos, drafts, draft_probs, n_drafts)
    if out is None:
        return result
    for o, r in zip(out, result):
        check_out(o, OP, r.shape, np.int32)
    return tuple(host_result(r, o) for r, o in zip(result, out))
