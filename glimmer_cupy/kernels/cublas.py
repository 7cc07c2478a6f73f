"""cuBLAS GEMM with bf16 inputs and float32 output, through CuPy's binding of cublasGemmEx.

cupy.matmul keeps the inputs' dtype for its output and has no bf16; the large-M matmul bucket
needs bf16 operands (Gemma's activations overflow fp16) on tensor cores with fp32 results.
"""

from __future__ import annotations

import numpy as np

CUDA_R_32F, CUDA_R_16BF = 0, 14                       # cudaDataType_t
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_POINTER_MODE_HOST = 0
CUBLAS_GEMM_DEFAULT = -1
_ONE = np.array(1.0, np.float32)
_ZERO = np.array(0.0, np.float32)


def gemm_bf16_nt(y, x16, w16) -> None:
    """y (m, n) float32 = x16 (m, k) @ w16 (n, k)^T; x16, w16 bf16 bits in uint16 arrays, all
    C-contiguous, on CuPy's current stream."""
    import cupy
    from cupy_backends.cuda.libs import cublas

    m, k = x16.shape
    n = w16.shape[0]
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    cublas.setPointerMode(handle, CUBLAS_POINTER_MODE_HOST)
    # column-major view: y^T (n x m) = w16 (k x n col-major, transposed) * x16^T (k x m col-major)
    cublas.gemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k,
                  _ONE.ctypes.data, w16.data.ptr, CUDA_R_16BF, k,
                  x16.data.ptr, CUDA_R_16BF, k,
                  _ZERO.ctypes.data, y.data.ptr, CUDA_R_32F, n,
                  cublas.CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
