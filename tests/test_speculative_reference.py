"""Speculative verification on the NumPy path: re-derived acceptance, greedy cases, and the law of
the emitted tokens (chi-square; each test's critical value is the upper 1e-4 point, so a correct
implementation fails a given statistic with probability 1e-4 for a fresh seed, about 1e-3 over
the 11 statistics below; the seeds are fixed, so the outcome is deterministic)."""

import numpy as np
import pytest

from glimmer_cupy.ops._check import OpArgumentError
from glimmer_cupy.ops.speculative import sample_token as op_sample_token
from glimmer_cupy.reference.philox import Purpose, uniform
from glimmer_cupy.reference.sampling import GREEDY, SamplingParams, categorical, filtered_probs, sample_rows
from glimmer_cupy.reference.speculative import (
    NON_FINITE,
    PAD,
    ZERO_Q_DRAFT,
    accept_drafts,
    excluded_correction,
    residual_correction,
    sample_token,
)

FILTERED = SamplingParams(temperature=0.9, top_k=6, top_p=0.95, min_p=0.05)
PLAIN = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)


def chi2_critical(df: int) -> float:
    """Upper 1e-4 point of chi-square(df) by Wilson-Hilferty: a false failure in 10^4 runs."""
    z = 3.719
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def assert_distribution(p: np.ndarray, tokens: np.ndarray):
    """tokens (flat ids, or tuples as rows of a 2-column array) against the exact law p."""
    counts = np.bincount(tokens, minlength=p.size).astype(np.float64)
    assert np.all(counts[p == 0] == 0), "a zero-probability token was emitted"
    nz = p > 0
    exp = p[nz] * counts.sum()
    stat = float(np.sum((counts[nz] - exp) ** 2 / exp))
    assert stat < chi2_critical(int(nz.sum()) - 1), stat


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def draw(rng, q: np.ndarray) -> np.ndarray:
    """One id per row of q (..., vocab), by the drafter's own (NumPy) randomness."""
    c = np.cumsum(q, axis=-1)
    u = rng.random(q.shape[:-1])[..., None] * c[..., -1:]
    return np.minimum((c <= u).sum(axis=-1), q.shape[-1] - 1)


# --- plain steps and greedy rows ---------------------------------------------------------------

def test_plain_sampling_is_sample_rows():
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 3, (40, 70)).astype(np.float32)
    logits[5, 3] = np.nan
    params = [GREEDY if r % 5 == 0 else SamplingParams(temperature=0.8, top_k=int(rng.integers(0, 30)),
              top_p=0.9, min_p=0.01, seed=int(rng.integers(0, 2 ** 63))) for r in range(40)]
    positions = rng.integers(0, 10 ** 6, 40)
    want, want_flags = sample_rows(logits, params, positions)
    a, tokens, flags = op_sample_token(logits, params, positions)
    assert tokens.shape == (40, 1) and not a.any()
    assert np.array_equal(tokens[:, 0], want) and np.array_equal(flags, want_flags) and flags[5] == 1
    # a block with zero drafts is a plain step too
    a, tokens, flags = op_sample_token(logits[:, None], params, positions, np.zeros((40, 0), np.int32))
    assert np.array_equal(tokens[:, 0], want) and np.array_equal(flags, want_flags)
    for r in (0, 1, 5):
        assert accept_drafts(logits[r:r + 1], [], None, params[r], int(positions[r])) == (0, [want[r]], want_flags[r])


def test_greedy_acceptance():
    top = np.array([2, 0, 3, 1])                           # the target's argmax at each position
    logits = np.zeros((4, 5), np.float32)
    logits[np.arange(4), top] = 5.0
    q = np.full((3, 5), 0.2, np.float32)                    # greedy rows never read q
    for drafts, a, toks in [([2, 0, 3], 3, [2, 0, 3, 1]), ([2, 4, 3], 1, [2, 0]),
                            ([1, 0, 3], 0, [2]), ([2, 0, 4], 2, [2, 0, 3])]:
        for qq in (None, q):
            assert accept_drafts(logits, np.array(drafts), qq, GREEDY, 100) == (a, toks, 0)
    ties = np.array([[1.0, 4.0, 4.0], [0.0, 0.0, 0.0]], np.float32)   # ties go to the lowest id
    assert accept_drafts(ties, np.array([2]), None, GREEDY, 0) == (0, [1], 0)
    assert accept_drafts(ties, np.array([1]), None, GREEDY, 0) == (1, [1, 0], 0)


