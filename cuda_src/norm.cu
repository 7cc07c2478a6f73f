// norm.cu — RMSNorm over the last axis, optionally fused with the residual add.
//
//   rms_norm_kernel<T, VEC, Q8>      out = x / sqrt(mean(x^2) + eps) * weight
//   add_rms_norm_kernel<T, VEC, Q8>  residual += delta; out = rms_norm(residual) * weight
//   Q8 (VEC = 4, float, d % 32 == 0): also out's int8 codes per 32 values (xq, xd, xs, q8.cuh), the
//   input of the next dp4a GEMV, in the same pass.
//   ST (VEC = 4, float, d a multiple of 256 and at least 1024, so one row a block): also out's images
//   for mma_st (mma_st_stage.cuh) at xst, st_rows = 8 n-tiles rows of them, the rows past `rows` zeros:
//   the stage launch of a matmul of 4..32 rows (q8.ST_ROWS) made here instead.
//
// Launch (both): a row is handled by blockDim.x threads (a multiple of 32: one warp up to the
// whole block), blockDim.y rows per block, blockDim.x * blockDim.y <= 1024.
//   grid=(ceil(rows / blockDim.y),) block=(tx, ty)
// Wide rows (hidden sizes) get one block per row; narrow rows (per-head q/k norm over head_dim,
// the same kernel on a (T*heads, head_dim) view) get a warp or two per row and several rows per
// block. VEC=4: 16-byte loads and stores, for d % 4 == 0 with 16-byte aligned pointers (the
// caller checks); VEC=1 for everything else.
//
// The sum of squares is float32 per thread, reduced by warp shuffles and then across the row's
// warps through shared memory. x is read twice (sum, then scale): the second read hits L1/L2.
// T is the storage type of x / residual / delta / out (float for now); weight is float.
//
#include "mma_st_stage.cuh"
#include "q8.cuh"
#include "pdl.cuh"

// Explicit instantiations at the bottom under GLIMMER_INSTANTIATE, for offline compiles
// (tests/test_cuda_compile.py passes -DGLIMMER_INSTANTIATE); at run time the same names come
// from name_expressions in glimmer_cupy/ops/norm.py.

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
    T v[N];
};

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ void from_f32(float v, float& out) { out = v; }

// Sum of `v` over the blockDim.x threads of this row (every thread of the block must call it).
__device__ __forceinline__ float row_sum(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warps_per_row = blockDim.x >> 5;
    if (warps_per_row == 1) return v;
    const int warp = (threadIdx.y * blockDim.x + threadIdx.x) >> 5;
    if ((threadIdx.x & 31) == 0) red[warp] = v;
    __syncthreads();
    const float* mine = red + threadIdx.y * warps_per_row;
    float s = 0.f;
    for (int w = 0; w < warps_per_row; ++w) s += mine[w];
    return s;
}

// The weight packs this thread scales by, into L1 before the kernel waits (pdl.cuh): they are read
// only after the row's sum, so their trip from memory would otherwise follow it.
template <int VEC>
__device__ __forceinline__ void prefetch_weight(const float* weight, int nv) {
    for (int k = threadIdx.x; k < nv; k += blockDim.x) prefetch_l1(weight + k * VEC);
}

// out pack k = p * inv * w; with Q8 also its codes; with ST also into srow (the row in shared
// memory, for stage_out_row). Every lane of the row's warps calls it the same number of times (act
// false past the row), so the Q8 shuffles see whole groups.
template <typename T, int VEC, bool Q8, bool ST = false>
__device__ __forceinline__ void scale_pack(T* __restrict__ orow, const Pack<T, VEC>& p, bool act, int k,
                                           const float* __restrict__ weight, float inv, int* xq, float* xd,
                                           float* xs, float* srow = nullptr) {
    typedef Pack<T, VEC> PT;
    typedef Pack<float, VEC> PF;
    const unsigned mask = Q8 ? __ballot_sync(0xffffffffu, act) : 0u;
    if (!act) return;
    const PF w = reinterpret_cast<const PF*>(weight)[k];
    PT o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) from_f32(to_f32(p.v[j]) * inv * w.v[j], o.v[j]);
    reinterpret_cast<PT*>(orow)[k] = o;
    if constexpr (ST) reinterpret_cast<PT*>(srow)[k] = o;
    if constexpr (Q8) q8_lane<4>(o.v, 4 * k, xq, xd, xs, mask);
}

// out row = x row * inv * w, pack by pack from packs `from` on, x read again
template <typename T, int VEC, bool Q8, bool ST = false>
__device__ __forceinline__ void scale_row(T* __restrict__ orow, const T* xrow, const float* __restrict__ weight,
                                          float inv, int nv, int* xq, float* xd, float* xs, int from = 0,
                                          float* srow = nullptr) {
    typedef Pack<T, VEC> PT;
    const PT* xr = reinterpret_cast<const PT*>(xrow);
    for (int base = from; base < nv; base += blockDim.x) {
        const int k = base + threadIdx.x;
        const bool act = k < nv;
        scale_pack<T, VEC, Q8, ST>(orow, act ? xr[k] : PT{}, act, k, weight, inv, xq, xd, xs, srow);
    }
}

