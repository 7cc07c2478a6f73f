// activation.cu — gated activations and small elementwise ops, float32 math.
//
//   gated_kernel<Act, T, VEC, Q8>  gate_up (rows, 2F), gate first -> out (rows, F) = act(gate) * up;
//       Q8 (VEC = 4, float, F % 32 == 0): also out's int8 codes per 32 values (q8.cuh) for the
//       down projection's dp4a GEMV
//       ST (VEC = 4, float, F % 256 == 0): also out's images for mma_st (mma_st_stage.cuh) at xst,
//       st_rows = 8 n-tiles rows of them, the rows past `rows` (gridDim.x) zeros: a block's four
//       super-blocks staged by four warps from its values in shared memory
//       Act = Silu      g / (1 + exp(-g))
//       Act = GeluTanh  0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))   (Gemma's GELU)
//     grid=(rows, ceil(F / VEC / 256)) block=(256,)    rows on x: up to 2^31-1 tokens
//   unary_kernel<Op, T, VEC>   out = op(x, a) over n elements (any shape, contiguous)
//       Op = Softcap    a * tanh(x / a)
//       Op = Scale      x * a
//     grid=(min(ceil(n / VEC / 256), 4096),) block=(256,), grid-stride loop
//
// VEC=4: 16-byte loads and stores (the caller checks F % 4 == 0 / n % 4 == 0 and 16-byte
// aligned pointers), VEC=1 otherwise. expf / tanhf are the accurate library versions (no fast
// math): the references are float64 and the budgets are 1e-10. unary_kernel may run in place
// (out == x), so its pointers are not __restrict__.
//
// Explicit instantiations at the bottom under GLIMMER_INSTANTIATE (offline compiles only).

#include "mma_st_stage.cuh"
#include "q8.cuh"
#include "pdl.cuh"

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
    T v[N];
};

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ void from_f32(float v, float& out) { out = v; }

struct Silu {
    __device__ __forceinline__ static float apply(float g) { return g / (1.f + expf(-g)); }
};

struct GeluTanh {
    __device__ __forceinline__ static float apply(float g) {
        const float k = 0.7978845608028654f;            // sqrt(2 / pi)
        return 0.5f * g * (1.f + tanhf(k * (g + 0.044715f * g * g * g)));
    }
};

struct Softcap {
    __device__ __forceinline__ static float apply(float x, float cap) { return cap * tanhf(x / cap); }
};

struct Scale {
    __device__ __forceinline__ static float apply(float x, float s) { return x * s; }
};

template <class Act, typename T, int VEC, bool Q8, bool ST>
__global__ void __launch_bounds__(256) gated_kernel(
    T* __restrict__ out, const T* __restrict__ gate_up, int f, int* __restrict__ xq, float* __restrict__ xd,
    float* __restrict__ xs, unsigned char* __restrict__ xst, int st_rows) {
    pdl_release();                          // the down GEMV's weight loads overlap this kernel's wait
    pdl_wait();
    typedef Pack<T, VEC> PT;
    const int k = blockIdx.y * blockDim.x + threadIdx.x;       // pack index within the row
    const unsigned mask = Q8 ? __ballot_sync(0xffffffffu, k < f / VEC) : 0u;   // whole 32-value groups
    const long long row = blockIdx.x;
    auto pack = [&]() {
        const PT g = reinterpret_cast<const PT*>(gate_up + row * 2 * f)[k];
        const PT u = reinterpret_cast<const PT*>(gate_up + row * 2 * f + f)[k];
        PT o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) from_f32(Act::apply(to_f32(g.v[j])) * to_f32(u.v[j]), o.v[j]);
        reinterpret_cast<PT*>(out + row * f)[k] = o;
        if constexpr (Q8) q8_lane<4>(o.v, 4 * k, xq + row * (f / 4), xd + row * (f / 32), xs + row * (f / 32), mask);
        return o;
    };
    if constexpr (!ST) {
        if (k >= f / VEC) return;
        pack();
    } else {                                // every thread reaches the barrier
        __shared__ __align__(16) PT part[256];
        if (k < f / VEC) part[threadIdx.x] = pack();
        __syncthreads();
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sb = blockIdx.y * 4 + warp;
        if (warp < 4 && sb < f / 256) {
            const float* src = reinterpret_cast<const float*>(part) + 256 * warp + 8 * lane;
            const float v[8] = {src[0], src[1], src[2], src[3], src[4], src[5], src[6], src[7]};
            mst::stage_row_padded(xst, sb, v, (int)row, (int)gridDim.x, st_rows);
        }
    }
}

template <class Op, typename T, int VEC>
__global__ void __launch_bounds__(256) unary_kernel(T* out, const T* x, long long n, float a) {
    pdl_wait();
    typedef Pack<T, VEC> PT;
    const long long packs = n / VEC;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < packs;
         k += (long long)gridDim.x * blockDim.x) {
        const PT p = reinterpret_cast<const PT*>(x)[k];
        PT o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) from_f32(Op::apply(to_f32(p.v[j]), a), o.v[j]);
        reinterpret_cast<PT*>(out)[k] = o;
    }
}

#ifdef GLIMMER_INSTANTIATE
#define GATED(ACT, VEC, Q8, ST) \
    template __global__ void gated_kernel<ACT, float, VEC, Q8, ST>(float*, const float*, int, int*, float*, float*, \
                                                                   unsigned char*, int);
GATED(Silu, 1, false, false) GATED(Silu, 4, false, false) GATED(Silu, 4, true, false) GATED(Silu, 4, true, true)
GATED(GeluTanh, 1, false, false) GATED(GeluTanh, 4, false, false) GATED(GeluTanh, 4, true, false)
GATED(GeluTanh, 4, true, true)
template __global__ void unary_kernel<Softcap, float, 1>(float*, const float*, long long, float);
template __global__ void unary_kernel<Softcap, float, 4>(float*, const float*, long long, float);
template __global__ void unary_kernel<Scale, float, 1>(float*, const float*, long long, float);
template __global__ void unary_kernel<Scale, float, 4>(float*, const float*, long long, float);
#endif
