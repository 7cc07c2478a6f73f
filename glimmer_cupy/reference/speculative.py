"""Speculative verification: accept a drafted block, correct the first rejection, or add the bonus.

One verification of one row
---------------------------
Inputs:
  logits    (n+1, vocab)  the target's logits. Row i < n predicts the token at position + i,
                          the one drafted as drafts[i]; row n, the bonus row, predicts the token
                          after the last draft.
  drafts    (n,)          drafted token ids, n >= 0 (n = 0 is a plain sampling step).
  q         (n, vocab) or None
                          the drafter's distribution that drafts[i] was drawn from (given the
                          context and drafts[:i]); rows sum to 1 and are used as given. None is a
                          point mass on drafts[i] (a greedy drafter): exactly a one-hot row of q.
  params                  the row's SamplingParams. p_i = filtered_probs(logits[i], params): the
                          target's distribution after temperature, top-k, top-p and min-p.
  position                the position of drafts[0]: the number a plain step sampling that token
                          would pass to sample_rows (the sequence's length before it).
Outputs: a in 0..n, the number of accepted drafts; tokens (a+1,) = drafts[:a] followed by one more
token, the correction at position + a when a < n or the bonus at position + n when a = n, so the
caller always gets a+1 new tokens; and flags (bits below).

Rows are examined in order i = 0, 1, ...; row i only if drafts[:i] were all accepted.

Greedy rows (temperature 0): accept drafts[i] iff it equals argmax(logits[i]) (ties to the lowest
id); the extra token is argmax(logits[a]). q is not read and no uniform is drawn.

Stochastic rows (temperature > 0), with d = drafts[i] and u_i = uniform(seed, position + i, ACCEPT):
  accept d       iff u_i < p_i(d) / q_i(d), in float64 (q_i(d) = 1 for a point mass);
  rejection at a: the extra token is categorical(r, uniform(seed, position + a, RESIDUAL)) with
                 r = max(0, p_a - q_a) (categorical normalises). For a point mass that is p_a with
                 p_a(d) set to 0, since p_a(d) - 1 <= 0: the excluded-token correction;
  all accepted:  the bonus is categorical(p_n, uniform(seed, position + n, SAMPLE)), the very draw
                 that sample_rows makes for a plain step at position + n.
Why the emitted token at position + i has law p_i: it is d by acceptance with probability
q(d) min(1, p(d)/q(d)) = min(p(d), q(d)); a rejection happens with probability
sum_d' max(0, q - p) = sum_d' max(0, p - q) = |r| (both sum to 1) and then gives d with probability
r(d)/|r|; min(p, q) + max(0, p - q) = p. The three purposes keep the accept test, the residual
draw and the bonus draw independent of each other; the drafter's own randomness must be
independent of them too (it must not draw with ACCEPT or RESIDUAL keys).

Edge cases:
  - q_i(d) = 0 for a drafted d: rejected, flag bit 2. d cannot have been drawn from q, so the ratio
    p/q (infinite or 0/0) means nothing; a draft really drawn from q hits this with probability 0,
    so the law is unchanged, and the residual still lies inside p's support.
  - p_i(d) = 0 (the target's filters drop d): u_i < 0 is false, always rejected.
  - r = max(0, p - q) is zero everywhere: then p <= q elementwise, and as both sum to 1, p == q, so a
    rejection has probability sum max(0, q - p) = 0 in exact arithmetic. In floating point it can
    happen when q equals p up to rounding; the correction is then drawn from p itself (any choice
    has zero weight; p is the position's law and keeps the token in p's support).
  - an examined row with a NaN or +inf logit, or with no finite logit: the verification stops
    there (a = i), the extra token is its argmax with NaN read as -inf, flag bit 1, exactly as
    sample_rows treats such a row. Rows after it are not read.
Zero-probability target tokens are never emitted: accepted drafts have p(d) > u*q(d) >= 0, and the
residual, p, and categorical's rounding fallback all stay inside p's support.

`sample_token` batches this over rows with per-row parameters; with no drafts it is sample_rows.
"""

import numpy as np

from .philox import Purpose, uniform
from .sampling import SamplingParams, argmax, categorical, filtered_probs, sample_rows

NON_FINITE = 1          # flag bit: an examined target row had a NaN/+inf logit or no finite logit
ZERO_Q_DRAFT = 2        # flag bit: a drafted token had q(d) = 0 under its own drafter distribution
PAD = -1                # tokens past a row's a+1 new ones


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """max(0, p - q), unnormalised; p itself when that is zero everywhere (only when p == q)."""
    r = np.maximum(p - q, 0.0)
    return r if r.sum() > 0.0 else p


def residual_correction(p: np.ndarray, q: np.ndarray, u: float) -> int:
    """The replacement for a rejected draft: a draw from normalise(max(0, p - q))."""
    return categorical(residual(p, np.asarray(q, np.float64)), u)


