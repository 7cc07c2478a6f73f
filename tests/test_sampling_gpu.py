"""Sampling on the GPU (cuda_src/sampling.cu) against the NumPy reference, plus CPU checks of
Philox (cuda_src/philox.cuh through a host harness) and of the argument checks.

The kernel computes the softmax in float32 (error ~2 ulp of each e = exp(z - zmax)) and sums in
fixed point (2^-40 of the top token), where the reference works in float64. Tokens are equal
except where a decision sits within that rounding of its threshold: u * total within 1e-6
(relative) of a cumulative boundary, or top_p within 1e-6 of a nucleus partial sum, or min_p within
1e-6 of a token's p / max(p). `near_boundary` finds such rows from the reference's float64 numbers;
a mismatch anywhere else fails. Near rows are common where the distribution is flat (top-k 0 over
a large vocabulary: each token holds ~1e-5 of the mass, so 1e-6 of the total is a tenth of a
token), but the kernel's error is well below 1e-6 and few of them differ: the counts are printed.
"""

import ctypes
from pathlib import Path

import numpy as np
import pytest
from host_harness import build_host_library

from glimmer_cupy import ops
from glimmer_cupy.ops._check import OpArgumentError
from glimmer_cupy.ops.sampling import (
    DeviceSamplingParams,
    host_positions,
    check_params,
)
from glimmer_cupy.reference import sampling as ref
from glimmer_cupy.reference.philox import Purpose, philox4x32_10, uniform
from glimmer_cupy.reference.sampling import SamplingParams

REPO = Path(__file__).resolve().parents[1]
gpu = pytest.mark.gpu          # skipped without a device (conftest.py)
TOL = 1e-6


def chi2_critical(df: int) -> float:
    """Upper 1e-4 point of chi-square(df) by Wilson-Hilferty: a false failure in 10^4 runs."""
    z = 3.719
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def random_params(rng, n: int) -> list[SamplingParams]:
    return [SamplingParams(temperature=float(rng.choice([0.0, 0.3, 0.7, 0.8, 1.0, 1.5], p=[.05, .15, .2, .2, .2, .2])),
                           top_k=int(rng.choice([0, 1, 20, 50, 1000])),
                           top_p=float(rng.choice([1.0, 0.57, 0.9, 0.95])),
                           min_p=float(rng.choice([0.0, 0.02, 0.1])),
                           seed=int(rng.integers(0, 2 ** 64, dtype=np.uint64)))
            for _ in range(n)]


def random_logits(rng, rows: int, vocab: int) -> np.ndarray:
    """N(0, 3^2) rows, some wider or narrower, one in four rounded to integers (ties everywhere)."""
    x = rng.normal(0, 3, (rows, vocab)) * rng.choice([0.3, 1.0, 3.0], size=(rows, 1))
    x[::4] = np.round(x[::4])
    return x.astype(np.float32)


def near_boundary(row: np.ndarray, p: SamplingParams, position: int) -> bool:
    """True when float32 rounding may move the token, judged from the reference's float64 numbers:
    u * total lies within TOL (relative) of a cumulative boundary, widened by the mass of the
    tokens whose keep decision is fragile (a nucleus partial sum within TOL of top_p next to them,
    or p / max(p) within TOL of min_p): dropping or keeping those moves every later boundary."""
    if p.temperature == 0.0:
        return False
    z = row.astype(np.float64) / p.temperature
    keep = np.ones(z.size, bool)
    if 0 < p.top_k < z.size:
        keep = z >= np.partition(z, z.size - p.top_k)[z.size - p.top_k]
    ratio = np.where(keep, np.exp(z - z[keep].max()), 0.0)     # p / max(p), what min-p compares
    q = ratio / ratio.sum()
    fragile = 0.0
    if p.top_p < 1.0:
        desc = np.sort(q[keep])[::-1]
        c = np.cumsum(desc)
        near = (np.abs(c - p.top_p) < TOL) | (np.abs(c - desc - p.top_p) < TOL)
        fragile += q[keep & np.isin(q, desc[near])].sum()       # whole tie groups flip together
    if p.min_p > 0.0:
        fragile += q[keep & (np.abs(ratio - p.min_p) < TOL)].sum()
    c = np.cumsum(ref.filtered_probs(row, p))
    x = float(uniform(p.seed, position, Purpose.SAMPLE)) * c[-1]
    return bool(np.min(np.abs(c - x)) < TOL * c[-1] + 4 * fragile)


