"""Timing shared by the benchmarks: CUDA events around CUDA graphs, inputs rotated past L2,
and the device ceilings measured in the same run."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import numpy as np

L2_BYTES = 60 << 20
MAX_SETS = 16


def n_sets(set_bytes: int) -> int:
    """Copies of the inputs to rotate over so that L2 never holds the next launch's input."""
    return max(1, min(MAX_SETS, math.ceil(2 * L2_BYTES / max(set_bytes, 1))))


def graph_time_us(launch: Callable[[int], None], sets: int, launches: int, reps: int) -> float:
    """Median over `reps` of (time of a graph of `launches` calls) / launches, in microseconds."""
    import cupy
    # the inputs were made on other streams (the default one, say): a non-blocking stream does not
    # wait for them, so wait for the whole device before the first launch reads them
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(sets):                     # warm-up: compile, first touch
            launch(i)
        stream.synchronize()
        stream.begin_capture()
        try:
            for i in range(launches):
                launch(i % sets)
        except Exception:
            # end the broken capture, or every later device-wide call fails with "stream is capturing"
            with contextlib.suppress(Exception):
                stream.end_capture()
            raise
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


_SPIN = None


def _spin(us: float) -> None:
    """Hold the current stream busy for about `us` microseconds (one thread spinning on clock64),
    so that the host can queue the timed calls behind it and launch overhead drops out."""
    global _SPIN
    import cupy
    if _SPIN is None:
        _SPIN = cupy.RawKernel(r"""
extern "C" __global__ void spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}""", "spin")
    rate_khz = cupy.cuda.Device().attributes["ClockRate"]
    _SPIN((1,), (1,), (np.int64(us * rate_khz / 1e3),))


def eager_time_us(launch: Callable[[int], None], sets: int, launches: int, reps: int) -> float:
    """As graph_time_us, for work that cannot be captured (it allocates, or calls a library that does).
    A spin kernel ahead of each timed batch lets the host queue the whole batch first, so the
    events measure the device's time, not the host's launch rate."""
    import cupy
    cupy.cuda.Device().synchronize()          # inputs made on other streams must be complete
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(sets):
            launch(i)
        stream.synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for _ in range(reps):
            _spin(2000 + 200 * launches)
            start.record(stream)
            for i in range(launches):
                launch(i % sets)
            end.record(stream)
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / launches)
    return float(np.median(times))


def time_us(launch: Callable[[int], None], sets: int, launches: int, reps: int) -> tuple[float, str]:
    """Graph timing where the work can be captured, else eager: (microseconds, how). `how` is
    'graph', or 'eager (<why capture failed>)'."""
    import cupy
    try:
        return graph_time_us(launch, sets, launches, reps), "graph"
    except Exception as e:  # noqa: BLE001 — a library call that cannot be captured; any such error
        cupy.cuda.get_current_stream().synchronize()
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}" if str(e) else type(e).__name__
        return eager_time_us(launch, sets, max(3, launches // 10), reps), f"eager ({why})"


def run_meta(**extra) -> dict:
    """GPU (or `gpu=` given), date and commit of a benchmark run (GLIMMER_COMMIT where the tree has
    no .git), plus the ceilings or settings the caller measured."""
    import datetime
    import os
    import subprocess
    from pathlib import Path

    commit = os.environ.get("GLIMMER_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True,
                                    cwd=Path(__file__).parent).stdout.strip() or "unknown"
        except OSError:
            commit = "unknown"
    gpu = extra.pop("gpu", None) or device_name()      # a run on the NumPy path names itself
    return dict(gpu=gpu, date=datetime.date.today().isoformat(), commit=commit, **extra)


def write_results(out, meta: dict, rows: list, markdown: str) -> None:
    """OUT.json (meta and rows) and OUT.md (the table) of a benchmark run."""
    import json

    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    out.with_suffix(".md").write_text(markdown)


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
