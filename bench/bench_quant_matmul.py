"""Time quant_matmul on the GPU: every bucket, Qwen3-8B shapes, against the copy ceiling and cuBLAS.

For each quant type, shape (N x K) and M: the time of one call (CUDA graph of many calls for the
GEMV bucket, eager calls for the bucket that allocates its scratch; weights rotated so L2 never
holds the next call's), weight bytes read per second and its fraction of the device-to-device copy
bandwidth measured in this run, TFLOP/s, and cuBLAS fp16 (cupy.matmul) on weights dequantized to
fp16 beforehand as the baseline beside it. Results: JSON and a markdown table.

    PYTHONPATH=$PWD python3 bench/bench_quant_matmul.py --out bench/results/quant_matmul

--pdl times the graph with programmatic dependent launch (kernels/launch.py overlapped()), so
consecutive calls overlap as a decode step's kernels do; --no-baselines skips cuBLAS, the other
bucket and float x (a quicker sweep); --shapes picks NxK shapes:

    PYTHONPATH=$PWD python3 bench/bench_quant_matmul.py --pdl --no-baselines --types Q4_K --ms 1 \
        --shapes 4096x4096,151936x4096
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.timing import copy_bandwidth, cublas_fp16_flops, n_sets, run_meta, time_us, write_results  # noqa: E402
from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.kernels.launch import overlapped  # noqa: E402
from glimmer_cupy.ops import matmul  # noqa: E402
from glimmer_cupy.ops.matmul import (DOT_TYPES, INT8_BUCKETS, KQ_TYPES, TRAITS, bucket, dequantize,  # noqa: E402
                                     mma_st_stage, quantize_x, serves)
from glimmer_cupy.ops.q8 import Q8Rows  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType, QuantTensor  # noqa: E402
from glimmer_cupy.weights.q6k_pairs import repack  # noqa: E402
from glimmer_cupy.weights.random_blocks import random_blocks  # noqa: E402

# Qwen3-8B: q/o (4096x4096), gate+up joined (2 x 12288 rows, timed as 12288 as the issue states),
# down (4096 x 12288), head (151936 x 4096)
SHAPES = [(4096, 4096), (12288, 4096), (4096, 12288), (151936, 4096)]
TYPES = [QType.Q4_K, QType.Q6_K]
EXTRA = [(QType.Q4_0, (4096, 4096)), (QType.Q4_1, (4096, 4096)), (QType.Q5_0, (4096, 4096)),
         (QType.Q8_0, (4096, 4096)), (QType.F16, (4096, 4096))]
MS = (1, 2, 4, 8, 16, 17, 32, 64, 65, 512)


def run_case(q: QType, n: int, k: int, ms, rng, launches: int, reps: int, copy_bw: float,
             alt_bucket: str | None = None, baselines: bool = True, pdl: bool = False, q6k_pairs: bool = True):
    import cupy
    # Q6_K matrices in pair order, as the CUDA executor uploads them, unless --q6k-order gguf
    order = repack if q6k_pairs else (lambda w: w)
    host = QuantTensor("w", q, (n, k), random_blocks(q, n, k, rng, 0.02))
    sets = n_sets(host.nbytes)
    ws = [order(QuantTensor("w", q, (n, k), cupy.asarray(random_blocks(q, n, k, rng, 0.02)))) for _ in range(sets)]
    # the baseline: the same weights dequantized to fp16 beforehand (more copies to rotate)
    w16 = [dequantize(ws[i % sets]).astype(np.float16) for i in range(n_sets(n * k * 2))] if baselines else []
    head = min(n, 2048)                          # rows checked against gguf's dequantizer
    w_ref = QuantTensor("w", q, (head, k), np.asarray(host.data)[:head]).dequantize(np.float64)
    host_first = order(QuantTensor("w", q, (n, k), cupy.asarray(host.data)))
    rows = []
    for m in ms:
        xs = [cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32)) for _ in range(sets)]
        outs = [cupy.empty((m, n), np.float32) for _ in range(sets)]
        # check once: the first rows of x and W against float64 math on gguf's dequantized values
        got = cupy.asnumpy(ops.quant_matmul(xs[0], host_first, out=outs[0]))[:8, :head]
        ref = cupy.asnumpy(xs[0][:8]).astype(np.float64) @ w_ref.T
        err = float(np.mean((got - ref) ** 2) / np.mean(ref ** 2))
        b = bucket(m, q)
        # the int8 buckets read x's codes, which in the model the op before the matmul makes
        # (ops/q8.py); timed that way, and again from float x (a quantize_x launch first)
        codes = [Q8Rows(x, *quantize_x(x, TRAITS[q])) for x in xs] if q in DOT_TYPES else None
        # mma_st reads x's images per 256 values, which the norms make beside the codes (ops/q8.py)
        if b == "mma_st" and codes:
            codes = [c._replace(st=mma_st_stage(c.x)) for c in codes]
        made = b in INT8_BUCKETS or (b == "mma_st" and codes is not None)
        xin = codes if made else xs
        with overlapped(pdl):
            us, how = time_us(lambda i: ops.quant_matmul(xin[i], ws[i], out=outs[i]), sets, launches, reps)
            float_us = time_us(lambda i: ops.quant_matmul(xs[i], ws[i], out=outs[i]), sets, launches,
                               reps)[0] if made and baselines else None
        # the other bucket at the edge Ms, to place the edge by measurement
        # (gemv_kq: the generic int8 GEMV at every M, the kernel it replaced)
        alt = {"gemv_kq": "gemv_dp4a", "gemv_dp4a": "mma", "gemv": "mma", "mma": "dequant_cublas",
               "dequant_cublas": "mma", "mma_kq": "gemv_kq",
               "mma_dq": "mma_kq", "mma_st": "mma_kq", "mma_wg": "dequant_cublas"}[b] if m in (8, 16, 17, 64, 512) or b == "gemv_kq" else None
        if alt_bucket:                           # --alt: this bucket beside the table's, where it serves
            alt = alt_bucket if alt_bucket != b else alt
        alt = alt if alt and serves(alt, q, m) and (baselines or alt_bucket) else None
        with overlapped(pdl):
            alt_us = time_us(lambda i: ops.quant_matmul(codes[i] if alt in INT8_BUCKETS else xs[i], ws[i], out=outs[i],
                                                    force_bucket=alt), sets,
                         launches, reps)[0] if alt else None
        x16 = [x.astype(np.float16) for x in xs[:len(w16)]]
        o16 = [cupy.empty((m, n), np.float16) for _ in range(len(w16))]
        us16, how16 = time_us(lambda i: cupy.matmul(x16[i], w16[i].T, out=o16[i]), len(w16), launches,
                              reps) if baselines else (float("nan"), "skipped")
        wbytes = host.nbytes
        row = dict(type=q.name, n=n, k=k, m=m, bucket=b, us=us, weight_gbps=wbytes / us / 1e3,
                   of_copy=wbytes / us / 1e3 / (copy_bw / 1e9), tflops=2 * m * n * k / us / 1e6,
                   cublas_fp16_us=us16, vs_m1=None, nmse=err, alt_bucket=alt, alt_us=alt_us, timing=how,
                   float_x_us=float_us, pdl=pdl,
                   cublas_timing=how16)
        rows.append(row)
        print(f"quant_matmul {q.name:5s} M={m:<4d} N={n:<6d} K={k:<5d} | {us:8.1f} us | "
              f"{row['weight_gbps'] / 1e3:5.2f} TB/s ({100 * row['of_copy']:3.0f}% of copy) | "
              f"{row['tflops']:6.1f} TFLOP/s | cuBLAS f16: {us16:8.1f} us ({how16}) | {b} ({how}) | NMSE {err:.1e}"
              + (f" | {alt}: {alt_us:.1f} us" if alt else "")
              + (f" | from float x: {float_us:.1f} us" if float_us else ""), flush=True)
        del xs, xin, codes, outs, x16, o16
    base = rows[0]["us"]
    for r in rows:
        r["vs_m1"] = r["us"] / base
    del ws, w16, host_first
    cupy.get_default_memory_pool().free_all_blocks()
    return rows


def markdown(meta, rows) -> str:
    lines = [f"# quant_matmul — {meta['gpu']}, {meta['date']}, commit {meta['commit']}", "",
             f"Copy bandwidth (D2D 1 GiB, read+write): {meta['copy_tbps']:.2f} TB/s; "
             f"cuBLAS fp16 4096³: {meta['cublas_tflops']:.0f} TFLOP/s (both measured in this run).", "",
             "Timing: CUDA graph where the work can be captured; cuBLAS cannot be (CuPy refuses cuBLAS calls"
             " during capture), so those rows queue eagerly behind a spin kernel and time the device only.", "",
             "int8 buckets (gemv_kq, gemv_dp4a, mma_kq) are timed on x with its int8 codes made beforehand, as the"
             " model calls them; 'from float x' adds the quantize_x launch. mma_st likewise on x's images per 256"
             " values made beforehand, as the norms and gated activations make them (attention, for the o projection,"
             " does not yet);"
             " 'from float x' adds its stage launch."
             + (" Launched with programmatic dependent launch (--pdl): consecutive calls overlap as a decode"
                " step's kernels do." if any(r.get("pdl") for r in rows) else ""), "",
             "gemv_kq compiled for B blocks per SM (gemv_kq_occ_kernel) at: "
             + (", ".join(f"{k} B={b}" for k, b in meta.get("kq_occupancy", {}).items()) or "none")
             + (f"; {meta['kq_rows_m1']} rows a warp at M = 1 everywhere (--kq-rows)" if meta.get("kq_rows_m1") else
                "") + ". Q6_K matrices in " + ("pair order, as the CUDA executor uploads them (weights/q6k_pairs.py)."
                                              if meta.get("q6k_order", "pairs") == "pairs" else "GGUF order."), "",
             "| type | N | K | M | bucket | µs | weight TB/s | of copy | TFLOP/s | ×M=1 | cuBLAS f16 µs | other bucket µs "
             "| from float x µs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['type']} | {r['n']} | {r['k']} | {r['m']} | {r['bucket']} | {r['us']:.1f} | "
                     f"{r['weight_gbps'] / 1e3:.2f} | {100 * r['of_copy']:.0f}% | {r['tflops']:.1f} | "
                     f"{r['vs_m1']:.2f} | {r['cublas_fp16_us']:.1f} | "
                     + (f"{r['alt_bucket']}: {r['alt_us']:.1f} |" if r.get("alt_bucket") else "|")
                     + (f" {r['float_x_us']:.1f} |" if r.get("float_x_us") else " |"))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--launches", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="only M=1 and the Q4_K layer shapes")
    ap.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    ap.add_argument("--types", default="", help="comma-separated types to run (default: all)")
    ap.add_argument("--ms", default="", help="comma-separated M values (default: the sweep)")
    ap.add_argument("--alt", default="", help="time this bucket beside the table's at every M it serves")
    ap.add_argument("--pdl", action="store_true", help="time with programmatic dependent launch, as decode runs")
    ap.add_argument("--no-baselines", action="store_true",
                    help="skip cuBLAS, the other bucket (unless --alt names it) and float x")
    ap.add_argument("--shapes", default="", help="comma-separated NxK shapes (default: the sweep)")
    ap.add_argument("--kq-occupancy", type=int, default=None, metavar="B",
                    help="gemv_kq at M = 1 and 2 compiled for B blocks per SM (0: the plain kernel) instead of "
                         "ops/matmul.py's KQ_OCCUPANCY table")
    ap.add_argument("--kq-rows", type=int, default=None, choices=(1, 2, 4), metavar="R",
                    help="gemv_kq at M = 1 with R rows of W a warp on every matrix, heads included, instead of "
                         "ops/matmul.py's KQ_ROWS / KQ_M1_ROWS (the launch-bound kernel serves 2 rows only)")
    ap.add_argument("--q6k-order", choices=("pairs", "gguf"), default="pairs",
                    help="Q6_K matrices in pair order, as the CUDA executor uploads them (weights/q6k_pairs.py), "
                         "or in the file's order")
    args = ap.parse_args(argv)
    if args.kq_rows is not None:
        matmul.KQ_ROWS = ((1, args.kq_rows),) + tuple(matmul.KQ_ROWS)
        matmul.KQ_M1_ROWS = {}
    if args.kq_occupancy is not None:
        matmul.KQ_OCCUPANCY = {(q, m): args.kq_occupancy for q in KQ_TYPES for m in (1, 2)} if args.kq_occupancy else {}
        matmul.KQ_OCC_WEIGHTS = 1 << 62                     # every matrix, heads included
    rng = np.random.default_rng(0)
    copy_bw = copy_bandwidth()
    flops = cublas_fp16_flops()
    meta = run_meta(copy_tbps=copy_bw / 1e12, cublas_tflops=flops / 1e12,
                    kq_occupancy={f"{q.name} M={m}": b for (q, m), b in matmul.KQ_OCCUPANCY.items()},
                    kq_rows_m1=args.kq_rows, q6k_order=args.q6k_order)
    print(f"# {meta['gpu']}: copy {copy_bw / 1e12:.2f} TB/s, cuBLAS fp16 {flops / 1e12:.0f} TFLOP/s")
    cases = [(q, s) for q in TYPES for s in SHAPES] + EXTRA
    if args.quick:
        cases = [(QType.Q4_K, s) for s in SHAPES[:3]]
    if args.types:
        cases = [(q, s) for q, s in cases if q.name in args.types.split(",")]
    if args.shapes:
        shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
        types = [q for q in dict.fromkeys(TYPES + [q for q, _ in EXTRA])
                 if q.name in (args.types.split(",") if args.types else [t.name for t in TYPES])]
        cases = [(q, s) for q in types for s in shapes]
    ms = tuple(int(m) for m in args.ms.split(",")) if args.ms else ((1,) if args.quick else MS)
    rows = []
    for q, (n, k) in cases:
        rows += run_case(q, n, k, ms, rng, args.launches, args.reps, copy_bw, args.alt or None,
                         not args.no_baselines, args.pdl, args.q6k_order == "pairs")
    if args.out:
        write_results(args.out, meta, rows, markdown(meta, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
