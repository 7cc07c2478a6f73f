// embed.cu — embedding lookup: rows of a GGUF-typed table, decoded to float32 and scaled; and
// the step's token ids taken from the previous step's samples on the device.
//
//   embed_kernel<QT, VEC4>  out[t, :] = decode(table row ids[t]) * scale
//   feed_tokens_kernel      ids[t] = sampled[feed[t]] where feed[t] >= 0, else unchanged
//
// QT is a block-traits struct of quant_blocks.cuh (gguf::Q4_K, gguf::F16, ...). The table is the
// raw GGUF bytes, row_bytes per row; ids are int32. An id outside [0, n_rows) cannot raise on
// the device (and the op must stay capturable in a CUDA graph), so its row is written as NaN.
//
// Launch: grid=(T, ceil(units / 128)) block=(128,); a unit is one 32-value sub-block for the
// quantized types (a thread decodes it with QT::sub_block and writes 128 bytes) and one value
// for the plain types (F32/F16/BF16, any width; coalesced loads and stores). VEC4 (quantized
// types only): the 32 values go out as eight 16-byte stores (out 16-byte aligned, checked by the
// caller); otherwise 32 scalar stores.
//
// feed_tokens_kernel: grid=(ceil(T / 128),) block=(128,). A decode step launched before the host
// has its predecessor's token reads it here (runtime/pipeline.py); feed is checked on the host.
//
// Explicit instantiations at the bottom under GLIMMER_INSTANTIATE (offline compiles only);
// the run-time names come from name_expressions in glimmer_cupy/ops/embed.py.

#include "quant_blocks.cuh"
#include "pdl.cuh"

template <class QT, bool VEC4>
__global__ void __launch_bounds__(128) embed_kernel(
    float* __restrict__ out, const unsigned char* __restrict__ table, const int* __restrict__ ids,
    int n_rows, int cols, long long row_bytes, float scale) {
    pdl_wait();
    const int t = blockIdx.x;
    const int id = ids[t];
    float* orow = out + (long long)t * cols;
    const int u = blockIdx.y * blockDim.x + threadIdx.x;
    if (id < 0 || id >= n_rows) {                       // no row to read: NaN marks the bad id
        const float nan = __int_as_float(0x7fc00000);
        for (int i = u; i < cols; i += gridDim.y * blockDim.x) orow[i] = nan;
        return;
    }
    const unsigned char* row = table + (long long)id * row_bytes;
    if constexpr (QT::kQuantized) {
        if (u >= cols / 32) return;
        float v[32];
        gguf::row_sub_block<QT>(row, u, v);
        float* dst = orow + 32 * u;
        if constexpr (VEC4) {
#pragma unroll
            for (int j = 0; j < 32; j += 4)
                *reinterpret_cast<float4*>(dst + j) =
                    make_float4(v[j] * scale, v[j + 1] * scale, v[j + 2] * scale, v[j + 3] * scale);
        } else {
#pragma unroll
            for (int j = 0; j < 32; ++j) dst[j] = v[j] * scale;
        }
    } else {
        for (int i = u; i < cols; i += gridDim.y * blockDim.x) orow[i] = gguf::row_value<QT>(row, i) * scale;
    }
}

__global__ void __launch_bounds__(128) feed_tokens_kernel(
    int* __restrict__ ids, const int* __restrict__ feed, const int* __restrict__ sampled, int n) {
    pdl_wait();                                         // sampled is an earlier step's output
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const int j = feed[t];
    if (j >= 0) ids[t] = sampled[j];
}

#ifdef GLIMMER_INSTANTIATE
#define GLIMMER_EMBED(QT, V) \
    template __global__ void embed_kernel<QT, V>(float*, const unsigned char*, const int*, int, int, long long, float);
GLIMMER_EMBED(gguf::F32, false)
GLIMMER_EMBED(gguf::F16, false)
GLIMMER_EMBED(gguf::BF16, false)
GLIMMER_EMBED(gguf::Q4_0, false) GLIMMER_EMBED(gguf::Q4_0, true)
GLIMMER_EMBED(gguf::Q4_1, false) GLIMMER_EMBED(gguf::Q4_1, true)
GLIMMER_EMBED(gguf::Q5_0, false) GLIMMER_EMBED(gguf::Q5_0, true)
GLIMMER_EMBED(gguf::Q5_1, false) GLIMMER_EMBED(gguf::Q5_1, true)
GLIMMER_EMBED(gguf::Q8_0, false) GLIMMER_EMBED(gguf::Q8_0, true)
GLIMMER_EMBED(gguf::Q2_K, false) GLIMMER_EMBED(gguf::Q2_K, true)
GLIMMER_EMBED(gguf::Q3_K, false) GLIMMER_EMBED(gguf::Q3_K, true)
GLIMMER_EMBED(gguf::Q4_K, false) GLIMMER_EMBED(gguf::Q4_K, true)
GLIMMER_EMBED(gguf::Q5_K, false) GLIMMER_EMBED(gguf::Q5_K, true)
GLIMMER_EMBED(gguf::Q6_K, false) GLIMMER_EMBED(gguf::Q6_K, true)
#undef GLIMMER_EMBED
#endif
