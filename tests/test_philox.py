import numpy as np

from glimmer_cupy.reference.philox import Purpose, philox4x32_10, uniform

# Known-answer vectors of Philox4x32-10 published with Random123 (kat_vectors).
KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


def test_known_answers():
    for ctr, key, want in KAT:
        got = philox4x32_10(np.array(ctr, np.uint32), np.array(key, np.uint32))
        assert got.tolist() == want


def test_vectorised_matches_scalar():
    rng = np.random.default_rng(1)
    ctr = rng.integers(0, 2 ** 32, (37, 4), dtype=np.uint64).astype(np.uint32)
    key = rng.integers(0, 2 ** 32, (37, 2), dtype=np.uint64).astype(np.uint32)
    batch = philox4x32_10(ctr, key)
    for i in range(37):
        assert np.array_equal(batch[i], philox4x32_10(ctr[i], key[i]))


def test_uniform_is_a_function_of_its_keys():
    u = uniform(1234, np.arange(1000), Purpose.SAMPLE)
    assert u.dtype == np.float32 and np.all((u >= 0) & (u < 1))
    assert np.array_equal(u, uniform(1234, np.arange(1000), Purpose.SAMPLE))
    # different seed, purpose or high seed bits give different streams
    assert not np.array_equal(u, uniform(1235, np.arange(1000), Purpose.SAMPLE))
    assert not np.array_equal(u, uniform(1234, np.arange(1000), Purpose.ACCEPT))
    assert not np.array_equal(u, uniform(1234 + 2 ** 40, np.arange(1000), Purpose.SAMPLE))
    # 24-bit grid: u * 2^24 is an integer
    assert np.all((u * 2 ** 24) == np.floor(u * 2 ** 24))


def test_uniform_is_uniform():
    # Kolmogorov-Smirnov distance of 200k draws: false failure rate far below 1e-6 at 0.006
    u = np.sort(uniform(7, np.arange(200_000), Purpose.SAMPLE).astype(np.float64))
    ks = np.max(np.abs(u - np.arange(1, u.size + 1) / u.size))
    assert ks < 0.006
