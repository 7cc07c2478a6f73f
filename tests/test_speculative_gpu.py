"""Speculative verification on the GPU (cuda_src/speculative.cu) against the NumPy reference.

The kernel's p is sample_rows' (float32 exp, integer weights); the reference's is float64, so a
decision may differ where it sits within ~1e-6 of its threshold (see test_sampling_gpu.py). Every
mismatch is re-derived: the test recomputes, from the reference's float64 numbers, the first
position where the two disagree and fails unless that decision was within TOL of its threshold
(u vs p(d)/q(d), or a cumulative boundary of the correction/bonus draw)."""

import numpy as np
import pytest

from glimmer_cupy import ops
from glimmer_cupy.ops.sampling import DeviceSamplingParams
from glimmer_cupy.reference import speculative as ref
from glimmer_cupy.reference.philox import Purpose, uniform
from glimmer_cupy.reference.sampling import GREEDY, SamplingParams, filtered_probs

gpu = pytest.mark.gpu
TOL = 1e-5


def random_params(rng, rows, vocab):
    out = []
    for _ in range(rows):
        t = float(rng.choice([0.0, 0.5, 0.8, 1.0, 1.5]))
        out.append(SamplingParams(temperature=t, top_k=int(min(vocab, rng.choice([0, 1, 20, 300])))
                                  , top_p=float(rng.choice([1.0, 0.9])), min_p=float(rng.choice([0.0, 0.05])),
                                  seed=int(rng.integers(0, 2 ** 64, dtype=np.uint64))))
    return out


def make_case(rng, rows, n, vocab, q_full, accept_bias=True):
    """Logits, params, positions, drafts (some engineered to be accepted), q or None, n_drafts."""
    x = (rng.normal(0, 3, (rows, n + 1, vocab)) * rng.choice([0.3, 1, 3], (rows, 1, 1))).astype(np.float32)
    params = random_params(rng, rows, vocab)
    pos = rng.integers(0, 2 ** 30, rows)
    drafts = rng.integers(0, vocab, (rows, n)).astype(np.int32)
    q = None
    if q_full:
        q = rng.dirichlet(np.ones(vocab) * 0.3, (rows, n)).astype(np.float32) if vocab > 1 else np.ones((rows, n, 1), np.float32)
    for r in range(rows):
        for i in range(n):
            mode = rng.integers(0, 3) if accept_bias else 0
            if mode == 1:                                   # the argmax: greedy rows accept
                drafts[r, i] = int(np.argmax(x[r, i]))
            elif mode == 2 and params[r].temperature > 0:   # q = p: stochastic rows accept
                p = filtered_probs(x[r, i], params[r])
                drafts[r, i] = int(rng.choice(vocab, p=p))
                if q is not None:
                    q[r, i] = p.astype(np.float32)
    n_drafts = rng.integers(0, n + 1, rows) if rng.random() < 0.5 else None
    return x, params, pos, drafts, q, n_drafts


def run_gpu(x, params, pos, drafts, q, n_drafts, **kw):
    import cupy
    rows, n = drafts.shape
    out = (cupy.full(rows, -7, np.int32), cupy.full((rows, n + 1), -7, np.int32), cupy.full(rows, -7, np.int32))
    ops.sample_token(cupy.asarray(x), params, list(pos), cupy.asarray(drafts), None if q is None else cupy.asarray(q),
                     n_drafts=n_drafts, out=out, **kw)
    return tuple(cupy.asnumpy(o) for o in out)


