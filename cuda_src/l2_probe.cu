// l2_probe.cu — the rate at which the SMs read a buffer that L2 holds (bench/probe_l2_read.py): the
// ceiling for kernels that read the same bytes from many blocks, as the prefill attention reads a
// sequence's K/V tiles once for each block of query rows.
//
// l2_read<CP>  every thread reads 16-byte pieces of a buffer of n16 pieces (a power of two: the
//     piece index wraps with a mask), `total` pieces in all over the grid, grid-strided so that
//     each wave of loads touches consecutive lines. CP = false: ld.global.cg (cached in L2 only)
//     into registers, four loads in flight a thread, xor-folded and written once a thread so the
//     loads stay. CP = true: cp.async.cg into a 32 KB ring of shared memory a block, a slot a
//     group and eight groups in flight a thread, as the attention kernels copy K/V tiles.
//   grid=(blocks,) block=(256,)

template <bool CP>
__global__ void __launch_bounds__(256) l2_read(const uint4* __restrict__ buf, long long n16, long long total,
                                               unsigned* __restrict__ out) {
    const long long mask = n16 - 1, stride = (long long)gridDim.x * blockDim.x;
    const long long t0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    if constexpr (!CP) {
        long long i = t0;
        for (; i + 3 * stride < total; i += 4 * stride) {
            uint4 v[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const uint4* p = buf + ((i + k * stride) & mask);
                asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w) : "l"(p));
            }
#pragma unroll
            for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
        }
        for (; i < total; i += stride) {
            const uint4 v = buf[i & mask];
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    } else {
        __shared__ __align__(16) uint4 ring[8 * 256];      // 32 KB: a piece a thread for each group in flight
        int slot = 0, n = 0;
        for (long long i = t0; i < total; i += stride) {
            const unsigned dst = (unsigned)__cvta_generic_to_shared(&ring[slot * 256 + threadIdx.x]);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(buf + (i & mask)));
            asm volatile("cp.async.commit_group;");
            slot = (slot + 1) & 7;
            if (++n >= 8) asm volatile("cp.async.wait_group 7;");
        }
        asm volatile("cp.async.wait_group 0;");
        const uint4 v = ring[threadIdx.x];
        acc = v.x ^ v.y ^ v.z ^ v.w;
    }
    out[t0] = acc;
}

#ifdef GLIMMER_INSTANTIATE
template __global__ void l2_read<false>(const uint4*, long long, long long, unsigned*);
template __global__ void l2_read<true>(const uint4*, long long, long long, unsigned*);
#endif
