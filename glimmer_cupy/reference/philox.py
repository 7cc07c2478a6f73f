"""Philox4x32-10, the counter-based generator behind every random choice.

A uniform is a pure function of (seed, position, purpose, index): no state advances, so a
request's tokens do not depend on which other requests shared its batch or on the order of
rows, and a captured CUDA graph replays with fresh numbers by changing its counters. The CUDA
kernels implement the same function bit for bit (cuda_src/philox.cuh).

Key = (seed low 32 bits, seed high 32 bits); counter = (position, purpose, index, 0).
A uniform in [0, 1) is the first output word's top 24 bits times 2^-24: exact in float32.
"""

from enum import IntEnum

import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
MASK32 = np.uint64(0xFFFFFFFF)


class Purpose(IntEnum):
    """Why a uniform is drawn; separate purposes never share numbers."""
    SAMPLE = 0          # categorical draw of the next token
    ACCEPT = 1          # speculative acceptance test of a drafted token
    RESIDUAL = 2        # draw from the residual distribution after a rejection
    DRAFT = 3           # a drafter's own draws, independent of the target's ACCEPT/RESIDUAL draws


def philox4x32_10(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """counter: (..., 4) uint32, key: (..., 2) uint32 -> (..., 4) uint32."""
    c = [np.asarray(counter[..., i], dtype=np.uint32).copy() for i in range(4)]
    k0 = np.asarray(key[..., 0], dtype=np.uint32).copy()
    k1 = np.asarray(key[..., 1], dtype=np.uint32).copy()
    with np.errstate(over="ignore"):
        for r in range(10):
            if r:
                k0 = k0 + W0
                k1 = k1 + W1
            p0 = M0 * c[0].astype(np.uint64)
            p1 = M1 * c[2].astype(np.uint64)
            hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), (p0 & MASK32).astype(np.uint32)
            hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), (p1 & MASK32).astype(np.uint32)
            c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return np.stack(c, axis=-1)


def uniform(seed, position, purpose, index=0) -> np.ndarray:
    """float32 uniforms in [0, 1), broadcast over the arguments (seeds are uint64)."""
    seed = np.asarray(seed, dtype=np.uint64)
    position, purpose, index = (np.asarray(a, dtype=np.int64) for a in (position, purpose, index))
    seed, position, purpose, index = np.broadcast_arrays(seed, position, purpose, index)
    key = np.stack([(seed & MASK32).astype(np.uint32), (seed >> np.uint64(32)).astype(np.uint32)], axis=-1)
    ctr = np.stack([position.astype(np.uint32), purpose.astype(np.uint32), index.astype(np.uint32),
                    np.zeros(position.shape, np.uint32)], axis=-1)
    word = philox4x32_10(ctr, key)[..., 0]
    return ((word >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)).astype(np.float32)
