"""mma_st (Q4_K and Q6_K, staged int8 tensor cores) beside the table's buckets for 8..32 rows of x,
on the Qwen3-8B shapes of issue 3's M = 16 bar and its head: the table's M = 1 time, the table's
bucket and mma_kq at each M (and mma_dq for Q4_K), and mma_st at the rule's K splits and at each
forced split, the same weights and x for every arm, timed in a PDL graph as decode runs them
(bench_quant_matmul's timing: weights rotated past L2). The rule's mma_st is timed first and last in
each row, so that drift shows. Prints the ratio to M = 1 that the bar (<= 1.3x) counts.

    PYTHONPATH=$PWD python3 bench/ab_mma_st.py [--types Q4_K,Q6_K] [--ms 8,16,32] [--splits 1,2,4,8]
        [--shapes NxK,...] [--tma] [--out FILE.json]

Past 32 rows of x (--ms 33..64) the "mma_st rule" columns are the tensor-map kernel in two launches of
at most 32 rows each (from float x / on each part's images made before), which the table ran before its
one wide launch; the table's column is that wide launch, and the tensor-map shapes are wide launches.

--tma adds mma_st_tma_kernel (W by tensor-map boxes, a barrier a chunk) at its rule's splits
and at each forced split, in each block shape "RGxWK" it is compiled for (matmul.MMA_ST_TMA_SHAPES:
16 RG rows of W a block, WK warps a 16 rows), and each shape on x's images made before; --stages
2,4 adds each shape on those images with at most 2, 4 stages in its ring ("RGxWK sN").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.kernels import build  # noqa: E402
from glimmer_cupy.benchmarks.matmul_sets import m1_us, parse_shapes, weight_sets  # noqa: E402
from glimmer_cupy.benchmarks.timing import run_meta, time_us  # noqa: E402
from glimmer_cupy.kernels.launch import overlapped  # noqa: E402
from glimmer_cupy.ops import matmul  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType  # noqa: E402

SHAPES = ((4096, 4096), (12288, 4096), (4096, 12288), (24576, 4096), (151936, 4096))


def main(argv=None) -> int:
    import cupy
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--ms", default="8,16,32")
    ap.add_argument("--splits", default="1,2,4,8", help="comma-separated, each 1, 2, 4 or 8 (may be empty)")
    ap.add_argument("--shapes", default="", help="NxK,... (default: the Qwen3-8B shapes and head)")
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--define", action="append", default=[], metavar="NAME",
                    help="build every kernel with -DNAME (e.g. MMA_ST_NO_RELEASE), for an A/B between processes")
    ap.add_argument("--tma", action="store_true", help="also mma_st_tma_kernel (W by tensor-map boxes in chunks)")
    ap.add_argument("--stages", default="", help="comma-separated caps on the tensor-map kernel's ring, each timed "
                    "on x's images made before in every block shape (with --tma)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    build.add_defines(*a.define)
    ms = [int(v) for v in a.ms.split(",")]
    caps = [int(v) for v in a.stages.split(",") if v]
    splits = [int(v) for v in a.splits.split(",") if v]
    if not set(splits) <= {1, 2, 4, 8}:
        ap.error(f"--splits: each of 1, 2, 4, 8 (mma_st_kernel's clusters), got {a.splits}")
    shapes = parse_shapes(a.shapes, SHAPES)
    types = [QType[t] for t in a.types.split(",")]
    if not set(types) <= matmul.MMA_ST_TYPES:
        ap.error(f"--types: each of {', '.join(q.name for q in matmul.MMA_ST_TYPES)}, got {a.types}")
    rng = np.random.default_rng(11)
    rows = []
    for qtype, (n, k) in ((q, s) for q in types for s in shapes):
        ws = weight_sets(qtype, n, k, rng)
        sets = len(ws)
        m1 = m1_us(ws, rng, a.launches, a.reps)
        for m in ms:
            xs = [cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32)) for _ in range(sets)]
            outs = [cupy.empty((m, n), np.float32) for _ in range(sets)]

            def timed(call):
                with overlapped(True):
                    return time_us(lambda i: call(i), sets, a.launches, a.reps)[0]

            def bucket(b):
                return timed(lambda i: ops.quant_matmul(xs[i], ws[i], out=outs[i], force_bucket=b))

            wide = m > matmul.MMA_ST_ROWS

            def st(ks, tma=False, wk=1, rg=4, xst=None, stages=None):
                return timed(lambda i: matmul.mma_st(outs[i], xs[i], ws[i], splits=ks, tma=tma, wk=wk, rg=rg,
                                                     xst=None if xst is None else xst[i], stages=stages))

            def parts(i, xst=None):             # the tensor-map kernel a 32 rows (the table before its wide launch)
                for j, r0 in enumerate(range(0, m, matmul.MMA_ST_ROWS)):
                    r = slice(r0, r0 + matmul.MMA_ST_ROWS)
                    matmul.mma_st(outs[i][r], xs[i][r], ws[i], tma=True, xst=None if xst is None else xst[i][j])

            staged = [matmul.mma_st_stage(x) for x in xs]       # x's images made before, as codes are at M = 1
            if wide:
                staged_parts = [[matmul.mma_st_stage(x[r0:r0 + matmul.MMA_ST_ROWS])
                                 for r0 in range(0, m, matmul.MMA_ST_ROWS)] for x in xs]

            want = ops.quant_matmul(xs[0], ws[0], force_bucket="mma_kq")
            table = matmul.bucket(m, qtype, graph_safe=True)
            rule = (lambda: timed(parts)) if wide else (lambda: st(None))
            row = dict(type=qtype.name, n=n, k=k, m=m, m1_us=m1, rule_splits=matmul.mma_st_config(m, n, k, qtype)[1],
                       rule_us=[rule()], table=table, table_us=bucket(table), mma_kq_us=bucket("mma_kq"),
                       mma_dq_us=bucket("mma_dq") if qtype == QType.Q4_K and not wide else None, split_us={},
                       prestaged_us=timed(lambda i: parts(i, staged_parts) if wide else
                                          matmul.mma_st(outs[i], xs[i], ws[i], xst=staged[i])),
                       tma_splits=None, tma_us=None, tma_split_us={}, tma_staged_us={})
            if a.tma and matmul.mma_st_tma_serves(ws[0]):
                row["tma_splits"] = matmul.mma_st_config(m, n, k, qtype, True)[1]
                row["tma_us"] = st(None, True)
                got = cupy.empty((m, n), np.float32)
                matmul.mma_st(got, xs[0], ws[0], tma=True)
                row["tma_err"] = float(cupy.abs(got - want).max() / cupy.abs(want).max())
                for rg, wk in sorted(matmul.MMA_ST_TMA_SHAPES):
                    shape = f"{rg}x{wk}"
                    row["tma_staged_us"][shape] = st(None, True, wk, rg, staged)
                    for cap in caps:
                        if cap >= wk:
                            row["tma_staged_us"][f"{shape} s{cap}"] = st(None, True, wk, rg, staged, cap)
                    for ks in splits if not wide else ():
                        if ks <= k // 256 and matmul.mma_st_fits(-(-m // 8), k, ks, qtype, True, rg, wk):
                            row["tma_split_us"][f"{ks} {shape}"] = st(ks, True, wk, rg)
            for ks in splits if not wide else ():
                if ks > k // 256:
                    continue
                try:
                    t = st(ks)
                except Exception as e:          # a split whose stages do not fit: say so, go on
                    row["split_us"][ks] = (None, str(e).splitlines()[0])
                    continue
                got = cupy.empty((m, n), np.float32)
                matmul.mma_st(got, xs[0], ws[0], splits=ks)
                row["split_us"][ks] = (t, float(cupy.abs(got - want).max() / cupy.abs(want).max()))
            row["rule_us"].append(rule())
            rows.append(row)
            rule = min(row["rule_us"])
            print(f"{qtype.name} {n:>6}x{k:<6} M={m:<3} M=1 {m1:6.1f} us | table ({table}) {row['table_us']:6.1f} "
                  f"mma_kq {row['mma_kq_us']:6.1f} | mma_st rule (ks {row['rule_splits']}) {row['rule_us'][0]:6.1f} / "
                  f"{row['rule_us'][1]:6.1f} = {rule / m1:.2f}x M=1 | x staged before {row['prestaged_us']:6.1f} | "
                  + " ".join(f"ks {s}: {t:6.1f} ({e:.0e})" if t is not None else f"ks {s}: -"
                             for s, (t, e) in row["split_us"].items()), flush=True)
            if row["tma_us"] is not None:
                print(f"    tma rule (ks {row['tma_splits']}) {row['tma_us']:6.1f} = {row['tma_us'] / m1:.2f}x M=1 "
                      f"(err {row['tma_err']:.0e}) | " + " ".join(f"ks {s}: {t:6.1f}" for s, t in row["tma_split_us"].items())
                      + " | x staged before: " + " ".join(f"{s} {t:6.1f}" for s, t in row["tma_staged_us"].items()),
                      flush=True)
        ws = xs = outs = None           # this shape's buffers go before the next one's
        cupy.get_default_memory_pool().free_all_blocks()
    if a.out:
        a.out.write_text(json.dumps(dict(meta=run_meta(defines=a.define), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
