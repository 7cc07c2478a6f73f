// xchg_probe.cu — what one all-gather between the blocks of a cluster costs, as a decoder layer run
// by one cluster would need after each of its matmuls (bench/probe_cluster_exchange.py).
//
// xchg_chain<MODE>: a cluster of C blocks runs `layers` x `nx` exchanges. In exchange e every block
// makes its slice (n_e / C floats) of a vector from the vector gathered in exchange e - 1 (so every
// exchange depends on every block's slice of the one before), then writes the slice into every
// block's shared memory at its rank's offset. Two buffers alternate, so an exchange never writes
// what a block may still read. How a block knows the vector is whole:
//   0  remote stores (st.shared::cluster), then the cluster barrier (arrive.release / wait.acquire);
//   1  st.async counted in bytes on the receiving block's mbarrier for that buffer: each block
//      expects n_e * 4 bytes and waits for them, with no barrier across the cluster.
// Mode 1 is safe with two buffers: a block sends exchange e + 1's slice only after it has read
// exchange e's vector, so when e + 2 is written into a buffer, its reader is past it.
// sizes: nx <= 8 vector lengths; out[rank * 2 + 0] = the last vector's sum (checked by the script), out[.. + 1] = ns the chain took.
//
// grid=(C,) block=(512,) cluster=(C,) dynamic shared memory 2 * max(n_e) * 4 bytes
#include "cluster.cuh"
#include "timer.cuh"

constexpr int kMaxX = 8;

template <int MODE>
__global__ void __launch_bounds__(512) xchg_chain(float* __restrict__ out, int layers, int nx, const int* __restrict__ sizes) {
    extern __shared__ __align__(16) float buf[];
    __shared__ unsigned long long bars[2];
    __shared__ int sz[kMaxX];
    if (threadIdx.x < kMaxX) sz[threadIdx.x] = threadIdx.x < nx ? sizes[threadIdx.x] : 0;
    __syncthreads();
    const unsigned C = cluster_size(), rank = cluster_rank();
    int nmax = 0;
    for (int e = 0; e < nx; ++e) nmax = max(nmax, sz[e]);
    float* vec[2] = {buf, buf + nmax};
    for (int i = threadIdx.x; i < 2 * nmax; i += blockDim.x) buf[i] = 1.f;
    if (MODE == 1 && threadIdx.x == 0) {
        mbar_init(&bars[0], 1);
        mbar_init(&bars[1], 1);
        fence_mbarrier_init();
    }
    cluster_sync();
    const unsigned long long t0 = global_ns();
    int prev_n = nmax, b = 0;
    unsigned uses[2] = {0u, 0u};
    for (int l = 0; l < layers; ++l) {
        for (int e = 0; e < nx; ++e, b ^= 1) {
            const int n = sz[e], sl = n / (int)C;       // n % (4 C) == 0 (the script checks)
            const float* src = vec[b ^ 1];
            float* dst = vec[b];
            if (MODE == 1 && threadIdx.x == 0) mbar_arrive_expect_tx(&bars[b], (unsigned)n * 4u);
            // a thread makes 4 consecutive values of the slice and sends them to every block
            const int packs = sl / 4;
            for (int w = threadIdx.x; w < packs * (int)C; w += blockDim.x) {
                const int p = w % packs, to = w / packs;
                float v[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int i = rank * sl + 4 * p + j;
                    v[j] = src[(i * 7 + l) % prev_n] * 0.5f + 0.25f;
                }
                const unsigned a = map_rank(smem_addr(dst + rank * sl + 4 * p), (unsigned)to);
                if (MODE == 0) {
                    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(a), "f"(v[0]), "f"(v[1]),
                                 "f"(v[2]), "f"(v[3]) : "memory");
                } else {
                    st_async<4>(a, v, map_rank(smem_addr(&bars[b]), (unsigned)to));
                }
            }
            if (MODE == 0) {
                cluster_sync();
            } else {
                mbar_wait_cluster(&bars[b], uses[b] & 1u);
                ++uses[b];
            }
            prev_n = n;
        }
    }
    const unsigned long long t1 = global_ns();
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f;
        for (int i = 0; i < prev_n; ++i) s += vec[b ^ 1][i];
        out[rank * 2] = s;
        out[rank * 2 + 1] = (float)(t1 - t0);
    }
    cluster_sync();                          // nobody leaves while another may still write to it
}

#ifdef GLIMMER_INSTANTIATE
template __global__ void xchg_chain<0>(float*, int, int, const int*);
template __global__ void xchg_chain<1>(float*, int, int, const int*);
#endif
