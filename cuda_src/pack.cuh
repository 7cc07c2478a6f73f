// pack.cuh — VEC values of storage type T moved as one load or store, and the float32 math the
// elementwise kernels do on them (T is float for now; to_f32 / from_f32 are where another storage
// type would convert).
#pragma once

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
    T v[N];
};

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ void from_f32(float v, float& out) { out = v; }