def fragile(x, params, pos, drafts, q, n_drafts, r) -> bool:
    """True when a decision of row r (reference numbers) lies within TOL of its threshold."""
    p_ = params[r]
    if p_.temperature == 0.0:
        return False
    n = drafts.shape[1]
    k = n if n_drafts is None else int(n_drafts[r])
    for i in range(k + 1):
        row = x[r, i]
        if ref._bad(row):
            return False
        p = filtered_probs(row, p_)
        c = np.cumsum(p)
        u_s = float(uniform(p_.seed, pos[r] + i, Purpose.SAMPLE))
        u_r = float(uniform(p_.seed, pos[r] + i, Purpose.RESIDUAL))
        if np.min(np.abs(c - u_s * c[-1])) < TOL or np.min(np.abs(c - u_r)) < 1e-3:
            return True
        if i == k:
            return False
        d = int(drafts[r, i])
        qd = 1.0 if q is None else float(q[r, i, d])
        u = float(uniform(p_.seed, pos[r] + i, Purpose.ACCEPT))
        if qd > 0 and abs(u * qd - p[d]) < TOL * max(p[d], 1e-30) + 1e-9:
            return True
        if not (qd > 0 and u < p[d] / qd):
            return True if q is not None else False       # the residual's boundaries: checked loosely above
    return False


def compare(x, params, pos, drafts, q, n_drafts):
    got = run_gpu(x, params, pos, drafts, q, n_drafts)
    want = ref.sample_token(x, params, pos, drafts, q, n_drafts)
    bad = 0
    for r in range(len(params)):
        same = all(np.array_equal(g[r], w[r]) for g, w in zip(got, want))
        if not same:
            assert fragile(x, params, pos, drafts, q, n_drafts, r), (
                f"row {r}: GPU {[g[r] for g in got]}, reference {[w[r] for w in want]}, {params[r]}")
            bad += 1
    return got, bad


@gpu
@pytest.mark.parametrize("vocab", [1, 7, 1000, 151936])
@pytest.mark.parametrize("n", [0, 1, 5, 16])
@pytest.mark.parametrize("q_full", [False, True])
def test_matches_reference(vocab, n, q_full):
    rng = np.random.default_rng(vocab * 100 + n * 2 + q_full)
    rows = 12 if vocab > 10000 else 40
    case = make_case(rng, rows, n, vocab, q_full)
    _, bad = compare(*case)
    print(f"vocab {vocab} n {n} q {q_full}: {bad} fragile rows differ")


@gpu
def test_int64_drafts_and_long_prefixes():
    rng = np.random.default_rng(5)
    x, params, pos, drafts, q, _ = make_case(rng, 16, 16, 1000, True)
    for r in range(16):                                    # every draft accepted: the bonus path
        params[r] = GREEDY if r % 2 else params[r]
        for i in range(16):
            if params[r].temperature == 0:
                drafts[r, i] = int(np.argmax(x[r, i]))
    got, _ = compare(x, params, pos, drafts.astype(np.int64), q, None)
    assert (got[0][1::2] == 16).all()


@gpu
def test_non_finite_and_zero_q():
    rng = np.random.default_rng(7)
    vocab, n = 500, 5
    x, params, pos, drafts, q, _ = make_case(rng, 8, n, vocab, True)
    params = [SamplingParams(0.9, 0, 1.0, 0.0, seed=s) for s in range(8)]
    x[0, 0, 3] = np.nan
    x[1, 2, :] = -np.inf
    x[2, 0, 9] = np.inf
    for r in (3, 4):
        q[r, 0, drafts[r, 0]] = 0.0                        # q(d) = 0: rejected, flag 2
    got, _ = compare(x, params, pos, drafts, q, None)
    assert got[2][0] & 1 and got[2][3] & 2 and got[2][4] & 2


@gpu
def test_plain_sampling_is_sample_rows():
    import cupy
    rng = np.random.default_rng(9)
    x = rng.normal(0, 3, (20, 5000)).astype(np.float32)
    params = random_params(rng, 20, 5000)
    pos = list(range(20))
    a, t, f = ops.sample_token(cupy.asarray(x), params, pos)
    want, _ = ops.sample_rows(cupy.asarray(x), params, pos)
    np.testing.assert_array_equal(cupy.asnumpy(t)[:, 0], cupy.asnumpy(want))
    assert not cupy.asnumpy(a).any()


