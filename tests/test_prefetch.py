"""L2 prefetch from a side stream (ops/prefetch.py): a no-op on the host and outside static steps;
on the GPU it asks whole 16-byte units of the bytes given, in order and up to the budget, skips
arrays the bulk prefetch cannot take, and forks and rejoins inside a captured graph without
changing what the main stream computes."""

import numpy as np
import pytest

from glimmer_cupy import ops
from glimmer_cupy.kernels.launch import overlapped
from glimmer_cupy.weights.quant_tensor import QType, QuantTensor

gpu = pytest.mark.gpu


def _q8_tensor(rows: int, xp=np):
    data = np.zeros((rows, 34), np.uint8)            # Q8_0: 34 bytes a 32-value block
    t = QuantTensor("w", QType.Q8_0, (rows, 32), data)
    return t if xp is np else t.to_device()


def test_host_tensors_ask_nothing():
    with overlapped():
        assert ops.prefetch_l2([_q8_tensor(8)], 1 << 20) == 0
    ops.prefetch_join()                              # nothing pending: returns without touching a device


def test_outside_a_static_step_asks_nothing():
    assert ops.prefetch_l2([np.zeros(64, np.uint8)], 1 << 20) == 0
    assert ops.prefetch_l2([np.zeros(64, np.uint8)], 0) == 0


@gpu
def test_bytes_asked_in_order_up_to_the_budget():
    import cupy

    a = _q8_tensor(1001, cupy)                       # 34034 bytes: 34032 in whole 16-byte units
    b = cupy.zeros(100_003, cupy.uint8)
    odd = cupy.zeros(4096, cupy.uint8)[3:]           # not 16-byte aligned: skipped
    s = cupy.cuda.Stream(non_blocking=True)
    with s, overlapped():
        assert ops.prefetch_l2([a, b], 1 << 30) == 34032 + 100_000
        assert ops.prefetch_l2([a, b], 40_000) == 34032 + 5968
        assert ops.prefetch_l2([a, b], 20_000) == 20_000
        assert ops.prefetch_l2([odd, b], 64) == 64
        assert ops.prefetch_l2([a], 0) == 0
        ops.prefetch_join()
    s.synchronize()


@gpu
def test_a_captured_graph_forks_and_rejoins():
    import cupy

    rng = np.random.default_rng(7)
    x = cupy.asarray(rng.standard_normal(50_000).astype(np.float32))
    w = _q8_tensor(3000, cupy)
    y = cupy.full_like(x, np.nan)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture(cupy.cuda.runtime.streamCaptureModeRelaxed)
        with overlapped():
            cupy.multiply(x, 2.0, out=y)
            assert ops.prefetch_l2([w], 1 << 20) == w.nbytes // 16 * 16
            cupy.add(y, 1.0, out=y)
            ops.prefetch_join()                      # without it the capture could not end
        graph = s.end_capture()
        for _ in range(3):
            y.fill(np.nan)
            graph.launch(s)
            s.synchronize()
            np.testing.assert_array_equal(cupy.asnumpy(y), cupy.asnumpy(x) * 2 + 1)
