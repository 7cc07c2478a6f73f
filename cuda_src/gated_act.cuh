// gated_act.cuh — the activations of the gated FFN, float32 math, shared by the gated op
// (activation.cu) and the GEMV that makes its input itself (quant_matmul.cu): one definition, so
// both make the same bits.
//   Silu      g / (1 + exp(-g))
//   GeluTanh  0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))   (Gemma's GELU)
// expf / tanhf are the accurate library versions (no fast math): the references are float64.
#pragma once

struct Silu {
    __device__ __forceinline__ static float apply(float g) { return g / (1.f + expf(-g)); }
};

struct GeluTanh {
    __device__ __forceinline__ static float apply(float g) {
        const float k = 0.7978845608028654f;            // sqrt(2 / pi)
        return 0.5f * g * (1.f + tanhf(k * (g + 0.044715f * g * g * g)));
    }
};
