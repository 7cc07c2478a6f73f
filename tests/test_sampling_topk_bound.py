"""The short top-k path of sample_rows (cuda_src/sampling_topk.cuh), its bound modelled in NumPy:
the ids of a row are split into groups the way the kernel's threads read them (chunk<C>, then
for_chunk's single loads at the ends and 16-byte loads between, g lanes to a group), the lower
edge tau of the k-th largest group maximum's radix bin (group_bound) bounds the row's k-th largest
logit from below, and the list {l >= tau} holds every id that top-k keeps. The GPU test (test_sampling_gpu.py) checks the kernel's tokens.
"""

import numpy as np
import pytest

THREADS = 1024
TOPK_FAST = 256


def group_lanes(c: int, k: int) -> int:
    g = 32
    while g > 1 and c * THREADS // g < 4 * k:
        g //= 2
    return g


def thread_of_ids(vocab: int, c: int) -> np.ndarray:
    """(block, thread) of each id, as chunk<C> and for_chunk assign them (row start 16-byte aligned)."""
    owner = np.empty((vocab, 2), np.int64)
    per = -(-vocab // c)
    for r in range(c):
        lo, hi = min(vocab, r * per), min(vocab, r * per + per)
        a = min(hi, lo + (4 - lo % 4) % 4)
        nv = (hi - a) // 4
        b = a + 4 * nv
        owner[lo:a] = np.stack([np.full(a - lo, r), np.arange(a - lo)], 1)
        owner[b:hi] = np.stack([np.full(hi - b, r), np.arange(hi - b)], 1)
        j = np.arange(4 * nv) // 4
        owner[a:b] = np.stack([np.full(4 * nv, r), j % THREADS], 1)
    return owner


def short_list(row: np.ndarray, k: int, c: int) -> tuple[float, np.ndarray]:
    g = group_lanes(c, k)
    per_block = THREADS // g
    owner = thread_of_ids(row.size, c)
    group = owner[:, 0] * per_block + owner[:, 1] // g
    gmax = np.full(c * per_block, -np.inf)
    np.maximum.at(gmax, group, row.astype(np.float64))
    gt = (gmax[None, :] > gmax[:, None]).sum(1)
    tau = bin_edge(gmax[gt < k].min())
    return tau, np.nonzero(row >= tau)[0]


def order_keys(v: np.ndarray) -> np.ndarray:
    """order_key (sampling_rows.cuh) of float32 values, as uint64 for comparisons."""
    u = (np.asarray(v, np.float32) + np.float32(0.0)).view(np.uint32).astype(np.uint64)
    return np.where(u & 0x80000000, ~u & 0xFFFFFFFF, u | 0x80000000)


def key_value(key: int) -> np.float32:
    """key_value (sampling_rows.cuh): the float32 whose order key is `key`."""
    bits = key & 0x7FFFFFFF if key & 0x80000000 else ~key & 0xFFFFFFFF
    return np.array(bits, np.uint32).view(np.float32)[()]


def bin_edge(v: float) -> np.float32:
    """group_bound's result for a k-th largest group maximum v: the least float32 whose order key
    has the top 16 bits of v's, -inf where those bits are a NaN's."""
    e = key_value(int(order_keys(v)[()]) & 0xFFFF0000)
    return np.float32(-np.inf) if np.isnan(e) else e


def bound_key_warp(gmax: np.ndarray, k: int) -> int:
    """bound_key_warp (sampling_topk.cuh) step by step: the largest T with 16 low zero bits and at
    least k keys >= T, from the keys' common leading bits, then two bits a step down to bit 16."""
    keys = order_keys(gmax)
    hi, lo = int(keys.max()), int(keys.min())
    same = 32 - (hi ^ lo).bit_length()
    bit = 31 - same
    t = hi & 0xFFFF0000 if same >= 16 else hi & ~(0xFFFFFFFF >> same) & 0xFFFFFFFF
    count = lambda cand: int((keys >= cand).sum())      # noqa: E731
    while bit >= 17:
        c1, c2, c3 = (t | m << (bit - 1) for m in (1, 2, 3))
        t = c3 if count(c3) >= k else c2 if count(c2) >= k else c1 if count(c1) >= k else t
        bit -= 2
    if bit == 16 and count(t | 0x10000) >= k:
        t |= 0x10000
    return t


@pytest.mark.parametrize("groups", [1, 50, 200, 256])
def test_the_warps_bit_search_finds_the_bin_edge(groups):
    rng = np.random.default_rng(groups)
    for gmax in (rng.normal(0, 3, groups), np.round(rng.normal(0, 3, groups)), -np.abs(rng.normal(0, 3, groups)),
                 np.where(rng.random(groups) < 0.5, -np.inf, rng.normal(0, 3, groups)), np.full(groups, 2.5),
                 np.full(groups, -np.inf), rng.normal(1000, 0.001, groups), rng.normal(0, 1e-30, groups)):
        gmax = gmax.astype(np.float32)
        for k in range(1, groups + 1, max(1, groups // 7)):
            kth = np.sort(gmax)[::-1][k - 1]
            t = bound_key_warp(gmax, k)
            assert t == int(order_keys(kth)[()]) & 0xFFFF0000
            e = key_value(t)
            assert (np.isnan(e) and bin_edge(kth) == -np.inf) or e == bin_edge(kth)


def test_the_bin_edge_bounds_from_below_within_its_binade():
    rng = np.random.default_rng(3)
    for v in np.concatenate([rng.normal(0, 3, 1000), [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 1e-40, -1e-40]]):
        e = bin_edge(v)
        assert e <= np.float32(v)
        if np.isfinite(v) and abs(v) >= np.finfo(np.float32).tiny:     # normal: the bin is 2^-7 of a binade
            assert np.float32(v) - e <= 2.0 ** (np.floor(np.log2(abs(v))) - 7) * 1.0000001
    assert bin_edge(-np.inf) == -np.inf


def rows(rng, vocab: int):
    yield rng.normal(0, 3, vocab)
    yield np.round(rng.normal(0, 3, vocab))                 # ties everywhere
    yield np.sort(rng.normal(0, 3, vocab))                  # the largest all in the last chunk
    x = rng.normal(0, 3, vocab)
    x[rng.integers(0, vocab, vocab // 2)] = -np.inf          # masked ids
    yield x
    x = np.full(vocab, -np.inf)
    x[rng.integers(0, vocab, 3)] = 2.0                      # fewer finite ids than k
    yield x


@pytest.mark.parametrize("c", [1, 2, 4, 8])
def test_the_list_holds_every_id_top_k_keeps(c):
    rng = np.random.default_rng(c)
    for vocab in (7, 1001, 49152, 151936):
        for row in rows(rng, vocab):
            row = row.astype(np.float32)
            for k in (1, 2, 50, 255, TOPK_FAST):
                if k >= vocab:
                    continue
                tau, ids = short_list(row, k, c)
                kth = np.partition(row, vocab - k)[vocab - k]
                assert tau <= kth
                kept = np.nonzero(row >= kth)[0]
                assert np.isin(kept, ids).all()
                listed = row[ids]                           # the list's own k-th largest is the row's
                assert np.partition(listed, listed.size - k)[listed.size - k] == kth


def test_the_list_is_short_on_iid_logits():
    """About 1.2k entries for k = 50 over N(0, 9) logits: the list fits one block's kTopkList."""
    rng = np.random.default_rng(9)
    for c, vocab in ((8, 151936), (2, 151936), (1, 262144), (8, 49152)):
        sizes = [short_list(rng.normal(0, 3, vocab).astype(np.float32), 50, c)[1].size for _ in range(4)]
        assert max(sizes) < 200, (c, vocab, sizes)
