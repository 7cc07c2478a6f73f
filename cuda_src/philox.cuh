// philox.cuh — Philox4x32-10 and the uniform keyed by (seed, position, purpose, index).
//
// The same function as glimmer_cupy/reference/philox.py, bit for bit: key = (seed low 32 bits,
// seed high 32 bits), counter = (position, purpose, index, 0), and a uniform in [0, 1) is the
// first output word's top 24 bits times 2^-24 (exact in float32). No state: a number depends on
// its keys alone, so a token never depends on its batch and a graph replays with new counters.
//
// __host__ __device__ and free of headers, so a host harness (g++) checks it against NumPy on
// machines without a GPU (tests/test_sampling_gpu.py).
#pragma once

#if defined(__CUDACC__)
#define PHILOX_HD __host__ __device__ __forceinline__
#else
#define PHILOX_HD inline
#endif

namespace philox {

typedef unsigned int u32;
typedef unsigned long long u64;

struct U32x4 {
    u32 v[4];
};

// Random123's constants: the multipliers and the Weyl increments of the key.
constexpr u32 kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr u32 kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

PHILOX_HD U32x4 philox4x32_10(U32x4 c, u32 k0, u32 k1) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) {
            k0 += kW0;
            k1 += kW1;
        }
        const u64 p0 = (u64)kM0 * c.v[0];       // the compiler emits mul.lo / mul.hi on the device
        const u64 p1 = (u64)kM1 * c.v[2];
        const u32 hi0 = (u32)(p0 >> 32), lo0 = (u32)p0;
        const u32 hi1 = (u32)(p1 >> 32), lo1 = (u32)p1;
        U32x4 n;
        n.v[0] = hi1 ^ c.v[1] ^ k0;
        n.v[1] = lo1;
        n.v[2] = hi0 ^ c.v[3] ^ k1;
        n.v[3] = lo0;
        c = n;
    }
    return c;
}

// The top 24 bits of the first output word: the uniform is this times 2^-24.
PHILOX_HD u32 bits24(u64 seed, u32 position, u32 purpose, u32 index) {
    U32x4 c;
    c.v[0] = position;
    c.v[1] = purpose;
    c.v[2] = index;
    c.v[3] = 0u;
    return philox4x32_10(c, (u32)seed, (u32)(seed >> 32)).v[0] >> 8;
}

PHILOX_HD float uniform(u64 seed, u32 position, u32 purpose, u32 index) {
    return (float)bits24(seed, position, purpose, index) * 5.9604644775390625e-8f;   // 2^-24
}

// Purposes, as reference/philox.py's Purpose.
constexpr u32 kSample = 0u, kAccept = 1u, kResidual = 2u;

}  // namespace philox
