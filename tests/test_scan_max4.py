"""rowmath::Max4, verify_greedy's branch-free max scan over float4s (cuda_src/row_math.cuh, built
for the host through host_harness), against take1 and NumPy: wherever max4_exact holds, max4_end
gives take1's max and lowest argmax over the same ids; max4_exact fails for every run of logits
holding NaN or +-inf; rows are scanned as the kernel's threads do (thread t of T takes float4s
t, t + T, ... of each half), with the take1 rescan where max4_exact fails."""

import ctypes

import numpy as np
import pytest
from host_harness import build_host_library

HARNESS = r"""
#include "row_math.cuh"
using namespace rowmath;
extern "C" {
// runs of n4 float4s each: exact[r], and (lmax, amax) after max4_end and after take1
void h_runs(const float* x, int runs, int n4, int* exact, float* lmax, int* amax, float* lmax1, int* amax1) {
    for (int r = 0; r < runs; ++r) {
        const float* v = x + (long long)r * 4 * n4;
        Max4 s = max4_start();
        for (int j = 0; j < n4; ++j) max4_take(s, v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3], j);
        float l = -inf_f32();
        int a = 0x7fffffff;
        max4_end(s, 0, l, a);
        exact[r] = max4_exact(s);
        lmax[r] = l;
        amax[r] = a;
        float l1 = -inf_f32();
        int a1 = 0x7fffffff, b1 = 0;
        for (int i = 0; i < 4 * n4; ++i) take1(v[i], i, l1, a1, b1);
        lmax1[r] = l1;
        amax1[r] = a1;
    }
}
// a slice [0, n) split at mid (a multiple of 4) scanned as greedy_scan4's T threads do
void h_slice(const float* x, int n, int mid, int threads, float* lmax, int* amax, int* bad, int* rescans) {
    const int n4 = n >> 2, m4 = mid >> 2;
    float best = -inf_f32();
    int at = 0x7fffffff, any = 0, again = 0;
    for (int t = 0; t < threads; ++t) {
        float l = -inf_f32();
        int a = 0x7fffffff, b = 0;
        Max4 s = max4_start();
        for (int j = t; j < m4; j += threads) max4_take(s, x[4 * j], x[4 * j + 1], x[4 * j + 2], x[4 * j + 3], j);
        for (int j = m4 + t; j < n4; j += threads) max4_take(s, x[4 * j], x[4 * j + 1], x[4 * j + 2], x[4 * j + 3], j);
        if (max4_exact(s)) {
            max4_end(s, 0, l, a);
        } else {
            ++again;
            for (int j = t; j < m4; j += threads) for (int k = 0; k < 4; ++k) take1(x[4 * j + k], 4 * j + k, l, a, b);
            for (int j = m4 + t; j < n4; j += threads) for (int k = 0; k < 4; ++k) take1(x[4 * j + k], 4 * j + k, l, a, b);
        }
        for (int i = 4 * n4 + t; i < n; i += threads) take1(x[i], i, l, a, b);
        take_better(best, at, l, a);
        any |= b;
    }
    *lmax = best;
    *amax = at;
    *bad = any;
    *rescans = again;
}
}
"""

F32P = np.ctypeslib.ndpointer(np.float32, flags="C")
I32P = np.ctypeslib.ndpointer(np.int32, flags="C")
SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.0e38, -3.0e38], np.float32)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = build_host_library(HARNESS, tmp_path_factory.mktemp("max4"), "max4")
    lib.h_runs.argtypes = [F32P, ctypes.c_int, ctypes.c_int, I32P, F32P, I32P, F32P, I32P]
    lib.h_slice.argtypes = [F32P, ctypes.c_int, ctypes.c_int, ctypes.c_int, F32P, I32P, I32P, I32P]
    return lib


def draw(rng, n: int, special: float) -> np.ndarray:
    """n logits: small integers (so ties, signed zeros among them, are common), some specials."""
    x = rng.integers(-4, 5, n).astype(np.float32)
    x[rng.random(n) < 0.2] = -0.0
    hit = rng.random(n) < special
    x[hit] = rng.choice(SPECIALS, int(hit.sum()))
    return x


@pytest.mark.parametrize("n4", [1, 3, 16])
def test_max4_is_take1_wherever_exact(lib, n4):
    rng = np.random.default_rng(n4)
    runs = 50_000
    x = draw(rng, runs * 4 * n4, 0.01)
    out = [np.empty(runs, t) for t in (np.int32, np.float32, np.int32, np.float32, np.int32)]
    lib.h_runs(x, runs, n4, *out)
    exact, lmax, amax, lmax1, amax1 = out
    v = x.reshape(runs, 4 * n4)
    nonfinite = ~np.isfinite(v).all(axis=1)
    assert not exact[nonfinite].any()                      # NaN or +-inf anywhere: never exact
    ok = exact.astype(bool)
    assert 0.3 < ok.mean() < 0.99                          # both kinds of run occur
    assert np.array_equal(amax[ok], amax1[ok])
    # the same value bit for bit (signed zeros too: the value at the lowest argmax)
    assert np.array_equal(lmax[ok].view(np.int32), lmax1[ok].view(np.int32))


@pytest.mark.parametrize("n, threads", [(4, 1), (4099, 32), (15196, 256), (262147, 256)])
@pytest.mark.parametrize("case", ["normal", "specials", "all_nan", "all_neg_inf", "ties", "masked"])
def test_slice_scan_matches_numpy(lib, n, threads, case):
    rng = np.random.default_rng(n + threads)
    x = rng.normal(0, 3, n).astype(np.float32)
    if case == "specials":
        x = draw(rng, n, 0.05)
    elif case == "all_nan":
        x[:] = np.nan
    elif case == "all_neg_inf":
        x[:] = -np.inf
    elif case == "ties":
        x = np.round(x).astype(np.float32)
    elif case == "masked":
        x[rng.random(n) < 0.5] = -np.inf
    mid = min(n, (n // 4 + 3) & ~3)
    lmax, amax, bad, rescans = (np.empty(1, t) for t in (np.float32, np.int32, np.int32, np.int32))
    lib.h_slice(x, n, mid, threads, lmax, amax, bad, rescans)
    v = np.where(np.isnan(x), -np.inf, x)
    assert lmax[0] == v.max()
    assert amax[0] == int(np.argmax(v))                  # the lowest id of the maximum
    assert bad[0] == int(np.isnan(x).any() or np.isposinf(x).any())
    if case in ("normal", "ties"):
        assert rescans[0] == 0                           # finite rows take the short path throughout
