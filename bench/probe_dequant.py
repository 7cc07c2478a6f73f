"""Q6_K dequantization to bf16 (ops.dequantize, what dequant_cublas multiplies with cuBLAS):
dequant_lanes_kernel (eight lanes a super-block) against dequant_kernel (a thread a sub-block),
in GGUF and pair order, weights and outputs rotated past L2, arms alternated; bytes read plus
written against the same run's copy rate. Then quant_matmul at M rows of x (dequant_cublas) with
each kernel, beside cuBLAS fp16 on weights already decoded.

    python3 bench/probe_dequant.py [--shapes NxK,...] [--ms 512] [--rounds 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.benchmarks.matmul_sets import parse_shapes, weight_sets  # noqa: E402
from glimmer_cupy.benchmarks.timing import copy_bandwidth, eager_time_us, run_meta, time_us  # noqa: E402
from glimmer_cupy.ops import matmul  # noqa: E402
from glimmer_cupy.weights import q6k_pairs  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType  # noqa: E402

SHAPES = ((4096, 4096), (12288, 4096), (4096, 12288), (1024, 4096), (151936, 4096))
KERNELS = {"lanes": frozenset({QType.Q6_K}), "thread": frozenset()}


def main(argv=None) -> int:
    import cupy
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="", help="NxK,... (default: Qwen3-8B's Q6_K shapes)")
    ap.add_argument("--ms", default="512", help="rows of x for quant_matmul (empty: none)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    shapes = parse_shapes(a.shapes, SHAPES)
    ms = [int(v) for v in a.ms.split(",") if v]
    rng = np.random.default_rng(7)
    copy = copy_bandwidth()
    print(f"copy {copy / 1e12:.2f} TB/s (read + written)", flush=True)
    rows, ok = [], True
    for n, k in shapes:
        ws = weight_sets(QType.Q6_K, n, k, rng)
        orders = {"gguf": ws, "pairs": [q6k_pairs.repack(w) for w in ws]}
        outs = [cupy.empty((n, k), np.uint16) for _ in ws]
        moved = ws[0].data.nbytes + 2 * n * k
        got = {}
        times = {}
        for _ in range(a.rounds):
            for kname, types in KERNELS.items():
                matmul.DEQUANT_LANES_TYPES = types
                for oname, w in orders.items():
                    if (kname, oname) not in got:
                        got[kname, oname] = cupy.asnumpy(matmul.dequantize(w[0], bf16=True))
                    us = time_us(lambda i: matmul.dequantize(w[i], bf16=True, out=outs[i]), len(ws), a.launches, a.reps)[0]
                    times.setdefault(f"{kname} {oname}", []).append(us)
        same = all(np.array_equal(v, got["thread", "gguf"]) for v in got.values())
        ok &= same
        rows.append(dict(n=n, k=k, op="dequantize bf16", bytes=moved, bits_equal=same, us=times))
        line = " | ".join(f"{name} {min(v):7.1f} us ({moved / min(v) / 1e-6 / copy:4.0%})" for name, v in times.items())
        print(f"{n:>6}x{k:<6} dequantize bits {'same' if same else 'DIFFER'} | {line}", flush=True)
        for m in ms:
            x = cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32))
            y = cupy.empty((m, n), np.float32)
            mt = {}
            for _ in range(a.rounds):
                for kname, types in KERNELS.items():
                    matmul.DEQUANT_LANES_TYPES = types
                    w = orders["pairs"]
                    mt.setdefault(kname, []).append(
                        eager_time_us(lambda i: ops.quant_matmul(x, w[i], out=y), len(w), max(3, a.launches // 4), a.reps))
            w16 = matmul.dequantize(ws[0]).astype(np.float16)
            x16 = x.astype(np.float16)
            y16 = cupy.empty((m, n), np.float16)
            cublas = eager_time_us(lambda _: cupy.matmul(x16, w16.T, out=y16), 1, max(3, a.launches // 4), a.reps)
            rows.append(dict(n=n, k=k, m=m, op="quant_matmul", bucket=matmul.bucket(m, QType.Q6_K), us=mt,
                             cublas_fp16_us=cublas))
            line = " | ".join(f"{name} {min(v):7.1f} us ({min(v) / cublas:4.2f}x)" for name, v in mt.items())
            print(f"{n:>6}x{k:<6} M={m:<4} {rows[-1]['bucket']} | {line} | cuBLAS fp16 {cublas:.1f} us", flush=True)
    matmul.DEQUANT_LANES_TYPES = KERNELS["lanes"]
    if a.out:
        a.out.write_text(json.dumps(dict(meta=run_meta(copy_bytes_per_s=copy), rows=rows), indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
