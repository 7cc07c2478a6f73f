// norm.cu — RMSNorm over the last axis, optionally fused with the residual add.
//
//   rms_norm_kernel<T, VEC, Q8>      out = x / sqrt(mean(x^2) + eps) * weight
//   add_rms_norm_kernel<T, VEC, Q8>  residual += delta; out = rms_norm(residual) * weight
//   Q8 (VEC = 4, float, d % 32 == 0): also out's int8 codes per 32 values (xq, xd, xs, q8.cuh), the
//   input of the next dp4a GEMV, in the same pass.
//
// Launch (both): a row is handled by blockDim.x threads (a multiple of 32: one warp up to the
// whole block), blockDim.y rows per block, blockDim.x * blockDim.y <= 1024.
//   grid=(ceil(rows / blockDim.y),) block=(tx, ty)
// Wide rows (hidden sizes) get one block per row; narrow rows (per-head q/k norm over head_dim,
// the same kernel on a (T*heads, head_dim) view) get a warp or two per row and several rows per
// block. VEC=4: 16-byte loads and stores, for d % 4 == 0 with 16-byte aligned pointers (the
// caller checks); VEC=1 for everything else.
//
// The steps are norm_row.cuh's, which a GEMV's norm tail shares. x is read twice (sum, then
// scale): the second read hits L1/L2.
// T is the storage type of x / residual / delta / out (float for now); weight is float.
//
#include "norm_row.cuh"

// Explicit instantiations at the bottom under GLIMMER_INSTANTIATE, for offline compiles
// (tests/test_cuda_compile.py passes -DGLIMMER_INSTANTIATE); at run time the same names come
// from name_expressions in glimmer_cupy/ops/norm.py.

template <typename T, int VEC, bool Q8>
__global__ void __launch_bounds__(1024) rms_norm_kernel(
    T* __restrict__ out, const T* __restrict__ x, const float* __restrict__ weight,
    int rows, int d, float eps, int* __restrict__ xq, float* __restrict__ xd, float* __restrict__ xs) {
    typedef Pack<T, VEC> PT;
    typedef Pack<float, VEC> PF;
    __shared__ float red[32];
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const bool active = row < rows;
    const int nv = d / VEC;
    pdl_release();                          // the next GEMV's weight loads overlap this kernel's wait
    prefetch_weight<VEC>(weight, nv, threadIdx.x, blockDim.x);
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
    ss = row_sum(ss, red, threadIdx.x, blockDim.x, threadIdx.y);
    if (!active) return;
    const float inv = rsqrtf(ss / (float)d + eps);
    scale_row<T, VEC, Q8>(out + (long long)row * d, x + (long long)row * d, weight, inv, nv, threadIdx.x, blockDim.x,
                          xq + (long long)row * nv, xd + (long long)row * (d / 32), xs + (long long)row * (d / 32));
}

template <typename T, int VEC, bool Q8>
__global__ void __launch_bounds__(1024) add_rms_norm_kernel(
    T* __restrict__ out, T* __restrict__ residual, const T* __restrict__ delta,
    const float* __restrict__ weight, int rows, int d, float eps, int* __restrict__ xq, float* __restrict__ xd,
    float* __restrict__ xs) {
    typedef Pack<T, VEC> PT;
    __shared__ float red[32];
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const bool active = row < rows;
    const int nv = d / VEC;
    pdl_release();                          // the next GEMV's weight loads overlap this kernel's wait
    prefetch_weight<VEC>(weight, nv, threadIdx.x, blockDim.x);
    pdl_wait();
    PT* rr = reinterpret_cast<PT*>(residual + (long long)row * d);
    const PT* dr = reinterpret_cast<const PT*>(delta + (long long)row * d);
    float ss = 0.f;
    if (active) {
        for (int k = threadIdx.x; k < nv; k += blockDim.x) {
            const PT a = rr[k], b = dr[k];
            PT s;
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                from_f32(to_f32(a.v[j]) + to_f32(b.v[j]), s.v[j]);
                const float v = to_f32(s.v[j]);         // the stored (rounded) sum is what we norm
                ss += v * v;
            }
            rr[k] = s;
        }
    }
    ss = row_sum(ss, red, threadIdx.x, blockDim.x, threadIdx.y);
    if (!active) return;
    const float inv = rsqrtf(ss / (float)d + eps);
    // each thread re-reads exactly the elements it wrote above, so no barrier is needed
    scale_row<T, VEC, Q8>(out + (long long)row * d, residual + (long long)row * d, weight, inv, nv,
                          threadIdx.x, blockDim.x,
                          xq + (long long)row * nv, xd + (long long)row * (d / 32), xs + (long long)row * (d / 32));
}

#ifdef GLIMMER_INSTANTIATE
#define NORMS(VEC, Q8) \
    template __global__ void rms_norm_kernel<float, VEC, Q8>(float*, const float*, const float*, int, int, float, \
                                                             int*, float*, float*); \
    template __global__ void add_rms_norm_kernel<float, VEC, Q8>(float*, float*, const float*, const float*, int, \
                                                                 int, float, int*, float*, float*);
NORMS(1, false) NORMS(4, false) NORMS(4, true)
#endif
