"""What a kernel pays for code that is not cached: cuda_src/cold_code_probe.cu's cold_chain<N> (N
distinct instructions run once, N x 16 bytes of SASS) on one warp a block, a block an SM, timed from
each block's entry to its exit by the global timer, with its code in three places:
  dram  L2 flushed (a buffer larger than it written), then cold_chain<16383> (256 KB of other
        code) on every SM, so that no SM's instruction caches hold the probe's code either;
  l2    the same variant run just before, then cold_chain<16383>: the code is in L2, not in the SMs;
  sm    the same variant run just before, nothing between.
Prints, per N, the median and the slowest block's µs in each state (the median over --reps launches),
and what each KB of code cost over the warm run. A kernel of a decode step streams more weight bytes
than L2 holds, so it may start from dram; a block that runs a stretch of code once (the last block of
a split attention's merge) from l2 at best.

    PYTHONPATH=$PWD python3 bench/probe_cold_code.py [--blocks 0] [--reps 7] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.timing import run_meta  # noqa: E402
from glimmer_cupy.kernels.build import get_kernel, sm_count  # noqa: E402

SIZES = (256, 1024, 1536, 2048, 3072, 4096, 16384)     # 16 KB was held in an SM, 64 KB not: where between?
EVICTOR = 16383
NAMES = tuple(f"cold_chain<{n}>" for n in SIZES + (EVICTOR,))
FLUSH_BYTES = 512 << 20


def main(argv=None) -> int:
    import cupy
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=0, help="blocks a launch (0: one an SM)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    blocks = a.blocks or sm_count()
    kern = {n: get_kernel("cold_code_probe", f"cold_chain<{n}>", name_expressions=NAMES) for n in SIZES + (EVICTOR,)}
    out = cupy.empty(blocks * 32, np.float32)
    stamps = cupy.zeros(2 * blocks, np.uint64)
    flush = cupy.empty(FLUSH_BYTES // 4, np.float32)

    def launch(n):
        kern[n]((blocks,), (32,), (out, stamps, np.float32(0.999)))

    def timed(n) -> tuple[float, float]:
        launch(n)
        cupy.cuda.Device().synchronize()
        s = cupy.asnumpy(stamps).astype(np.int64).reshape(blocks, 2)
        us = (s[:, 1] - s[:, 0]) / 1e3
        return float(np.median(us)), float(us.max())

    def state(n, where) -> tuple[float, float]:
        if where == "dram":
            flush.fill(1.0)
            launch(EVICTOR)
        elif where == "l2":
            launch(n)
            launch(EVICTOR)
        else:
            launch(n)
        return timed(n)

    for n in SIZES + (EVICTOR,):             # every module loaded and every kernel run once
        launch(n)
    cupy.cuda.Device().synchronize()
    rows = []
    print(f"# {blocks} blocks of one warp; µs from a block's entry to its exit, median over blocks / slowest, "
          f"median of {a.reps} launches", flush=True)
    for n in SIZES:
        row = dict(n=n, code_kb=n * 16 / 1024)
        for where in ("dram", "l2", "sm"):
            runs = np.array([state(n, where) for _ in range(a.reps)])
            row[where] = float(np.median(runs[:, 0]))
            row[where + "_slowest"] = float(np.median(runs[:, 1]))
        kb = row["code_kb"]
        line = f"N={n:6d} ({kb:6.1f} KB of code) |"
        for where in ("dram", "l2", "sm"):
            line += f" {where} {row[where]:7.2f} / {row[where + '_slowest']:7.2f} us |"
        line += (f" per KB over sm: dram {(row['dram'] - row['sm']) / kb * 1e3:6.1f} ns,"
                 f" l2 {(row['l2'] - row['sm']) / kb * 1e3:6.1f} ns")
        print(line, flush=True)
        rows.append(row)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".json").write_text(json.dumps({"meta": run_meta(blocks=blocks), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
