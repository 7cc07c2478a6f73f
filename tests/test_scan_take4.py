"""rowmath::take4, the max scan's step over a float4 (cuda_src/row_math.cuh, built for the host
through host_harness), against four take1 steps and against NumPy's max, lowest argmax and
non-finite test of a row: from random scan states, on logits drawn to hit every case of its short
path (finite and below the running max, ties with it, NaN of either sign, +-inf, signed zeros,
subnormals)."""

import ctypes

import numpy as np
import pytest
from host_harness import build_host_library

HARNESS = r"""
#include "row_math.cuh"
using namespace rowmath;
extern "C" {
// n steps from the same states: out_* [2 * j] after take4, [2 * j + 1] after four take1
void h_steps(const float* x, const float* lmax0, const int* amax0, const int* ids, int n, float* lmax, int* amax,
             int* bad) {
    for (int j = 0; j < n; ++j) {
        for (int w = 0; w < 2; ++w) {
            float l = lmax0[j];
            int a = amax0[j], b = 0;
            const float* v = x + 4 * j;
            if (w == 0) {
                take4(v[0], v[1], v[2], v[3], ids[j], l, a, b);
            } else {
                for (int k = 0; k < 4; ++k) take1(v[k], ids[j] + k, l, a, b);
            }
            lmax[2 * j + w] = l;
            amax[2 * j + w] = a;
            bad[2 * j + w] = b;
        }
    }
}
// a row of n (a multiple of 4) logits scanned as the kernel's threads do: thread t of T takes
// float4s t, t + T, ..., then the threads' pairs are combined
void h_row(const float* x, int n, int threads, float* lmax, int* amax, int* bad) {
    float best = -inf_f32();
    int at = 0x7fffffff, any = 0;
    for (int t = 0; t < threads; ++t) {
        float l = -inf_f32();
        int a = 0x7fffffff, b = 0;
        for (int j = t; 4 * j < n; j += threads) take4(x[4 * j], x[4 * j + 1], x[4 * j + 2], x[4 * j + 3], 4 * j, l, a, b);
        take_better(best, at, l, a);
        any |= b;
    }
    *lmax = best;
    *amax = at;
    *bad = any;
}
}
"""

F32P = np.ctypeslib.ndpointer(np.float32, flags="C")
I32P = np.ctypeslib.ndpointer(np.int32, flags="C")
SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.0, -3.0], np.float32)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = build_host_library(HARNESS, tmp_path_factory.mktemp("take4"), "take4")
    lib.h_steps.argtypes = [F32P, F32P, I32P, I32P, ctypes.c_int, F32P, I32P, I32P]
    lib.h_row.argtypes = [F32P, ctypes.c_int, ctypes.c_int, F32P, I32P, I32P]
    return lib


def draw(rng, n: int) -> np.ndarray:
    """n logits: mostly small integers (so ties are common), some specials."""
    x = rng.integers(-4, 5, n).astype(np.float32)
    hit = rng.random(n) < 0.15
    x[hit] = rng.choice(SPECIALS, int(hit.sum()))
    return x


def test_take4_equals_four_take1_from_any_state(lib):
    rng = np.random.default_rng(11)
    n = 200_000
    x = draw(rng, 4 * n)
    lmax0 = draw(rng, n)
    lmax0[np.isnan(lmax0)] = -np.inf                      # a scan's running max is never NaN
    amax0 = rng.choice(np.array([0x7FFFFFFF, 0, 5, 8, 12], np.int32), n)
    ids = rng.choice(np.array([0, 4, 8, 16], np.int32), n)
    lmax, amax, bad = np.empty(2 * n, np.float32), np.empty(2 * n, np.int32), np.empty(2 * n, np.int32)
    lib.h_steps(x, lmax0, amax0, ids, n, lmax, amax, bad)
    fast, slow = (slice(0, None, 2), slice(1, None, 2))
    assert np.array_equal(lmax[fast], lmax[slow], equal_nan=True)
    assert np.array_equal(amax[fast], amax[slow])
    assert np.array_equal(bad[fast], bad[slow])
    # the short path was taken often, and the long one too
    changed = (lmax[slow] != lmax0) | (amax[slow] != amax0) | (bad[slow] != 0)
    assert 0.2 < changed.mean() < 0.9


@pytest.mark.parametrize("n, threads", [(4, 1), (4096, 32), (151936, 256), (262144, 1024)])
@pytest.mark.parametrize("case", ["normal", "specials", "all_nan", "all_neg_inf", "ties"])
def test_row_scan_matches_numpy(lib, n, threads, case):
    rng = np.random.default_rng(n + threads)
    x = rng.normal(0, 3, n).astype(np.float32)
    if case == "specials":
        x = draw(rng, n)
    elif case == "all_nan":
        x[:] = np.nan
    elif case == "all_neg_inf":
        x[:] = -np.inf
    elif case == "ties":
        x = np.round(x).astype(np.float32)
    lmax, amax, bad = np.empty(1, np.float32), np.empty(1, np.int32), np.empty(1, np.int32)
    lib.h_row(x, n, threads, lmax, amax, bad)
    v = np.where(np.isnan(x), -np.inf, x)
    assert lmax[0] == v.max()
    assert amax[0] == int(np.argmax(v))                  # the lowest id of the maximum
    assert bad[0] == int(np.isnan(x).any() or np.isposinf(x).any())