# ------------------------------------------------------------ CPU: Philox through a host harness

HARNESS = r"""
#include "philox.cuh"
#define PX_EXPORT extern "C" __attribute__((visibility("default")))

PX_EXPORT void px_blocks(const unsigned* ctr, const unsigned* key, unsigned* out, int n) {
    for (int i = 0; i < n; ++i) {
        philox::U32x4 c;
        for (int j = 0; j < 4; ++j) c.v[j] = ctr[4 * i + j];
        const philox::U32x4 r = philox::philox4x32_10(c, key[2 * i], key[2 * i + 1]);
        for (int j = 0; j < 4; ++j) out[4 * i + j] = r.v[j];
    }
}

PX_EXPORT void px_uniform(const unsigned long long* seed, const unsigned* position, const unsigned* purpose,
                          const unsigned* index, float* out, int n) {
    for (int i = 0; i < n; ++i) out[i] = philox::uniform(seed[i], position[i], purpose[i], index[i]);
}
"""


@pytest.fixture(scope="module")
def philox_lib(tmp_path_factory):
    """philox.cuh compiled for the host as a shared library (g++, else nvcc)."""
    return build_host_library(HARNESS, tmp_path_factory.mktemp("philox"), "px")


def _ptr(a: np.ndarray):
    return ctypes.c_void_p(a.ctypes.data)


def test_philox_blocks_match_reference(philox_lib):
    rng = np.random.default_rng(11)
    n = 4096
    ctr = rng.integers(0, 2 ** 32, (n, 4), dtype=np.uint64).astype(np.uint32)
    key = rng.integers(0, 2 ** 32, (n, 2), dtype=np.uint64).astype(np.uint32)
    ctr[:3], key[:3] = 0, 0                                   # the all-zero and all-one corners
    ctr[3:6], key[3:6] = 0xFFFFFFFF, 0xFFFFFFFF
    out = np.zeros((n, 4), np.uint32)
    philox_lib.px_blocks(_ptr(ctr), _ptr(key), _ptr(out), ctypes.c_int(n))
    np.testing.assert_array_equal(out, philox4x32_10(ctr, key))


def test_philox_uniform_matches_reference(philox_lib):
    rng = np.random.default_rng(12)
    n = 4096
    seed = rng.integers(0, 2 ** 64, n, dtype=np.uint64)
    seed[:2] = (0, 2 ** 64 - 1)
    position = rng.integers(0, 2 ** 31, n).astype(np.uint32)
    purpose = rng.integers(0, 3, n).astype(np.uint32)
    index = rng.integers(0, 64, n).astype(np.uint32)
    out = np.full(n, np.nan, np.float32)
    philox_lib.px_uniform(_ptr(seed), _ptr(position), _ptr(purpose), _ptr(index), _ptr(out), ctypes.c_int(n))
    want = uniform(seed, position.astype(np.int64), purpose.astype(np.int64), index.astype(np.int64))
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


# ------------------------------------------------------------ CPU: argument checks

@pytest.mark.parametrize("field,value,arg", [
    ("temperature", -0.5, "params[1].temperature"),
    ("temperature", float("nan"), "params[1].temperature"),
    ("temperature", float("inf"), "params[1].temperature"),
    ("top_p", 0.0, "params[1].top_p"),
    ("top_p", 1.5, "params[1].top_p"),
    ("top_k", -1, "params[1].top_k"),
    ("top_k", 101, "params[1].top_k"),
    ("min_p", 1.0, "params[1].min_p"),
    ("min_p", -0.1, "params[1].min_p"),
    ("seed", -1, "params[1].seed"),
])
def test_bad_params_name_argument_and_value(field, value, arg):
    params = [SamplingParams(), SamplingParams(**{field: value}), SamplingParams()]
    with pytest.raises(ValueError) as e:
        check_params(params, 3, 100)
    assert isinstance(e.value, OpArgumentError)
    assert f"sample_rows: {arg} must be" in str(e.value) and str(value) in str(e.value)