@gpu
def test_batch_composition_independence():
    rng = np.random.default_rng(11)
    x, params, pos, drafts, q, k = make_case(rng, 64, 15, 4097, True)
    k = rng.integers(0, 16, 64)
    batch = run_gpu(x, params, pos, drafts, q, k)
    perm = rng.permutation(64)
    sh = run_gpu(x[perm], [params[i] for i in perm], pos[perm], drafts[perm], q[perm], k[perm])
    for g, s in zip(batch, sh):
        np.testing.assert_array_equal(s, g[perm])
    for r in (0, 31, 63):
        alone = run_gpu(x[r:r + 1], [params[r]], pos[r:r + 1], drafts[r:r + 1], q[r:r + 1], k[r:r + 1])
        for g, a in zip(batch, alone):
            np.testing.assert_array_equal(a[0], g[r])


@gpu
@pytest.mark.parametrize("pdl", [False, True])
def test_graph_replay_equals_eager(pdl):
    """A captured verification replays with new parameters, positions and draft counts; with PDL
    (as the runtime's static steps launch it) two calls back to back, the second reusing the
    first's device state, give the eager tokens too."""
    import cupy
    from glimmer_cupy.kernels.launch import overlapped
    rng = np.random.default_rng(13)
    rows, n, vocab = 8, 15, 49152
    x, params, pos, drafts, q, _ = make_case(rng, rows, n, vocab, True)
    dx, dd, dq = cupy.asarray(x), cupy.asarray(drafts), cupy.asarray(q)
    dp = DeviceSamplingParams.from_params(params, vocab)
    dpos = cupy.asarray(pos.astype(np.int32))
    dk = cupy.full(rows, n, np.int32)
    outs = [(cupy.zeros(rows, np.int32), cupy.zeros((rows, n + 1), np.int32), cupy.zeros(rows, np.int32))
            for _ in range(2 if pdl else 1)]
    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    with stream, overlapped(pdl):
        ops.sample_token(dx, dp, dpos, dd, dq, n_drafts=dk, out=outs[0])
        stream.synchronize()
        stream.begin_capture()
        for out in outs:
            ops.sample_token(dx, dp, dpos, dd, dq, n_drafts=dk, out=out)
        graph = stream.end_capture()
    with stream:
        for _ in range(3):
            params = random_params(rng, rows, vocab)
            dp.update(params, vocab)
            dpos.set(rng.integers(0, 2 ** 30, rows).astype(np.int32))
            dk.set(rng.integers(0, n + 1, rows).astype(np.int32))
            for out in outs:
                for o in out:
                    o.fill(-7)
            graph.launch(stream)
            stream.synchronize()
            eager = ops.sample_token(dx, params, cupy.asnumpy(dpos).tolist(), dd, dq, n_drafts=cupy.asnumpy(dk))
            for out in outs:
                for g, e in zip(out, eager):
                    np.testing.assert_array_equal(cupy.asnumpy(g), cupy.asnumpy(e))


@gpu
@pytest.mark.parametrize("c,cache", [(1, None), (2, None), (4, None), (8, None), (4, 0), (8, 0)])
def test_launch_shape_independence(monkeypatch, c, cache):
    """Every cluster size, with the chunk cached in shared memory (cache None: the kernel's
    chunk) or read from global memory (cache 0), gives the default launch's outputs exactly."""
    from glimmer_cupy.ops import speculative as spec
    rng = np.random.default_rng(17)
    rows, n, vocab = 24, 15, 40961                         # odd vocab: unaligned rows, scalar loads; fits C = 1
    case = make_case(rng, rows, n, vocab, True)
    base = run_gpu(*case)
    monkeypatch.setattr(spec, "verify_shape",
                        lambda r, n_, v, budget, sms=0: (c, spec.chunk_ids(v, c) if cache is None else cache))
    got = run_gpu(*case)
    for g, b in zip(got, base):
        np.testing.assert_array_equal(g, b)
    compare(*case)


