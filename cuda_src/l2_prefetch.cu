// l2_prefetch.cu — ask a range of global memory into L2, for a later kernel that will read it.
//
// l2_prefetch_kernel(p, bytes, chunk, delay_ns)
//   p 16-byte aligned; each thread asks for one chunk of `chunk` bytes (a multiple of 16, below
//   1 MiB: the instruction takes the size in 16-byte units in 16 bits) with one bulk prefetch (the
//   SM's copy engine fetches it; no register or shared memory holds it), the last chunk cut to a
//   multiple of 16. delay_ns: each thread waits that long first.
//   grid = (ceil(bytes / (chunk * threads)),) block = (threads,), threads <= 32: few threads a block,
//   so that the chunks spread over many SMs' copy engines (a warp's bulk prefetches issue one
//   lane at a time)
//
// Why: a decode step's short kernels (attention, norms, the gated activation) wait on latency and
// leave DRAM idle for ~12 us a layer at Qwen3-8B's shapes, while the GEMVs after them stream
// weights at the DRAM's rate. Launched on a side stream beside those kernels (ops/prefetch.py),
// this moves the first bytes of the next GEMV's weights into L2 during the idle time. It reads no
// kernel's output (weights only), so it needs no pdl_wait; it writes nothing.

extern "C" __global__ void __launch_bounds__(32) l2_prefetch_kernel(const char* __restrict__ p, long long bytes,
                                                                   int chunk, int delay_ns) {
    const long long off = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * chunk;
    if (off >= bytes) return;
    const unsigned size = (unsigned)min((long long)chunk, bytes - off) & ~15u;
    if (size == 0) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (delay_ns > 0) __nanosleep(delay_ns);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(size) : "memory");
#endif
}