# --- re-derivation from the same uniforms -------------------------------------------------------

def test_accepted_counts_rederived():
    rng = np.random.default_rng(2)
    rows, n, vocab = 300, 5, 30
    logits = rng.normal(0, 2, (rows, n + 1, vocab)).astype(np.float32)
    params = [SamplingParams(temperature=float(rng.uniform(0.5, 1.5)), top_k=int(rng.integers(0, 20)),
                             top_p=float(rng.uniform(0.7, 1.0)), seed=int(rng.integers(0, 2 ** 63)))
              for _ in range(rows)]
    params[::7] = [GREEDY] * len(params[::7])
    positions = rng.integers(0, 10 ** 6, rows)
    # drafter: the target's own law blurred by noise, so that acceptance runs vary in length
    p = np.array([[filtered_probs(logits[r, i], params[r]) if params[r].temperature else softmax(logits[r, i])
                   for i in range(n + 1)] for r in range(rows)])
    q = (0.7 * p[:, :n] + 0.3 * softmax(rng.normal(0, 2, (rows, n, vocab)))).astype(np.float32)
    drafts = draw(rng, q).astype(np.int32)
    drafts[::7] = np.argmax(logits[::7, :n], axis=-1)[:, :n]      # greedy rows: mostly right drafts
    drafts[::21, 2] = (drafts[::21, 2] + 1) % vocab
    for point in (False, True):
        a, tokens, flags = sample_token(logits, params, positions, drafts, None if point else q)
        assert not flags.any()
        for r in range(rows):
            s, pos, d = params[r], int(positions[r]), drafts[r]
            qd = np.ones(n) if point else q[r, np.arange(n), d].astype(np.float64)
            if s.temperature == 0:
                ok = d == np.argmax(logits[r, :n], axis=-1)
            else:
                u = np.array([uniform(s.seed, pos + i, Purpose.ACCEPT) for i in range(n)], np.float64)
                ok = u < p[r, np.arange(n), d] / qd
            want = n if ok.all() else int(np.argmin(ok))
            assert a[r] == want, r
            assert tokens[r, :want].tolist() == d[:want].tolist() and np.all(tokens[r, want + 1:] == PAD)
            if s.temperature == 0:
                extra = int(np.argmax(logits[r, want]))
            elif want == n:
                extra = categorical(p[r, n], float(uniform(s.seed, pos + n, Purpose.SAMPLE)))
            else:
                rest = p[r, want].copy()
                if point:
                    rest[d[want]] = 0.0
                else:
                    rest = np.maximum(rest - q[r, want], 0.0)
                extra = categorical(rest, float(uniform(s.seed, pos + want, Purpose.RESIDUAL)))
            assert tokens[r, want] == extra, r
        assert len(set(a.tolist())) == n + 1                  # every count 0..n occurred


def test_bonus_uses_the_plain_sampling_key():
    rng = np.random.default_rng(3)
    n, vocab = 4, 50
    for t in range(20):
        logits = rng.normal(0, 2, (n + 1, vocab)).astype(np.float32)
        s = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=int(rng.integers(0, 2 ** 63)))
        q = np.array([filtered_probs(logits[i], s) for i in range(n)])  # q == p: ratio 1, always accepted
        drafts = draw(rng, q)
        pos = int(rng.integers(0, 10 ** 6))
        a, toks, flags = accept_drafts(logits, drafts, q, s, pos)
        plain, _ = sample_rows(logits[n:], [s], [pos + n])
        assert a == n and toks[:n] == drafts.tolist() and toks[n] == plain[0] and flags == 0


# --- the law of the emitted tokens --------------------------------------------------------------

