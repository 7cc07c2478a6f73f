"""gemv_kq at M = 1 on Q6_K rows as GGUF blocks against the same rows repacked into planes
(weights/q6k_planes.py, Lanes<Q6_KP>): the bits, and the time of each in a PDL graph with the
weights rotated past L2, arms alternated, with the copy rate of the same run.

    python3 bench/probe_q6k_planes.py [--shapes NxK,...] [--rows 2,4] [--rounds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.matmul_sets import weight_sets  # noqa: E402
from glimmer_cupy.benchmarks.timing import copy_bandwidth, run_meta, time_us  # noqa: E402
from glimmer_cupy.kernels.launch import overlapped  # noqa: E402
from glimmer_cupy.ops import matmul  # noqa: E402
from glimmer_cupy.ops.matmul import KQ_WARPS, TRAITS, kq_config, quantize_x  # noqa: E402
from glimmer_cupy.weights.q6k_planes import to_planes  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType  # noqa: E402

SHAPES = ((151936, 4096), (4096, 12288), (1024, 4096), (4096, 4096), (12288, 4096), (24576, 4096))


def main(argv=None) -> int:
    import cupy
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="", help="NxK,... (default: Qwen3-8B's Q6_K shapes and a few more)")
    ap.add_argument("--rows", default="", help="rows a warp to time besides the table's, e.g. 2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",") if s] or SHAPES
    extra_rows = [int(v) for v in a.rows.split(",") if v]
    rng = np.random.default_rng(5)
    copy = copy_bandwidth()
    print(f"copy {copy / 1e12:.2f} TB/s", flush=True)
    rows_out = []
    for n, k in shapes:
        if k % 2048:
            print(f"{n}x{k}: K is not a multiple of 2048 (planes need 16-byte aligned rows); skipped")
            continue
        ws = weight_sets(QType.Q6_K, n, k, rng)
        planes = [to_planes(w.data, n, k) for w in ws]
        row_bytes = np.int64(ws[0].data.nbytes // n)
        xs = [cupy.asarray(rng.normal(0, 1, (1, k)).astype(np.float32)) for _ in ws]
        codes = [quantize_x(x, TRAITS[QType.Q6_K]) for x in xs]
        outs = [cupy.empty((1, n), np.float32) for _ in ws]
        table_rows, ws_split = kq_config(1, n, k, QType.Q6_K)

        def launch(trait, rows, i, data):
            per_block = rows * KQ_WARPS // ws_split
            xq, xd, xsum = codes[i]
            matmul._kq_kernel(trait, 1, rows, ws_split)(((n + per_block - 1) // per_block,), (32 * KQ_WARPS,),
                                                       (outs[i], xq, xd, xsum, data, np.int32(n), np.int32(k),
                                                        row_bytes))

        arms = [(trait, r) for r in dict.fromkeys([table_rows, *extra_rows]) for trait in ("Q6_K", "Q6_KP")]
        want = None
        bits = {}
        for trait, r in arms:
            data = ws[0].data if trait == "Q6_K" else planes[0]
            launch(trait, r, 0, data)
            got = outs[0].copy()
            want = got if want is None else want
            bits[f"{trait} R={r}"] = bool(cupy.array_equal(got, want))
        times = {f"{t} R={r}": [] for t, r in arms}
        for _ in range(a.rounds):
            for trait, r in arms:
                sets = ws if trait == "Q6_K" else None
                with overlapped(True):
                    t = time_us(lambda i: launch(trait, r, i, sets[i].data if sets else planes[i]), len(ws),
                                a.launches, a.reps)[0]
                times[f"{trait} R={r}"].append(t)
        nbytes = ws[0].data.nbytes
        row = dict(n=n, k=k, ws=ws_split, table_rows=table_rows, bytes=nbytes, bits_equal=bits, us=times)
        rows_out.append(row)
        line = " | ".join(f"{name} {min(v):7.1f} us ({nbytes / min(v) / 1e-6 / copy:4.0%})" for name, v in times.items())
        print(f"{n:>6}x{k:<6} WS={ws_split} bits {'same' if all(bits.values()) else bits} | {line}", flush=True)
        for name, v in times.items():
            print(f"    {name}: " + " ".join(f"{t:.2f}" for t in v), flush=True)
    if a.out:
        a.out.write_text(json.dumps(dict(meta=run_meta(copy_bytes_per_s=copy), rows=rows_out), indent=1))
    return 0 if all(all(r["bits_equal"].values()) for r in rows_out) else 1


if __name__ == "__main__":
    sys.exit(main())