// The block's row of out (srow: its copy in shared memory, written by the block's threads before the
// barrier) as mma_st's images: a warp a super-block; the blocks of rows r < st_rows - rows also write
// row rows + r's images as zeros.
__device__ __forceinline__ void stage_out_row(const float* srow, int row, int rows, int d, unsigned char* xst,
                                              int st_rows) {
    __syncthreads();
    const int lane = threadIdx.x & 31;
    for (int sb = threadIdx.x >> 5; sb < (d >> 8); sb += blockDim.x >> 5) {
        const float4* src = reinterpret_cast<const float4*>(srow + 256 * sb + 8 * lane);
        const float4 p = src[0], q = src[1];
        const float v[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
        mst::stage_row_padded(xst, sb, v, row, rows, st_rows);
    }
}

template <typename T, int VEC, bool Q8, bool ST>
__global__ void __launch_bounds__(1024) rms_norm_kernel(
    T* __restrict__ out, const T* __restrict__ x, const float* __restrict__ weight,
    int rows, int d, float eps, int* __restrict__ xq, float* __restrict__ xd, float* __restrict__ xs,
    unsigned char* __restrict__ xst, int st_rows) {
    typedef Pack<T, VEC> PT;
    typedef Pack<float, VEC> PF;
    __shared__ float red[32];
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const bool active = row < rows;
    const int nv = d / VEC;
    pdl_release();                          // the next GEMV's weight loads overlap this kernel's wait
    prefetch_weight<VEC>(weight, nv);
    pdl_wait();
    const PT* xr = reinterpret_cast<const PT*>(x + (long long)row * d);
    float ss = 0.f;
    if (active) {
        for (int k = threadIdx.x; k < nv; k += blockDim.x) {
            const PT p = xr[k];
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                const float v = to_f32(p.v[j]);
                ss += v * v;
            }
        }
    }
    ss = row_sum(ss, red);
    if (!active) return;
    const float inv = rsqrtf(ss / (float)d + eps);
    extern __shared__ __align__(16) float srow[];             // ST: the row (d floats of dynamic shared memory)
    scale_row<T, VEC, Q8, ST>(out + (long long)row * d, x + (long long)row * d, weight, inv, nv,
                              xq + (long long)row * nv, xd + (long long)row * (d / 32), xs + (long long)row * (d / 32),
                              0, srow);
    if constexpr (ST) stage_out_row(srow, row, rows, d, xst, st_rows);
}

template <typename T, int VEC, bool Q8, bool ST>
__global__ void __launch_bounds__(1024) add_rms_norm_kernel(
    T* __restrict__ out, T* __restrict__ residual, const T* __restrict__ delta,
    const float* __restrict__ weight, int rows, int d, float eps, int* __restrict__ xq, float* __restrict__ xd,
    float* __restrict__ xs, unsigned char* __restrict__ xst, int st_rows) {
    typedef Pack<T, VEC> PT;
    __shared__ float red[32];
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const bool active = row < rows;
    const int nv = d / VEC;
    pdl_release();                          // the next GEMV's weight loads overlap this kernel's wait
    prefetch_weight<VEC>(weight, nv);
    pdl_wait();
    PT* rr = reinterpret_cast<PT*>(residual + (long long)row * d);
    const PT* dr = reinterpret_cast<const PT*>(delta + (long long)row * d);
    // a thread's first KP sums stay in registers for the scaling (every model's hidden size is at
    // most KP packs a thread): re-reading them after the store would be another trip to L2
    constexpr int KP = 2;
    PT keep[KP] = {};
    float ss = 0.f;
    auto add = [&](int k) {
        const PT a = rr[k], b = dr[k];
        PT s;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            from_f32(to_f32(a.v[j]) + to_f32(b.v[j]), s.v[j]);
            const float v = to_f32(s.v[j]);             // the stored (rounded) sum is what we norm
            ss += v * v;
        }
        rr[k] = s;
        return s;
    };
    if (active) {
#pragma unroll
        for (int i = 0; i < KP; ++i) {
            const int k = threadIdx.x + i * blockDim.x;
            if (k < nv) keep[i] = add(k);
        }
        for (int k = threadIdx.x + KP * blockDim.x; k < nv; k += blockDim.x) add(k);
    }
    ss = row_sum(ss, red);
    if (!active) return;
    const float inv = rsqrtf(ss / (float)d + eps);
    T* orow = out + (long long)row * d;
    int* rq = xq + (long long)row * nv;
    float* rd = xd + (long long)row * (d / 32);
    float* rs = xs + (long long)row * (d / 32);
    extern __shared__ __align__(16) float srow[];             // ST: the row (d floats of dynamic shared memory)
#pragma unroll
    for (int i = 0; i < KP; ++i)
        if (i * (int)blockDim.x < nv) {                 // uniform over the row: whole Q8 groups
            const int k = threadIdx.x + i * blockDim.x;
            scale_pack<T, VEC, Q8, ST>(orow, keep[i], k < nv, k, weight, inv, rq, rd, rs, srow);
        }
    // past those, each thread re-reads exactly the elements it wrote above: no barrier is needed
    scale_row<T, VEC, Q8, ST>(orow, residual + (long long)row * d, weight, inv, nv, rq, rd, rs, KP * blockDim.x,
                              srow);
    if constexpr (ST) stage_out_row(srow, row, rows, d, xst, st_rows);
}

#ifdef GLIMMER_INSTANTIATE
#define NORMS(VEC, Q8, ST) \
    template __global__ void rms_norm_kernel<float, VEC, Q8, ST>(float*, const float*, const float*, int, int, \
                                                                 float, int*, float*, float*, unsigned char*, int); \
    template __global__ void add_rms_norm_kernel<float, VEC, Q8, ST>(float*, float*, const float*, const float*, \
                                                                     int, int, float, int*, float*, float*, \
                                                                     unsigned char*, int);
NORMS(1, false, false) NORMS(4, false, false) NORMS(4, true, false) NORMS(4, true, true)
#endif