@pytest.mark.parametrize("params,point", [(PLAIN, False), (FILTERED, False), (FILTERED, True)])
def test_first_token_has_the_target_law(params, point):
    rng = np.random.default_rng(4)
    rows, n, vocab = 12_000, 3, 8
    target = rng.normal(0, 1.2, (n + 1, vocab)).astype(np.float32)
    p0 = filtered_probs(target[0], params)
    drafter = target[:n] + rng.normal(0, 1.0, (n, vocab))
    if point:                                   # a greedy drafter: a point mass on its argmax
        drafts, q = np.tile(np.argmax(drafter, axis=-1), (rows, 1)), None
        assert p0[drafts[0, 0]] > 0
    else:                                       # full q, with mass on tokens p excludes
        q = np.broadcast_to(softmax(drafter).astype(np.float32), (rows, n, vocab))
        drafts = draw(rng, q)
    params = [SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                             min_p=params.min_p, seed=int(s)) for s in rng.integers(0, 2 ** 63, rows)]
    positions = rng.integers(0, 10 ** 6, rows)
    a, tokens, flags = sample_token(np.broadcast_to(target, (rows, n + 1, vocab)), params, positions, drafts, q)
    assert not flags.any() and 0.1 < (a > 0).mean() < 0.9       # both paths are exercised
    assert_distribution(p0, tokens[:, 0])


def decode(target, q, draft_pos, rows, n, k, rng):
    """Emit k tokens per sequence by rounds of draft-then-verify: the target's logits at the i-th
    emitted position are target[i], whatever came before, so the exact law of the emitted
    sequence is p_0 x p_1 x ... x p_{k-1}. q (positions, vocab) or None with point drafts draft_pos."""
    seeds = rng.integers(0, 2 ** 63, rows)
    base = rng.integers(0, 10 ** 6, rows)
    out = np.full((rows, k + n), -1)
    done = np.zeros(rows, int)
    while (todo := np.nonzero(done < k)[0]).size:
        at = done[todo][:, None] + np.arange(n + 1)             # offsets of the block and bonus
        drafts = draft_pos[at[:, :n]] if q is None else draw(rng, q[at[:, :n]])
        params = [SamplingParams(temperature=FILTERED.temperature, top_k=FILTERED.top_k, top_p=FILTERED.top_p,
                                 min_p=FILTERED.min_p, seed=int(seeds[r])) for r in todo]
        a, tokens, flags = sample_token(target[at], params, base[todo] + done[todo], drafts,
                                        None if q is None else q[at[:, :n]])
        assert not flags.any()
        for j, r in enumerate(todo):
            out[r, done[r]:done[r] + a[j] + 1] = tokens[j, :a[j] + 1]
            done[r] += a[j] + 1
    return out[:, :k]


@pytest.mark.parametrize("point", [False, True])
def test_decoded_sequence_has_the_target_law(point):
    rng = np.random.default_rng(5)
    rows, n, k, vocab = 9_000, 3, 3, 6
    target = rng.normal(0, 1.0, (k + n + 1, vocab)).astype(np.float32)
    drafter = target + rng.normal(0, 1.0, target.shape)
    q = softmax(drafter).astype(np.float32)
    draft_pos = np.argmax(drafter, axis=-1)
    draft_pos[1] = np.argmin(filtered_probs(target[1], FILTERED))     # a draft the target's filters drop
    p = np.array([filtered_probs(target[i], FILTERED) for i in range(k)])
    out = decode(target, None if point else q, draft_pos, rows, n, k, rng)
    for i in range(k):
        assert_distribution(p[i], out[:, i])
    assert_distribution(np.outer(p[0], p[1]).ravel(), out[:, 0] * vocab + out[:, 1])   # independence


def test_zero_probability_tokens_never_emitted():
    rng = np.random.default_rng(6)
    rows, n, vocab = 2000, 4, 12
    target = rng.normal(0, 2, (rows, n + 1, vocab)).astype(np.float32)
    s = SamplingParams(temperature=1.0, top_k=3, top_p=1.0)
    p = np.array([[filtered_probs(target[r, i], s) for i in range(n + 1)] for r in range(rows)])
    q = np.where(p[:, :n] > 0, 0.01, 1.0)                  # the drafter prefers what the target drops
    q = (q / q.sum(-1, keepdims=True)).astype(np.float32)
    drafts = draw(rng, q)
    params = [SamplingParams(temperature=1.0, top_k=3, top_p=1.0, seed=r) for r in range(rows)]
    a, tokens, _ = sample_token(target, params, rng.integers(0, 10 ** 6, rows), drafts, q)
    for r in range(rows):
        for i in range(a[r] + 1):
            assert p[r, i, tokens[r, i]] > 0


# --- batches and edge cases ---------------------------------------------------------------------

