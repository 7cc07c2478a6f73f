"""gemv_kq on the 151936x4096 heads at M = 1 with 2 and 4 rows per warp (ops/matmul.py's
KQ_HEAD_ROWS), Q6_K and Q4_K, each timed twice in turn in a PDL graph (µs, median of 20 graphs of
20 calls, two weight sets), with the best time's weight bytes per second and its fraction of the
copy bandwidth measured in the same run.

    PYTHONPATH=$PWD python3 bench/bench_kq_head_rows.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.ops.matmul as mm  # noqa: E402
from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.benchmarks.timing import copy_bandwidth, graph_time_us  # noqa: E402
from glimmer_cupy.kernels.launch import overlapped  # noqa: E402
from glimmer_cupy.ops.q8 import Q8Rows  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType, QuantTensor  # noqa: E402
from glimmer_cupy.weights.random_blocks import random_blocks  # noqa: E402

N, K = 151936, 4096


def main() -> int:
    import cupy
    rng = np.random.default_rng(0)
    copy_bw = copy_bandwidth()
    print(f"# copy {copy_bw / 1e12:.2f} TB/s")
    for q in (QType.Q6_K, QType.Q4_K):
        ws = [QuantTensor("w", q, (N, K), cupy.asarray(random_blocks(q, N, K, rng, 0.02))) for _ in range(2)]
        xs = [cupy.asarray(rng.normal(0, 1, (1, K)).astype(np.float32)) for _ in range(2)]
        xin = [Q8Rows(x, *mm.quantize_x(x, mm.TRAITS[q])) for x in xs]
        outs = [cupy.empty((1, N), np.float32) for _ in range(2)]
        times: dict[int, list[float]] = {}
        for rows in (2, 4, 2, 4):
            mm.KQ_HEAD_ROWS = {q: rows}
            with overlapped():
                times.setdefault(rows, []).append(
                    graph_time_us(lambda i: ops.quant_matmul(xin[i], ws[i], out=outs[i]), 2, 20, 20))
        for rows, ts in times.items():
            rate = ws[0].data.nbytes / min(ts) * 1e6
            print(f"{q.name} {rows} rows a warp: {', '.join(f'{t:.1f}' for t in ts)} us | best {rate / 1e12:.2f} TB/s "
                  f"({rate / copy_bw:.0%} of copy)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