def excluded_correction(p: np.ndarray, d: int, u: float) -> int:
    """The replacement for a rejected point-mass draft d: a draw from p without d, renormalised."""
    r = p.copy()
    r[d] = 0.0
    return categorical(r if r.sum() > 0.0 else p, u)


def _bad(row: np.ndarray) -> bool:
    return bool(np.any(np.isnan(row) | (row == np.inf)) or not np.any(np.isfinite(row)))


def _verify(logits, drafts, q, params: SamplingParams, u_accept, u_residual, u_bonus):
    """One row, given its uniforms (u_accept, u_residual: (n,), u_bonus: scalar) -> (a, tokens, flags)."""
    n = len(drafts)
    flags = 0
    for i in range(n + 1):
        row = logits[i]
        if _bad(row):
            return i, [*map(int, drafts[:i]), int(argmax(row[None])[0])], flags | NON_FINITE
        if params.temperature == 0.0:
            top = int(argmax(row[None])[0])
            if i < n and int(drafts[i]) == top:
                continue
            return i, [*map(int, drafts[:i]), top], flags
        p = filtered_probs(row, params)
        if i == n:                                              # every draft accepted: the bonus
            return n, [*map(int, drafts), categorical(p, float(u_bonus))], flags
        d = int(drafts[i])
        qd = 1.0 if q is None else float(q[i, d])
        if qd > 0.0 and float(u_accept[i]) < p[d] / qd:
            continue
        if qd == 0.0:
            flags |= ZERO_Q_DRAFT
        u = float(u_residual[i])
        tok = excluded_correction(p, d, u) if q is None else residual_correction(p, q[i], u)
        return i, [*map(int, drafts[:i]), tok], flags
    raise AssertionError("unreachable")


def accept_drafts(logits: np.ndarray, drafts, q, params: SamplingParams, position: int):
    """One row's verification (module docstring) -> (a, tokens list of a+1 ids, flags)."""
    n = len(drafts)
    pos = position + np.arange(n)
    return _verify(logits, drafts, q, params, uniform(params.seed, pos, Purpose.ACCEPT),
                   uniform(params.seed, pos, Purpose.RESIDUAL),
                   uniform(params.seed, position + n, Purpose.SAMPLE))


def sample_token(logits: np.ndarray, params: list[SamplingParams], positions, drafts=None,
                 draft_probs=None, n_drafts=None):
    """Every row's new tokens, for plain sampling and for verification alike.

    logits       (rows, vocab) and drafts None: plain sampling, exactly sample_rows;
                 (rows, n+1, vocab) with drafts (rows, n): verification of each row's block
    params       one SamplingParams per row
    positions    (rows,) ints: the position of each row's first new token (its drafts[r, 0])
    draft_probs  (rows, n, vocab), the drafter's q, or None: point masses on the drafts
    n_drafts     (rows,) ints in 0..n, or None for all n: row r verifies drafts[r, :n_drafts[r]]
                 against logits[r, :n_drafts[r] + 1] and reads nothing past them
    -> (n_accepted (rows,) int32, tokens (rows, n+1) int32, flags (rows,) int32); row r's new
       tokens are tokens[r, :n_accepted[r] + 1], the rest is PAD (-1). Plain sampling has n = 0.
    """
    rows = len(params)
    if drafts is None:
        tokens, flags = sample_rows(logits, params, positions)
        return np.zeros(rows, np.int32), tokens[:, None].astype(np.int32), flags
    n = drafts.shape[1]
    k = np.full(rows, n) if n_drafts is None else np.asarray(n_drafts)
    pos = np.asarray(positions, np.int64)
    # every uniform a row might need, drawn at once (they are pure functions of their keys, so
    # drawing unused ones changes nothing): accept and residual at position + i, bonus at + k
    seeds = np.array([p.seed for p in params], np.uint64)[:, None]
    at = pos[:, None] + np.arange(n)
    u_acc, u_res = uniform(seeds, at, Purpose.ACCEPT), uniform(seeds, at, Purpose.RESIDUAL)
    u_bonus = uniform(seeds[:, 0], pos + k, Purpose.SAMPLE)
    n_accepted = np.zeros(rows, np.int32)
    tokens = np.full((rows, n + 1), PAD, np.int32)
    flags = np.zeros(rows, np.int32)
    for r in range(rows):
        kr = int(k[r])
        q = None if draft_probs is None else draft_probs[r, :kr]
        a, toks, flags[r] = _verify(logits[r, :kr + 1], drafts[r, :kr], q, params[r],
                                    u_acc[r, :kr], u_res[r, :kr], u_bonus[r])
        n_accepted[r] = a
        tokens[r, :a + 1] = toks
    return n_accepted, tokens, flags
