// rope.cu — rotary position embedding, positions given per token.
//
//   rope_kernel<T, NEOX>  out[t, h, :] = x[t, h, :] with the first rot_dim features rotated by
//                         angle pos[t] * base^(-2i / rot_dim) for pair i; the rest copied.
//     NEOX=false ("normal", llama files): pairs (2i, 2i+1)
//     NEOX=true  (Qwen, Gemma):           pairs (i, i + rot_dim/2)
//
// Launch: grid=(T, gy) block=(tx, ty). threadIdx.x walks the head_dim/2 pairs (stride tx);
// threadIdx.y + ty * blockIdx.y walks the heads (stride ty * gy). A thread computes sin/cos of
// its pair once and applies it to every head it visits. Pair j >= rot_dim/2 is copied as the
// pass-through pair (2j, 2j+1) in both orderings. out may be x (each thread reads its two elements, then
// writes them), so the pointers are not __restrict__.
//
// Angles match the float64 reference: inv_freq = exp2(-(2i/rot_dim) * log2(base)) and
// pos * inv_freq in double, reduced to [-pi, pi] in double, then sincosf on the reduced float.
// In float32 alone the angle at position 1e5 would be off by ~1e-2 rad (one ulp of 1e5 is 8e-3);
// this way the error is ~1e-7 whatever the position.
//
// Explicit instantiations at the bottom under GLIMMER_INSTANTIATE (offline compiles only).
#include "pdl.cuh"

template <typename T>
__device__ __forceinline__ float to_f32(T v) { return (float)v; }
__device__ __forceinline__ void from_f32(float v, float& out) { out = v; }

template <typename T, bool NEOX>
__global__ void __launch_bounds__(1024) rope_kernel(
    T* out, const T* x, const int* __restrict__ positions,
    int heads, int head_dim, int rot_dim, double log2_base) {
    pdl_wait();
    const double TWO_PI = 6.283185307179586476925286766559;
    const int t = blockIdx.x;
    const int half_rot = rot_dim >> 1;
    const double pos = (double)positions[t];
    const long long tok = (long long)t * heads * head_dim;
    for (int j = threadIdx.x; j < (head_dim >> 1); j += blockDim.x) {
        if (j >= half_rot) {                  // pass-through pair: rot_dim + 2 (j - rot_dim/2) = 2j
            for (int h = blockIdx.y * blockDim.y + threadIdx.y; h < heads; h += gridDim.y * blockDim.y) {
                const long long base = tok + (long long)h * head_dim + 2 * j;
                const T a = x[base], b = x[base + 1];
                out[base] = a;
                out[base + 1] = b;
            }
            continue;
        }
        const double inv_freq = exp2(-(double)(2 * j) / (double)rot_dim * log2_base);
        double ang = pos * inv_freq;
        ang -= rint(ang * (1.0 / TWO_PI)) * TWO_PI;
        float s, c;
        sincosf((float)ang, &s, &c);
        const int i0 = NEOX ? j : 2 * j;
        const int i1 = NEOX ? j + half_rot : 2 * j + 1;
        for (int h = blockIdx.y * blockDim.y + threadIdx.y; h < heads; h += gridDim.y * blockDim.y) {
            const long long base = tok + (long long)h * head_dim;
            const float a = to_f32(x[base + i0]), b = to_f32(x[base + i1]);
            from_f32(a * c - b * s, out[base + i0]);
            from_f32(a * s + b * c, out[base + i1]);
        }
    }
}

#ifdef GLIMMER_INSTANTIATE
template __global__ void rope_kernel<float, false>(float*, const float*, const int*, int, int, int, double);
template __global__ void rope_kernel<float, true>(float*, const float*, const int*, int, int, int, double);
#endif