def test_good_params_pass_and_counts_are_checked():
    check_params([SamplingParams(top_k=100, top_p=1.0, min_p=0.0), ref.GREEDY], 2, 100)
    with pytest.raises(ValueError, match=r"sample_rows: params must be one SamplingParams per row \(3\), got 2"):
        check_params([SamplingParams()] * 2, 3, 100)
    with pytest.raises(ValueError, match="params\\[0\\] must be a SamplingParams, got dict"):
        check_params([{}], 1, 100)


def test_positions_are_checked():
    assert host_positions([3, 4], 2).dtype == np.int32
    assert host_positions([], 0).dtype == np.int32            # a prefill chunk: no logit rows
    with pytest.raises(ValueError, match="sample_rows: positions must be 1 integers"):
        host_positions([], 1)
    with pytest.raises(ValueError, match="sample_rows: positions must be 2 integers"):
        host_positions([1.0, 2.0], 2)
    with pytest.raises(ValueError, match="sample_rows: positions must be 2 integers"):
        host_positions([1], 2)
    with pytest.raises(ValueError, match=r"positions must be in \[0, 2\^31\), got -1"):
        host_positions([0, -1], 2)


def test_host_path_unchanged_and_takes_out():
    rng = np.random.default_rng(5)
    x = random_logits(rng, 4, 50)
    params, pos = random_params(rng, 4), [1, 2, 3, 4]
    tokens, flags = ops.sample_rows(x, params, pos)
    want = ref.sample_rows(x, params, pos)
    np.testing.assert_array_equal(tokens, want[0])
    np.testing.assert_array_equal(flags, want[1])
    out = (np.zeros(4, np.int32), np.zeros(4, np.int32))
    assert ops.sample_rows(x, params, pos, out=out)[0] is out[0]
    np.testing.assert_array_equal(out[0], want[0])
    np.testing.assert_array_equal(ops.argmax(x), ref.argmax(x))


# ------------------------------------------------------------ GPU

def run_gpu(x: np.ndarray, params, positions):
    import cupy
    t, f = ops.sample_rows(cupy.asarray(x), params, positions)
    return cupy.asnumpy(t), cupy.asnumpy(f)


def compare(x: np.ndarray, params, positions) -> tuple[int, int]:
    """GPU vs reference tokens and flags; returns (rows near a boundary, mismatches among them).
    A mismatch on a row not near a boundary fails."""
    import cupy
    tok, flg = cupy.full(len(params), -7, np.int32), cupy.full(len(params), -7, np.int32)   # poisoned
    ops.sample_rows(cupy.asarray(x), params, positions, out=(tok, flg))
    got, got_f = cupy.asnumpy(tok), cupy.asnumpy(flg)
    want, want_f = ref.sample_rows(x, params, positions)
    np.testing.assert_array_equal(got_f, want_f)
    near = bad = 0
    for r in range(len(params)):
        is_near = near_boundary(x[r], params[r], positions[r])
        near += is_near
        if got[r] != want[r]:
            assert is_near, (f"row {r}: GPU token {got[r]}, reference {want[r]}, {params[r]}, "
                             f"position {positions[r]}")
            bad += 1
    return near, bad