def use_verify_threads(monkeypatch, threads: int | None) -> None:
    """Launch the cluster kernel from speculative.cu built with VERIFY_THREADS=threads (its
    compile-time block size) at every C (the launch takes that build: verify_defines); None: each
    C's build by ops.speculative.verify_threads."""
    from glimmer_cupy.ops import speculative as spec
    if threads is not None:
        monkeypatch.setattr(spec, "VERIFY_THREADS", threads)


@gpu
@pytest.mark.parametrize("threads", [None, 1024, 512])
@pytest.mark.parametrize("q_full", [False, True])
def test_short_list_positions_equal_the_long_path(monkeypatch, q_full, threads):
    """Rows with a small top-k decide their positions from the short path's list at every C (at
    C = 1 a list of at most 64 entries by a few warps, longer ones and C >= 2 by the block), held
    to C = 8 and to the NumPy reference: the same tokens, counts and flags, including zero-q
    and out-of-range device drafts, rows that accept everything (the bonus), and lists that
    overflow (ties at the bound: the long path after all). With each C's build by the rule, and
    with every C at 1024 and at 512 threads a block (whose list holds 512 entries)."""
    import cupy
    from glimmer_cupy.ops import speculative as spec
    use_verify_threads(monkeypatch, threads)
    rng = np.random.default_rng(29 + q_full)
    rows, n, vocab = 20, 15, 30011
    x, params, pos, drafts, q, n_drafts = make_case(rng, rows, n, vocab, q_full)
    for r in range(rows):
        params[r] = SamplingParams(float(rng.choice([0.6, 1.0])), int(rng.choice([1, 5, 50, 256])),
                                   float(rng.choice([1.0, 0.8])), float(rng.choice([0.0, 0.02])), seed=100 + r)
    x[0] = np.round(x[0])                                   # a few values: lists overflow at the bound
    x[1, :, :3000] = x[1].max()                             # 3000 ties at the top
    drafts[2] = np.argmax(x[2, :n], axis=-1)               # long accepted runs, often the bonus
    drafts[3, 4] = vocab + 5                                # out of range (device drafts: unchecked)
    drafts[4, 0] = -3
    if q is not None:
        q[5, 0, drafts[5, 0]] = 0.0                        # q(d) = 0: rejected, flag 2
    d = cupy.asarray(drafts)
    outs = {}
    for c in (1, 2, 4, 8):
        monkeypatch.setattr(spec, "verify_shape", lambda r, n_, v, budget, sms=0, c=c: (c, spec.chunk_ids(v, c)))
        outs[c] = run_gpu(x, params, pos, d, q, n_drafts)
    for c in (1, 2, 4):
        for g, b in zip(outs[c], outs[8]):
            np.testing.assert_array_equal(g, b, err_msg=f"C = {c} against C = 8")
    assert outs[8][2][3] & spec.INVALID_DRAFT or outs[8][0][3] < 4 or (n_drafts is not None and n_drafts[3] <= 4)
    assert outs[8][2][4] & spec.INVALID_DRAFT or (n_drafts is not None and n_drafts[4] == 0)
    keep = [r for r in range(rows) if r not in (3, 4)]
    sub = lambda a: a[keep]
    monkeypatch.undo()
    compare(sub(x), [params[r] for r in keep], sub(pos), sub(drafts), None if q is None else sub(q),
            None if n_drafts is None else sub(n_drafts))


