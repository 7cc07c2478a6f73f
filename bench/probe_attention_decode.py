"""Where a decode token's attention half spends its time inside a PDL graph: prepare_qkv.cu and
attention_mma.cu compiled with GLIMMER_STAMPS (cuda_src/stamps.cuh), so thread 0 of every block
writes the global timer at each stage; the graph chains `--layers` attention halves as
bench_attention.py --graph does (600 positions of a 1024-wide table, inputs rotated past L2) and
the stamps of its last layer survive. Printed in µs from the first prepare_qkv block's start:
min / median / max over the blocks that reach the stage, median of `--reps` replays.

    PYTHONPATH=$PWD python3 bench/probe_attention_decode.py [--shapes smollm2-135m,qwen3-8b]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.kernels.build as build  # noqa: E402

build.add_defines("GLIMMER_STAMPS")

from bench_attention import GRAPH_SHAPES, graph_chain  # noqa: E402
from stamp_stats import module_stamps  # noqa: E402
from glimmer_cupy.kernels.launch import overlapped  # noqa: E402
from glimmer_cupy.ops.attention import _MMA_EXPRS  # noqa: E402
from glimmer_cupy.ops.prepare_qkv import _EXPRS as _PREP_EXPRS  # noqa: E402

PREP = ("start", "waited", "end")
ATTN = ("start", "old rows issued", "waited", "q in smem", "first K tile", "tiles done", "warps merged",
        "end")


def stamps(module_name: str, exprs) -> object:
    import cupy
    mod = build._load(module_name, (), tuple(exprs))
    return module_stamps(mod)


def probe(name: str, ctx: int, layers: int, reps: int):
    import cupy
    launch, sets, _ = graph_chain(name, ctx)
    stream = cupy.cuda.Stream(non_blocking=True)
    with overlapped(True), stream:
        for i in range(sets):
            launch(i, {})
        stream.synchronize()
        prep, attn = stamps("prepare_qkv", _PREP_EXPRS), stamps("attention_mma", _MMA_EXPRS)
        stream.begin_capture()
        for i in range(layers):
            launch(i % sets, {})
        graph = stream.end_capture()
        runs = []
        for _ in range(reps):
            prep.fill(0)
            attn.fill(0)
            graph.launch(stream)
            stream.synchronize()
            p, a = cupy.asnumpy(prep).astype(np.float64), cupy.asnumpy(attn).astype(np.float64)
            t0 = p[p[:, 0] > 0, 0].min()
            rows = []
            for arr, n in ((p, len(PREP)), (a, len(ATTN))):
                for j in range(n):
                    col = arr[arr[:, j] > 0, j]
                    rows.append((col.min() - t0, np.median(col) - t0, col.max() - t0) if col.size else (np.nan,) * 3)
            runs.append(rows)
    return np.median(np.array(runs) / 1e3, axis=0)          # ns -> µs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(GRAPH_SHAPES))
    ap.add_argument("--context", type=int, default=600)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args(argv)
    for name in args.shapes.split(","):
        r = probe(name, args.context, args.layers, args.reps)
        print(f"# {name}, {args.context} positions: µs from the first prepare_qkv block's start "
              f"(min / median / max over blocks)")
        for label, (lo, med, hi) in zip([f"prepare_qkv {s}" for s in PREP] + [f"attention {s}" for s in ATTN], r):
            print(f"{label:<30s} {lo:6.2f} {med:6.2f} {hi:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