@gpu
@pytest.mark.parametrize("vocab", [1, 7, 1000, 49152, 151936, 262144])
def test_argmax(vocab):
    import cupy
    rng = np.random.default_rng(vocab)
    x = rng.normal(0, 3, (6, vocab)).astype(np.float32)
    x[1] = np.round(x[1])                                  # ties: the lowest id wins
    x[2, rng.integers(0, vocab, 3)] = x[2].max()
    x[3, rng.integers(0, vocab, max(1, vocab // 3))] = np.nan
    x[3, vocab - 1] = np.nan
    x[4] = np.nan                                          # all NaN -> 0
    x[5] = -np.inf                                         # all -inf -> 0
    out = cupy.full(6, -7, np.int32)
    ops.argmax(cupy.asarray(x), out=out)                   # 6 rows: a cluster of 8 blocks per row
    np.testing.assert_array_equal(cupy.asnumpy(out), ref.argmax(x))
    many = np.tile(x, (12, 1))                             # 72 rows: one block per row
    np.testing.assert_array_equal(cupy.asnumpy(ops.argmax(cupy.asarray(many))), ref.argmax(many))


@gpu
@pytest.mark.parametrize("vocab", [49152, 151936, 262144])
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_sample_rows_matches_reference(batch, vocab):
    rng = np.random.default_rng(batch * 1000003 + vocab)
    x = random_logits(rng, batch, vocab)
    params = random_params(rng, batch)
    positions = rng.integers(0, 2 ** 31, batch).tolist()
    near, bad = compare(x, params, positions)
    print(f"batch {batch} vocab {vocab}: {near} rows near a boundary, {bad} of them differ")


@gpu
def test_sample_rows_many_small_rows():
    """Thousands of rows over small vocabularies: every filter combination, ties, odd sizes."""
    rng = np.random.default_rng(3)
    for vocab in (2, 7, 33, 1000, 4097):
        x = random_logits(rng, 1000, vocab)
        params = random_params(rng, 1000)
        params = [SamplingParams(p.temperature, min(p.top_k, vocab), p.top_p, p.min_p, p.seed) for p in params]
        near, bad = compare(x, params, rng.integers(0, 2 ** 31, 1000).tolist())
        print(f"vocab {vocab}: {near} of 1000 rows near a boundary, {bad} of them differ")


@gpu
@pytest.mark.parametrize("vocab", [7, 4097, 151936])
def test_blocks_per_row_agree(vocab):
    """Sums are integers, so splitting a row over 1, 2, 4 or 8 blocks gives the same tokens."""
    import cupy
    rng = np.random.default_rng(vocab + 1)
    x = cupy.asarray(random_logits(rng, 16, vocab))
    params = random_params(rng, 16)
    params = [SamplingParams(p.temperature, min(p.top_k, vocab), p.top_p, p.min_p, p.seed) for p in params]
    pos = rng.integers(0, 2 ** 31, 16).tolist()
    got = [cupy.asnumpy(ops.sample_rows(x, params, pos, blocks_per_row=c)[0]) for c in (1, 2, 4, 8)]
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])


@gpu
@pytest.mark.parametrize("blocks", [1, 8])
def test_candidate_lists_at_their_edges(blocks):
    """Kept sets just under and over what a block lists in shared memory (2048 entries; 256 for
    the pairwise draw), and ties at the k-th value that overflow it: the same tokens as the
    reference whichever source a block reads."""
    import cupy
    rng = np.random.default_rng(blocks + 40)
    vocab = 151936
    ks = [255, 256, 257, 2047, 2048, 2049, 5000, 16000]
    x = rng.normal(0, 3, (len(ks) + 2, vocab)).astype(np.float32)
    x[-2:] = np.round(x[-2:] * 0.5)                        # few distinct values: huge ties at the k-th
    ks += [100, 3000]
    params = [SamplingParams(temperature=1.0, top_k=k, top_p=float(rng.choice([1.0, 0.9])), min_p=0.0,
                             seed=int(rng.integers(0, 2 ** 63))) for k in ks]
    pos = rng.integers(0, 2 ** 31, len(ks)).tolist()
    got = cupy.asnumpy(ops.sample_rows(cupy.asarray(x), params, pos, blocks_per_row=blocks)[0])
    want, _ = ref.sample_rows(x, params, pos)
    for r in range(len(ks)):
        assert got[r] == want[r] or near_boundary(x[r], params[r], pos[r]), (r, ks[r], got[r], want[r])


@gpu
@pytest.mark.parametrize("blocks", [1, 2, 4, 8])
def test_short_path_draws_the_long_paths_token(blocks):
    """Rows with 0 < top-k <= 256 take the short path (sampling_topk.cuh): the same integer weights
    and thresholds on a gathered list, so exactly the long path's token and flag. Covers ties at
    the bound, masked ids around it, fewer finite ids than k, and lists that overflow (ties) and
    send the row back to the long path."""
    import cupy
    rng = np.random.default_rng(50 + blocks)
    for vocab in (7, 1000, 4099, 49152, 151936):
        rows = 40
        x = random_logits(rng, rows, vocab)
        x[5, rng.integers(0, vocab, vocab // 2)] = -np.inf
        x[6] = np.round(x[6] * 0.2)                          # a few distinct values: the list overflows
        x[7] = -np.inf
        x[7, rng.integers(0, vocab, 3)] = 1.5                # fewer finite ids than k
        x[8] = np.sort(x[8])                                 # the largest logits all in the last chunk
        ks = rng.choice([1, 2, 3, 20, 50, 64, 255, 256], rows)
        params = [SamplingParams(temperature=float(rng.choice([0.5, 0.8, 1.3])), top_k=int(min(k, vocab - 1)),
                                 top_p=float(rng.choice([1.0, 0.9, 0.5])), min_p=float(rng.choice([0.0, 0.05])),
                                 seed=int(rng.integers(0, 2 ** 63))) for k in ks]
        pos = rng.integers(0, 2 ** 31, rows).tolist()
        xd = cupy.asarray(x)
        got = []
        for short in (True, False):
            out = (cupy.full(rows, -7, np.int32), cupy.full(rows, -7, np.int32))      # poisoned
            ops.sample_rows(xd, params, pos, out=out, blocks_per_row=blocks, short_path=short)
            got.append((cupy.asnumpy(out[0]), cupy.asnumpy(out[1])))
        np.testing.assert_array_equal(got[0][0], got[1][0], err_msg=f"vocab {vocab}")
        np.testing.assert_array_equal(got[0][1], got[1][1], err_msg=f"vocab {vocab}")
        assert np.all((got[0][0] >= 0) & (got[0][0] < vocab))


@gpu
def test_batch_composition_independence():
    import cupy
    rng = np.random.default_rng(17)
    vocab = 151936
    x = random_logits(rng, 64, vocab)
    params = random_params(rng, 64)
    pos = rng.integers(0, 2 ** 31, 64).tolist()
    batch, _ = run_gpu(x, params, pos)
    perm = rng.permutation(64)
    shuffled, _ = run_gpu(np.ascontiguousarray(x[perm]), [params[i] for i in perm], [pos[i] for i in perm])
    np.testing.assert_array_equal(shuffled, batch[perm])
    for r in (0, 13, 63):
        alone, _ = run_gpu(x[r:r + 1], [params[r]], [pos[r]])
        assert alone[0] == batch[r]
    # a device array of positions and a DeviceSamplingParams give the same tokens
    d = DeviceSamplingParams.from_params(params, vocab)
    t, _ = ops.sample_rows(cupy.asarray(x), d, cupy.asarray(np.array(pos, np.int32)))
    np.testing.assert_array_equal(cupy.asnumpy(t), batch)


@gpu
def test_distribution_chi_square():
    """N draws (positions 0..N-1) of one row against the exact filtered distribution: chi-square at
    the 1e-4 upper point, so a correct sampler fails once in 10^4 runs (fixed seeds: never, here)."""
    rng = np.random.default_rng(23)
    vocab, n = 40, 40000
    row = rng.normal(0, 2, vocab).astype(np.float32)
    row[[3, 9, 17]] = -np.inf                               # probability zero
    for p in (SamplingParams(temperature=0.9, top_k=12, top_p=0.8, min_p=0.05, seed=99),
              SamplingParams(temperature=1.3, top_k=0, top_p=0.95, min_p=0.0, seed=2 ** 64 - 5),
              SamplingParams(temperature=0.7, top_k=25, top_p=1.0, min_p=0.1, seed=7)):
        q = ref.filtered_probs(row, p)
        x = np.repeat(row[None], n, axis=0)
        tokens, flags = run_gpu(x, [p] * n, list(range(n)))
        assert not flags.any()
        counts = np.bincount(tokens, minlength=vocab)
        assert np.all(counts[q == 0] == 0), "a zero-probability token was drawn"
        nz = q > 0
        exp = q[nz] * n
        stat = float(np.sum((counts[nz] - exp) ** 2 / exp))
        assert stat < chi2_critical(int(nz.sum()) - 1), (p, stat)


@gpu
def test_zero_probability_never_drawn_large_vocab():
    rng = np.random.default_rng(29)
    vocab, rows = 262144, 64
    x = rng.normal(0, 3, (rows, vocab)).astype(np.float32)
    x[:, ::2] = -np.inf                                      # even ids impossible
    params = [SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0, seed=s) for s in range(rows)]
    tokens, flags = run_gpu(x, params, list(range(rows)))
    assert not flags.any() and np.all(tokens % 2 == 1)
    params = [SamplingParams(temperature=1.0, top_k=5, top_p=1.0, seed=s) for s in range(rows)]
    tokens, _ = run_gpu(x, params, list(range(rows)))
    for r in range(rows):                                    # only the 5 largest
        assert tokens[r] in np.argsort(x[r])[-5:]


@gpu
def test_non_finite_rows_flagged():
    rng = np.random.default_rng(31)
    vocab = 49152
    x = rng.normal(0, 3, (6, vocab)).astype(np.float32)
    x[0, 100] = np.nan
    x[1, 7] = np.inf
    x[2] = -np.inf
    x[3] = np.nan
    x[4, :vocab // 2] = np.nan
    params = random_params(rng, 6)
    params = [SamplingParams(0.8, p.top_k, p.top_p, p.min_p, p.seed) for p in params]
    tokens, flags = run_gpu(x, params, list(range(6)))
    want, want_f = ref.sample_rows(x, params, list(range(6)))
    np.testing.assert_array_equal(flags, [1, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(flags, want_f)
    np.testing.assert_array_equal(tokens[:5], want[:5])
    assert np.all((tokens >= 0) & (tokens < vocab))


@gpu
@pytest.mark.parametrize("pdl", [False, True])
def test_graph_replay_with_new_parameters(pdl):
    """A captured sample_rows replays with parameters and positions rewritten in its device arrays,
    also launched with PDL (as the runtime's static steps launch it)."""
    import cupy
    from glimmer_cupy.kernels.launch import overlapped
    rng = np.random.default_rng(37)
    rows, vocab = 8, 49152
    x = cupy.asarray(random_logits(rng, rows, vocab))
    d = DeviceSamplingParams.empty(rows)
    pos = cupy.zeros(rows, np.int32)
    out = (cupy.zeros(rows, np.int32), cupy.zeros(rows, np.int32))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream, overlapped(pdl):
        ops.sample_rows(x, d, pos, out=out)                 # compile outside the capture
        stream.synchronize()
        stream.begin_capture()
        ops.sample_rows(x, d, pos, out=out)
        graph = stream.end_capture()
        for _ in range(4):
            params = random_params(rng, rows)
            positions = rng.integers(0, 2 ** 31, rows).astype(np.int32)
            d.update(params, vocab)
            pos.set(positions)
            out[0].fill(-7)
            graph.launch(stream)
            stream.synchronize()
            eager, _ = ops.sample_rows(x, params, positions.tolist())
            np.testing.assert_array_equal(cupy.asnumpy(out[0]), cupy.asnumpy(eager))