def test_rows_are_independent_of_batch():
    rng = np.random.default_rng(7)
    rows, n, vocab = 48, 4, 40
    logits = rng.normal(0, 2, (rows, n + 1, vocab)).astype(np.float32)
    q = softmax(logits[:, :n] + rng.normal(0, 1, (rows, n, vocab))).astype(np.float32)
    drafts = draw(rng, q).astype(np.int32)
    params = [GREEDY if r % 6 == 0 else SamplingParams(temperature=0.9, top_k=int(rng.integers(0, 30)), top_p=0.9,
              seed=int(rng.integers(0, 2 ** 63))) for r in range(rows)]
    positions = rng.integers(0, 10 ** 6, rows)
    k = rng.integers(0, n + 1, rows)
    a, tokens, flags = sample_token(logits, params, positions, drafts, q, n_drafts=k)
    assert np.all(a <= k) and not flags.any()
    perm = rng.permutation(rows)
    a2, t2, _ = sample_token(logits[perm], [params[i] for i in perm], positions[perm], drafts[perm], q[perm],
                             n_drafts=k[perm])
    assert np.array_equal(a2, a[perm]) and np.array_equal(t2, tokens[perm])
    for r in (0, 5, 47):                                    # alone, with exactly its own block size
        kr = int(k[r])
        alone = accept_drafts(logits[r, :kr + 1], drafts[r, :kr], q[r, :kr], params[r], int(positions[r]))
        assert alone[:2] == (a[r], tokens[r, :a[r] + 1].tolist())
        # padded past its block with garbage that must not be read
        big = np.concatenate([logits[r:r + 1, :kr + 1], np.full((1, n, vocab), np.nan, np.float32)], 1)
        dd = np.concatenate([drafts[r:r + 1, :kr], np.zeros((1, n), np.int32)], 1)
        qq = np.concatenate([q[r:r + 1, :kr], np.zeros((1, n, vocab), np.float32)], 1)
        a3, t3, f3 = sample_token(big, [params[r]], positions[r:r + 1], dd, qq, n_drafts=[kr])
        assert a3[0] == a[r] and t3[0, :a[r] + 1].tolist() == tokens[r, :a[r] + 1].tolist() and f3[0] == 0


def test_edge_cases():
    rng = np.random.default_rng(8)
    vocab = 10
    logits = rng.normal(0, 1, (3, vocab)).astype(np.float32)
    s = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=9)
    p = filtered_probs(logits[0], s)
    # q(d) = 0 for the drafted token: rejected and flagged; the residual is still max(0, p - q)
    q = np.tile(softmax(rng.normal(0, 1, vocab)), (2, 1))
    q[0, 4] = 0.0
    a, toks, flags = accept_drafts(logits, np.array([4, 1]), q, s, 50)
    assert a == 0 and flags == ZERO_Q_DRAFT
    assert toks == [residual_correction(p, q[0], float(uniform(9, 50, Purpose.RESIDUAL)))]
    # p - q <= 0 everywhere (p == q): the correction falls back to p
    for u in (0.0, 0.37, 0.999):
        assert residual_correction(p, p, u) == categorical(p, u)
    # a point mass is a one-hot q, and its residual is the excluded-token correction
    onehot = np.eye(vocab)[[3, 7]].astype(np.float32)
    for u in (0.0, 0.37, 0.999):
        assert excluded_correction(p, 3, u) == residual_correction(p, onehot[0], u)
    drafts = rng.integers(0, vocab, (200, 2))
    params = [SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=r) for r in range(200)]
    big = np.tile(logits, (200, 1, 1))
    onehots = np.eye(vocab, dtype=np.float32)[drafts]
    r1, r2 = sample_token(big, params, np.arange(200), drafts, None), sample_token(big, params, np.arange(200),
                                                                                   drafts, onehots)
    assert all(np.array_equal(x, y) for x, y in zip(r1, r2))
    # a non-finite row ends the block there, with sample_rows' flag and argmax
    bad = logits.copy()
    bad[1, 2] = np.nan
    q2 = np.tile(p, (2, 1))                                 # q == p: the first draft is accepted
    a, toks, flags = accept_drafts(bad, np.array([5, 1]), q2, s, 0)
    assert (a, flags) == (1, NON_FINITE) and toks == [5, int(np.argmax(np.nan_to_num(bad[1], nan=-np.inf)))]
    bad[0, 0] = np.inf
    assert accept_drafts(bad, np.array([5, 1]), q2, s, 0) == (0, [0], NON_FINITE)
    assert accept_drafts(bad, np.array([5, 1]), None, GREEDY, 0) == (0, [0], NON_FINITE)


