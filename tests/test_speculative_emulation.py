"""The verification's per-row decisions, emulated on the CPU with cuda_src/row_math.cuh (built for
the host through host_harness) and checked against the NumPy reference.

speculative.cu examines every position of a row at once and joins them with a stop word
(row_math.cuh): each position decides alone (accept, or end with a token and flags) and an ending
position folds stop_key(a, flags) into the word with atomicMin; positions past the word's may skip.
Here each position's decision is made as the kernel makes it (greedy_accepts; accepts, residual_weight
and draw_target on integer weights E = round(p / max p * 2^40) from the reference's float64 p), the
positions are folded in a random order with the kernel's skip rule, and the result must be the
reference's sequential walk, token for token. The weights here come from float64 p (the kernel's
from float32 exp), so a decision could only differ where u sits within ~2^-40 of a threshold:
odds of about 1e-9 over the whole test, so a failure is a real difference."""

import ctypes

import numpy as np
import pytest
from host_harness import build_host_library
from test_speculative_gpu import make_case

from glimmer_cupy.reference import speculative as ref
from glimmer_cupy.reference.philox import Purpose, uniform
from glimmer_cupy.reference.sampling import (
    GREEDY,
    SamplingParams,
    argmax,
    filtered_probs,
)

HARNESS = r"""
#include "row_math.cuh"
using namespace rowmath;
extern "C" {
int h_stop_key(int a, int f) { return stop_key(a, f); }
int h_greedy_accepts(int drafted, long long d, int vocab, int amax, int* flags) {
    return greedy_accepts(drafted != 0, d, vocab, amax, flags);
}
int h_accepts(unsigned u24, u64 e_d, u64 kept, double q_d) { return accepts(u24, e_d, kept, q_d); }
void h_residual_weights(u64* w, const u64* e, const float* q, int vocab, u64 kept) {
    for (int i = 0; i < vocab; ++i) w[i] = residual_weight(e[i], q[i], kept);
}
u64 h_draw_target(unsigned u24, u64 total) { return draw_target(u24, total); }
// The kernel's join of positions 0..k, clusters running concurrently: events[] holds 2(k + 1)
// entries, a for position a's start (it reads the word and skips if the word already ends before
// it) and k + 1 + a for its end (an ending position folds its key in with atomicMin), each start
// before its end, interleaved in any order. Returns the final word; *skipped counts the skips.
int h_fold(int k, const int* keys, const int* events, int* skipped) {
    int word = stop_none(k);
    int skip[64] = {0};
    *skipped = 0;
    for (int j = 0; j < 2 * (k + 1); ++j) {
        const int e = events[j];
        if (e <= k) {
            skip[e] = stop_at(word) < e;
            *skipped += skip[e];
        } else if (!skip[e - k - 1] && keys[e - k - 1] >= 0 && keys[e - k - 1] < word) {
            word = keys[e - k - 1];
        }
    }
    return word;
}
int h_stop_at(int w) { return stop_at(w); }
int h_stop_flags(int w) { return stop_flags(w); }
int h_clamp_drafts(int k, int n) { return clamp_drafts(k, n); }
}
"""

U64P = np.ctypeslib.ndpointer(np.uint64, flags="C")
F32P = np.ctypeslib.ndpointer(np.float32, flags="C")
I32P = np.ctypeslib.ndpointer(np.int32, flags="C")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = build_host_library(HARNESS, tmp_path_factory.mktemp("rowmath"), "rowmath")
    lib.h_greedy_accepts.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_int, ctypes.c_int,
                                     ctypes.POINTER(ctypes.c_int)]
    lib.h_accepts.argtypes = [ctypes.c_uint, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_double]
    lib.h_residual_weights.argtypes = [U64P, U64P, F32P, ctypes.c_int, ctypes.c_uint64]
    lib.h_draw_target.argtypes = [ctypes.c_uint, ctypes.c_uint64]
    lib.h_draw_target.restype = ctypes.c_uint64
    lib.h_fold.argtypes = [ctypes.c_int, I32P, I32P, ctypes.POINTER(ctypes.c_int)]
    return lib


def u24(seed, pos, purpose) -> int:
    return int(np.float64(uniform(seed, pos, purpose)) * 2 ** 24)


def draw(lib, w: np.ndarray, u: int) -> int:
    """Step 6 on integer weights: the first id whose inclusive prefix sum exceeds the target."""
    t = lib.h_draw_target(u, int(w.sum()))
    return int(np.searchsorted(np.cumsum(w), t, side="right"))


