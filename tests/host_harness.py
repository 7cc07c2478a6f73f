"""Build a C++ harness over header-only cuda_src code as a host shared library (ctypes).

The block-decoding traits and Philox are __host__ __device__ and include no headers, so the same
source the GPU runs is checked on the CPU against the NumPy oracle."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

CUDA_SRC = Path(__file__).resolve().parents[1] / "cuda_src"


def build_host_library(source: str, out_dir: Path, name: str) -> ctypes.CDLL:
    """Compile `source` (C++ including cuda_src headers) with g++, else nvcc; skip if neither."""
    src = out_dir / f"{name}.cpp"
    src.write_text(source)
    lib = out_dir / f"lib{name}.so"
    inc = f"-I{CUDA_SRC}"
    if shutil.which("g++"):
        cmd = ["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-Wall", "-Wno-unknown-pragmas", inc, str(src),
               "-o", str(lib)]
    elif shutil.which("nvcc"):
        cmd = ["nvcc", "-std=c++17", "-O1", "-shared", "-Xcompiler", "-fPIC", "-x", "cu", inc, str(src), "-o", str(lib)]
    else:
        pytest.skip("neither g++ nor nvcc to build the host harness")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"harness build failed:\n{proc.stdout}{proc.stderr}"
    return ctypes.CDLL(str(lib))


def aligned16(a: np.ndarray) -> np.ndarray:
    """a's bytes in a buffer of their own that starts at a 16-byte boundary, as a device tensor does
    (code that finds a Q6_K pair's layout from its address reads it so)."""
    buf = np.zeros(a.nbytes + 16, np.uint8)
    start = (-buf.ctypes.data) % 16
    out = buf[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out