def test_op_checks():
    logits = np.zeros((2, 3, 5), np.float32)
    params = [PLAIN, PLAIN]
    drafts = np.zeros((2, 2), np.int32)
    with pytest.raises(OpArgumentError, match="drafts"):
        op_sample_token(logits, params, [0, 0], np.full((2, 2), 5, np.int32))
    with pytest.raises(OpArgumentError, match="draft_probs"):
        op_sample_token(logits, params, [0, 0], drafts, -np.ones((2, 2, 5), np.float32))
    with pytest.raises(OpArgumentError, match="n_drafts"):
        op_sample_token(logits, params, [0, 0], drafts, n_drafts=[0, 3])
    with pytest.raises(OpArgumentError, match="params"):
        op_sample_token(logits, [PLAIN], [0, 0], drafts)
    with pytest.raises(OpArgumentError, match="positions"):
        op_sample_token(logits, params, [0, 2 ** 31 - 2], drafts)
    with pytest.raises(OpArgumentError, match="logits"):
        op_sample_token(logits.astype(np.float64), params, [0, 0], drafts)
    out = (np.empty(2, np.int32), np.empty((2, 3), np.int32), np.empty(2, np.int32))
    res = op_sample_token(logits, params, [0, 0], drafts, out=out)
    assert all(r is o for r, o in zip(res, out)) and np.all(out[0] >= 0)
    # NumPy logits run the reference, which cannot read device drafts: one line, before any work
    fake = type("ndarray", (), {"__module__": "cupy"})()
    with pytest.raises(OpArgumentError, match="drafts and draft_probs"):
        op_sample_token(logits, params, [0, 0], fake)


def test_verify_shape_rule():
    """One block an item once the items are at least half the SMs; fewer items spread over clusters
    whose chunk fits the shared-memory budget, raised while the grid is under VERIFY_MIN_BLOCKS."""
    from glimmer_cupy.ops.speculative import VERIFY_MIN_BLOCKS, chunk_ids, verify_shape
    budget = 227 * 1024 - 41648
    assert verify_shape(64, 15, 151936, budget, 132) == (1, 0)           # 1024 items; 600 KB does not fit
    assert verify_shape(66, 1, 40000, budget, 132) == (1, chunk_ids(40000, 1))
    assert verify_shape(8, 15, 151936, budget, 132) == (1, 0)            # 128 items
    assert verify_shape(4, 15, 151936, budget, 132) == (8, chunk_ids(151936, 8))    # 64: 4 x 64 < 264
    assert verify_shape(5, 15, 151936, budget, 132) == (1, 0)            # 80 items: at least 66
    assert verify_shape(1, 15, 151936, budget, 132) == (8, chunk_ids(151936, 8))
    c, cache = verify_shape(3, 4, 262144, budget, 132)
    assert c == 8 and cache == chunk_ids(262144, 8) and 15 * c < VERIFY_MIN_BLOCKS
    assert verify_shape(2, 0, 10 ** 7, budget, 132) == (8, 0)            # no C's chunk fits


def test_verify_threads_rule():
    """The 512-thread build where a block's chunk is at most 64K ids (few rows: C = 8 at vocab
    262144 and 151936; C = 1 at 49152), the 1024-thread build where a block reads more."""
    from glimmer_cupy.ops.speculative import verify_threads
    assert verify_threads(262144, 8) == 512 and verify_threads(151936, 8) == 512
    assert verify_threads(151936, 4) == 512 and verify_threads(262144, 4) == 512    # exactly 65536 ids a block
    assert verify_threads(262144, 2) == 1024 and verify_threads(151936, 2) == 1024
    assert verify_threads(49152, 1) == 512 and verify_threads(65536, 1) == 512
    assert verify_threads(65537, 1) == 1024 and verify_threads(151936, 1) == 1024
    # monotone: a smaller chunk (more blocks an item, or a smaller vocabulary) never takes the
    # larger block
    vocabs, cs = (7, 1000, 49152, 65540, 151936, 262144), (1, 2, 4, 8)
    for vocab in vocabs:
        got = [verify_threads(vocab, c) for c in cs]
        assert got == sorted(got, reverse=True) and set(got) <= {512, 1024}, (vocab, got)
    for c in cs:
        got = [verify_threads(v, c) for v in vocabs]
        assert got == sorted(got), (c, got)