def position(lib, x, d, drafted, q, p_: SamplingParams, pos: int, a: int):
    """One position alone, as its cluster decides: (key or -1 for accepted, token)."""
    vocab = x.size
    if ref._bad(x):
        return lib.h_stop_key(a, ref.NON_FINITE), int(argmax(x[None])[0])
    amax = int(argmax(x[None])[0])
    fl = ctypes.c_int(0)
    acc = lib.h_greedy_accepts(int(drafted), int(d), vocab, amax, ctypes.byref(fl))
    if p_.temperature == 0.0:
        return (-1, int(d)) if acc else (lib.h_stop_key(a, fl.value), amax)
    p = filtered_probs(x, p_)
    e = np.floor(p / p.max() * 2.0 ** 40 + 0.5).astype(np.uint64)
    kept = int(e.sum())
    if not drafted:
        return lib.h_stop_key(a, 0), draw(lib, e, u24(p_.seed, pos + a, Purpose.SAMPLE))
    valid = 0 <= d < vocab
    q_d = 1.0 if q is None else (float(q[d]) if valid else 0.0)
    if valid and lib.h_accepts(u24(p_.seed, pos + a, Purpose.ACCEPT), int(e[d]) if valid else 0, kept, q_d):
        return -1, int(d)
    f = fl.value
    if q is None:
        w = e.copy()
        if valid:
            w[d] = 0
        w = w if w.sum() else e
    else:
        w = np.empty_like(e)
        lib.h_residual_weights(w, e, np.ascontiguousarray(q, np.float32), vocab, kept)
        w = w if w.sum() else e
        f |= ref.ZERO_Q_DRAFT if valid and q_d == 0.0 else 0
    return lib.h_stop_key(a, f), draw(lib, w, u24(p_.seed, pos + a, Purpose.RESIDUAL))


def interleaving(rng, k: int) -> np.ndarray:
    """Starts (a) and ends (k + 1 + a) of positions 0..k in a random order, each start first, the
    starts roughly in position order as the grid dispatches them."""
    start = np.sort(rng.random(k + 1) * 0.3 + np.arange(k + 1) * rng.random())
    end = start + rng.random(k + 1) * 2.0
    t = np.concatenate([start, end])
    return np.argsort(t, kind="stable").astype(np.int32)


def emulate(lib, rng, x, params, pos, drafts, q, n_drafts):
    rows, n = drafts.shape
    n_acc = np.zeros(rows, np.int32)
    tokens = np.full((rows, n + 1), ref.PAD, np.int32)
    flags = np.zeros(rows, np.int32)
    skipped = 0
    for r in range(rows):
        k = lib.h_clamp_drafts(int(n if n_drafts is None else n_drafts[r]), n)
        keys = np.full(k + 1, -1, np.int32)
        toks = np.zeros(k + 1, np.int32)
        for a in range(k + 1):
            keys[a], toks[a] = position(lib, x[r, a], int(drafts[r, a]) if a < k else -1, a < k,
                                        None if q is None or a >= k else q[r, a], params[r], int(pos[r]), a)
        s = ctypes.c_int(0)
        word = lib.h_fold(k, keys, interleaving(rng, k), ctypes.byref(s))
        skipped += s.value
        at = lib.h_stop_at(word)
        n_acc[r], flags[r] = at, lib.h_stop_flags(word)
        tokens[r, :at + 1] = toks[:at + 1]
    return (n_acc, tokens, flags), skipped


@pytest.mark.parametrize("q_full", [False, True])
@pytest.mark.parametrize("n", [0, 1, 6, 15])
def test_parallel_positions_equal_the_sequential_walk(lib, n, q_full):
    rng = np.random.default_rng(100 * n + q_full)
    x, params, pos, drafts, q, n_drafts = make_case(rng, 40, n, 50, q_full)
    x[0, 0, 3] = np.nan                                    # non-finite rows end the walk, flag 1
    if n >= 2:
        x[1, 1, :] = -np.inf
        x[2, 1, 7] = np.inf
        if q is not None:
            q[3, 0, drafts[3, 0]] = 0.0                    # q(d) = 0: rejected, flag 2
    got, skipped = emulate(lib, rng, x, params, pos, drafts, q, n_drafts)
    want = ref.sample_token(x, params, pos, drafts, q, n_drafts)
    for g, w, name in zip(got, want, ("n_accepted", "tokens", "flags")):
        np.testing.assert_array_equal(g, w, err_msg=name)
    if n >= 6:
        assert skipped > 0                                 # the skip rule was exercised


def test_invalid_drafts_and_clamped_n_drafts(lib):
    """Device-only inputs: a draft outside [0, vocab) is rejected unread with flag 4 (greedy and
    stochastic alike), and n_drafts is clamped to [0, n]."""
    fl = ctypes.c_int(0)
    assert not lib.h_greedy_accepts(1, 50, 50, 3, ctypes.byref(fl)) and fl.value == 4
    assert not lib.h_greedy_accepts(1, -1, 50, 3, ctypes.byref(fl)) and fl.value == 4
    assert not lib.h_greedy_accepts(0, -1, 50, 3, ctypes.byref(fl)) and fl.value == 0
    assert lib.h_greedy_accepts(1, 3, 50, 3, ctypes.byref(fl)) and fl.value == 0
    assert [lib.h_clamp_drafts(k, 5) for k in (-3, 0, 4, 5, 9)] == [0, 0, 4, 5, 5]
    rng = np.random.default_rng(3)
    x = rng.normal(0, 2, (1, 4, 20)).astype(np.float32)
    drafts = np.array([[int(np.argmax(x[0, 0])), 99, 1]])
    keys = [position(lib, x[0, a], drafts[0, a] if a < 3 else -1, a < 3, None, GREEDY, 0, a)[0] for a in range(4)]
    assert keys[0] == -1 and keys[1] == lib.h_stop_key(1, 4)