@gpu
@pytest.mark.parametrize("threads", [1024, 512])
def test_short_list_from_kept_float4s(monkeypatch, threads):
    """At C = 1 the gather lists a thread's ids from the float4 its first read kept, and reads the
    row again only for a thread with listed ids elsewhere. Logits placed by the kernel's own layout
    (thread t reads float4s t, t + T, ... of the row's aligned middle; single ids at both ends): two
    listed ids in one float4, listed ids in two float4s of one thread, ties inside a kept float4,
    listed ids among the single ends, and rows whose whole list sits in a few threads. C = 1 must
    give C = 8's tokens, counts and flags (its threads read their ids again), and the reference's."""
    from glimmer_cupy.ops import speculative as spec
    use_verify_threads(monkeypatch, threads)
    rng = np.random.default_rng(71 + threads)
    rows, n, vocab = 6, 7, 30011                           # odd: every position's row starts differently
    x = rng.normal(0, 1, (rows, n + 1, vocab)).astype(np.float32)
    for r in range(rows):
        for a in range(n + 1):
            start = (4 - ((r * (n + 1) + a) * vocab) % 4) % 4          # the aligned middle's first id
            f4 = lambda j, c=0: start + 4 * j + c
            row = x[r, a]
            if r % 3 == 0:
                row[[f4(5), f4(5, 2)]] = [9.0, 8.5]                     # two in one float4
                row[[f4(7, 1), f4(7 + threads, 3)]] = [8.8, 8.7]       # one thread, two float4s
                row[[f4(11), f4(11, 1), f4(11, 3)]] = 8.6               # ties in a kept float4
                row[:start] = 8.9                                        # the leading singles
                row[vocab - 2:] = [8.4, 8.3]                             # trailing singles (or a float4's)
            elif r % 3 == 1:                                            # the whole list in three threads
                for t in (2, 300, 301):
                    for j in range(t, (vocab - start) // 4, threads):
                        row[f4(j):f4(j) + 4] += 6.0
            else:                                                       # the top near one float4's
                row[f4(40):f4(40) + 4] = 7.0 + rng.random(4)           # neighbours, most of a list ties
                row[f4(40 + threads):f4(40 + threads) + 4] = 7.0
    params = [SamplingParams(float(rng.choice([0.7, 1.0])), int(rng.choice([5, 20, 50])), float(rng.choice([1.0, 0.9])),
                             0.0, seed=500 + r) for r in range(rows)]
    pos = rng.integers(0, 2 ** 30, rows)
    drafts = np.argmax(x[:, :n], axis=-1).astype(np.int32)            # listed drafts: many accepted
    drafts[1::2, 2] = rng.integers(0, vocab, rows // 2)
    q = rng.dirichlet(np.ones(vocab) * 0.3, (rows, n)).astype(np.float32)
    for r in range(rows):
        for a in range(n):
            q[r, a, drafts[r, a]] = max(q[r, a, drafts[r, a]], 0.05)
    outs = {}
    for c in (1, 8):
        monkeypatch.setattr(spec, "verify_shape", lambda r, n_, v, budget, sms=0, c=c: (c, 0))
        outs[c] = run_gpu(x, params, pos, drafts, q, None)
    for name, g, w in zip(("n_accepted", "tokens", "flags"), outs[1], outs[8]):
        np.testing.assert_array_equal(g, w, err_msg=name)
    assert outs[1][0].max() > 0                             # some positions accepted from the lists
    monkeypatch.undo()
    compare(x, params, pos, drafts, q, None)


@gpu
@pytest.mark.parametrize("rows,vocab", [(1, 7), (1, 151936), (3, 262144), (9, 1000), (9, 49152), (12, 151936)])
def test_verify_threads_builds_agree(monkeypatch, rows, vocab):
    """The cluster kernel at 512 threads a block (VERIFY_THREADS=512: half the loads in flight, a
    list of 512 entries, two blocks an SM at C = 1) gives the 1024-thread build's tokens, counts and
    flags: the same rules, so nothing may differ. One row and three rows run at C = 8, nine and 12
    at C = 1; rows of few distinct values make lists overflow."""
    rng = np.random.default_rng(rows * 7 + vocab)
    x, params, pos, drafts, q, n_drafts = make_case(rng, rows, 15, vocab, True)
    x[0] = np.round(x[0])
    with monkeypatch.context() as m:
        use_verify_threads(m, 1024)
        want = run_gpu(x, params, pos, drafts, q, n_drafts)
    use_verify_threads(monkeypatch, 512)
    got = run_gpu(x, params, pos, drafts, q, n_drafts)
    for name, g, w in zip(("n_accepted", "tokens", "flags"), got, want):
        np.testing.assert_array_equal(g, w, err_msg=name)


@gpu
@pytest.mark.parametrize("q_full", [False, True])
def test_plain_temperature_rows(q_full):
    """Rows without top-k, top-p or min-p: no selects, and K is summed in the pass that sums S."""
    rng = np.random.default_rng(19 + q_full)
    rows, n, vocab = 16, 15, 151936
    x, params, pos, drafts, q, k = make_case(rng, rows, n, vocab, q_full)
    params = [SamplingParams(float(rng.choice([0.5, 1.0, 1.3])), 0, 1.0, 0.0, seed=r) for r in range(rows)]
    _, bad = compare(x, params, pos, drafts, q, k)
    print(f"plain temperature q {q_full}: {bad} fragile rows differ")


@gpu
def test_all_rejected_and_all_accepted_rows():
    """Rows whose every position ends (each cluster may write its own token; only the first
    survives, the rest is padding) beside rows that accept all drafts (the bonus)."""
    rng = np.random.default_rng(23)
    rows, n, vocab = 32, 15, 5000
    x, params, pos, drafts, q, _ = make_case(rng, rows, n, vocab, False, accept_bias=False)
    for r in range(rows):
        params[r] = GREEDY if r % 2 else SamplingParams(0.7, 0, 1.0, 0.0, seed=r)
        am = np.argmax(x[r, :n], axis=-1)
        drafts[r] = (am + 1) % vocab if r % 4 < 2 else am
    got, _ = compare(x, params, pos, drafts, None, None)
    greedy_all = [r for r in range(rows) if r % 2 and r % 4 >= 2]
    assert (got[0][greedy_all] == n).all()
    assert (got[0][[r for r in range(rows) if r % 4 == 1]] == 0).all()


@gpu
@pytest.mark.parametrize("vocab", [5000, 151936, 262147])
def test_greedy_rows_across_slices(vocab):
    """Greedy rows run on verify_greedy, an argmax split over several blocks per position: ties
    between blocks go to the lowest id, a NaN or +inf in any block flags the position, an all -inf
    position gives id 0 flagged; beside stochastic rows, device or host parameters alike."""
    import cupy
    rng = np.random.default_rng(vocab)
    rows, n = 12, 15
    x, params, pos, drafts, q, k = make_case(rng, rows, n, vocab, False)
    for r in range(rows):
        if r % 3:
            params[r] = GREEDY
    top = x.max() + 1.0
    x[1, 3, [vocab - 2, vocab // 2, 7]] = top                # a tie across blocks: id 7
    x[2, 0, vocab - 1] = np.nan                               # the last block only
    x[4, 2] = -np.inf
    x[5, 1, vocab // 3] = np.inf
    for r in (1, 2, 4, 5, 7):                                 # accept up to the interesting position
        drafts[r] = np.argmax(np.where(np.isnan(x[r, :n]), -np.inf, x[r, :n]), axis=-1)
    drafts[8] = np.argmax(x[8, :n], axis=-1)                  # every draft accepted: the bonus
    got, _ = compare(x, params, pos, drafts, None, k)         # greedy rows: exactly the reference
    dev = DeviceSamplingParams.from_params(params, vocab)
    out = (cupy.full(rows, -7, np.int32), cupy.full((rows, n + 1), -7, np.int32), cupy.full(rows, -7, np.int32))
    ops.sample_token(cupy.asarray(x), dev, cupy.asarray(pos.astype(np.int32)), cupy.asarray(drafts), None,
                     n_drafts=k, out=out)
    for g, o in zip(got, out):
        np.testing.assert_array_equal(g, cupy.asnumpy(o))


@gpu
def test_out_arrays_must_be_distinct():
    import cupy
    x = cupy.zeros((2, 3, 10), np.float32)
    same = cupy.zeros(2, np.int32)
    with pytest.raises(ValueError, match="distinct"):
        ops.sample_token(x, [GREEDY] * 2, [0, 0], np.zeros((2, 2), np.int32),
                         out=(same, cupy.zeros((2, 3), np.int32), same))
