"""Does a GEMV read faster when its weights were asked into L2 while a latency-bound kernel ran?

A captured graph (PDL on) of L layers, each: a spin kernel of ~S us on the main stream (standing
in for attention), then a Q4_K GEMV at M = 1 over that layer's own matrix (L matrices, more than
L2 holds, so none stays from the replay before). Variants: no prefetch; the matrix asked into L2
from a side stream (ops.prefetch_l2) forked before the spin; the same fork with the matrix read by
a plain side-stream kernel instead (cupy sum: lines surely in L2); and no spin at all.

    PYTHONPATH=$PWD python3 bench/probe_l2_prefetch.py [--n 4096 --k 4096 --layers 40 --spin-us 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.kernels.launch import overlapped  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType, QuantTensor  # noqa: E402

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
extern "C" __global__ void touch(const uint4* p, long long n, unsigned* sink) {
    unsigned acc = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}
"""


def main() -> int:
    import cupy

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--spin-us", type=float, default=8.0)
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    row = args.k // 256 * 144
    ws = []
    for _ in range(args.layers):
        raw = rng.integers(0, 256, (args.n, row), dtype=np.uint8)
        raw.reshape(args.n, -1, 144)[:, :, :4] = [0, 0x20, 0, 0x20]     # d, dmin = 2^-7: finite sums
        ws.append(QuantTensor("w", QType.Q4_K, (args.n, args.k), raw).to_device())
    x = cupy.asarray(rng.standard_normal((1, args.k)).astype(np.float32))
    mod = cupy.RawModule(code=SPIN)
    spin, touch = mod.get_function("spin"), mod.get_function("touch")
    sink = cupy.zeros(1, cupy.uint32)
    xq = ops.rms_norm(x, cupy.ones(args.k, cupy.float32), 1e-6, q8=True)
    ys = [cupy.empty((1, args.n), cupy.float32) for _ in ws]
    clock = cupy.cuda.Device().attributes["ClockRate"] * 1e3             # Hz
    cycles = np.int64(args.spin_us * 1e-6 * clock)
    s = cupy.cuda.Stream(non_blocking=True)

    def body(mode: str):
        for w, y in zip(ws, ys):
            if mode == "prefetch":
                ops.prefetch_l2([w], w.nbytes)
            elif mode == "read":
                ops.prefetch_l2([w], 16)                                  # the fork, then a real read there
                side = ops.prefetch._side[cupy.cuda.get_current_stream().ptr][0]
                with side:
                    touch((264,), (256,), (w.data, np.int64(w.nbytes // 16), sink))
            if mode != "nospin":
                spin((1,), (32,), (cycles,))
            ops.quant_matmul(xq, w, out=y)
        ops.prefetch_join()

    print(f"# Q4_K {args.n}x{args.k} M=1, {args.layers} layers, spin {args.spin_us} us ({int(cycles)} cycles at "
          f"{clock / 1e9:.2f} GHz), {ws[0].nbytes / 1e6:.1f} MB a matrix")
    for mode in ("none", "prefetch", "read", "none", "nospin", "prefetch"):
        with s:
            s.begin_capture(cupy.cuda.runtime.streamCaptureModeRelaxed)
            with overlapped():
                body(mode)
            g = s.end_capture()
            g.launch(s)
            s.synchronize()
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            a.record(s)
            for _ in range(args.replays):
                g.launch(s)
            b.record(s)
            b.synchronize()
        us = cupy.cuda.get_elapsed_time(a, b) * 1e3 / args.replays / args.layers
        print(f"{mode:10s} {us:7.2f} us a layer (spin + GEMV)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
