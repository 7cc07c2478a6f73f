// bf16.cuh — float -> bfloat16 bits without cuda_bf16.h (NVRTC compiles these files with no headers).
#pragma once

// round to nearest even (finite inputs)
__device__ __forceinline__ unsigned short bf16_bits(float f) {
    const unsigned int b = __float_as_uint(f);
    return (unsigned short)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}
