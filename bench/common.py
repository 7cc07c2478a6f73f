"""Timing shared by the benchmarks: CUDA events around CUDA graphs, inputs rotated past L2,
and the device ceilings measured in the same run."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

L2_BYTES = 60 << 20
MAX_SETS = 16


def n_sets(set_bytes: int) -> int:
    """Copies of the inputs to rotate over so that L2 never holds the next launch's input."""
    return max(1, min(MAX_SETS, math.ceil(2 * L2_BYTES / max(set_bytes, 1))))


def graph_time_us(launch: Callable[[int], None], sets: int, launches: int, reps: int) -> float:
    """Median over `reps` of (time of a graph of `launches` calls) / launches, in microseconds."""
    import cupy
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(sets):                     # warm-up: compile, first touch
            launch(i)
        stream.synchronize()
        stream.begin_capture()
        for i in range(launches):
            launch(i % sets)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for _ in range(reps):
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / launches)
    return float(np.median(times))


def eager_time_us(launch: Callable[[int], None], sets: int, launches: int, reps: int) -> float:
    """As graph_time_us, for work that cannot be captured (it allocates, or calls a library that does)."""
    import cupy
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(sets):
            launch(i)
        stream.synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for _ in range(reps):
            start.record(stream)
            for i in range(launches):
                launch(i % sets)
            end.record(stream)
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / launches)
    return float(np.median(times))


def time_us(launch: Callable[[int], None], sets: int, launches: int, reps: int) -> tuple[float, str]:
    """Graph timing where the work can be captured, else eager: (microseconds, 'graph' | 'eager')."""
    import cupy
    try:
        return graph_time_us(launch, sets, launches, reps), "graph"
    except Exception:                     # a library call that cannot be captured
        cupy.cuda.get_current_stream().synchronize()
        return eager_time_us(launch, sets, max(3, launches // 10), reps), "eager"


def device_name() -> str:
    import cupy
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else name


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy of nbytes, bytes read plus written per second (GPU.md: ~4.1 TB/s)."""
    import cupy
    src = cupy.ones(nbytes, dtype=np.uint8)
    dst = cupy.empty_like(src)

    def launch(_):
        dst.data.copy_from_device_async(src.data, nbytes, cupy.cuda.get_current_stream())
    us = eager_time_us(launch, 1, 5, reps)
    return 2 * nbytes / (us * 1e-6)


def cublas_fp16_flops(n: int = 4096, reps: int = 20) -> float:
    """Dense fp16 GEMM rate through cuBLAS (cupy.matmul) at n^3, FLOP/s."""
    import cupy
    a = cupy.random.standard_normal((n, n), dtype=np.float32).astype(np.float16)
    b = cupy.random.standard_normal((n, n), dtype=np.float32).astype(np.float16)
    c = cupy.empty((n, n), dtype=np.float16)
    us = eager_time_us(lambda _: cupy.matmul(a, b, out=c), 1, 5, reps)
    return 2 * n ** 3 / (us * 1e-6)
