"""Time mma_wg's K splits and its two ways with rows of x past M against each other, Qwen3-8B
shapes, Q4_K.

Each line: one (shape, M), the time of quant_matmul's whole mma_wg path (the stage kernel and the
warpgroup kernel, a CUDA graph of many calls, weights rotated past L2): `c/KS` rows past M clamped
to M - 1, `z` those rows zeros, at KS splits (every count that keeps a super-block a split);
`rule` is mma_wg_splits' choice; with --probes, `pP` mma_wg's probe instance P at one split
(wrong results: 1 no W loads nor decode, 2 no x copies, 3 neither, 7 neither and no hand-over a
super-block) and `stage` the stage kernel alone.

    PYTHONPATH=$PWD python3 bench/ab_mma_wg.py --out bench/results/ab_mma_wg
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.timing import n_sets, run_meta, time_us  # noqa: E402
from glimmer_cupy.ops.matmul import MMA_WG_PROBES, MMA_WG_SPLITS, mma_wg, mma_wg_splits  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType, QuantTensor  # noqa: E402
from glimmer_cupy.weights.random_blocks import random_blocks  # noqa: E402

SHAPES = ((4096, 4096), (12288, 4096), (4096, 12288), (151936, 4096))
MS = (33, 64, 128, 256, 512)


def main(argv=None) -> int:
    import cupy
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--probes", action="store_true", help="also time mma_wg's probe instances: pP")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    for shape in a.shapes.split(","):
        n, k = map(int, shape.split("x"))
        first = random_blocks(QType.Q4_K, n, k, rng, 0.02)
        sets = n_sets(first.nbytes)
        ws = [QuantTensor("w", QType.Q4_K, (n, k), cupy.asarray(first if i == 0 else random_blocks(QType.Q4_K, n, k,
                                                                                                   rng, 0.02)))
              for i in range(sets)]
        del first
        for m in map(int, a.ms.split(",")):
            xs = [cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32)) for _ in range(sets)]
            outs = [cupy.empty((m, n), np.float32) for _ in range(sets)]
            rule = mma_wg_splits(m, n, k)
            cases = [(z, ks) for z in (False, True) for ks in MMA_WG_SPLITS if ks <= k // 256]
            times = {}
            for z, ks in cases:
                times[f"{'z' if z else 'c'}/{ks}"] = time_us(lambda i: mma_wg(outs[i], xs[i], ws[i], splits=ks, zero=z),
                                                             sets, a.launches, a.reps)[0]
            if a.probes:
                for pr in (*MMA_WG_PROBES, -1):
                    times[f"p{pr}" if pr > 0 else "stage"] = time_us(
                        lambda i: mma_wg(outs[i], xs[i], ws[i], probe=pr), sets, a.launches, a.reps)[0]
            rows.append(dict(n=n, k=k, m=m, rule=rule, us=times))
            best = min(times, key=times.get)
            print(f"{n}x{k} M={m:<4d} rule {rule} | " + " ".join(f"{c}: {t:7.1f}" for c, t in times.items())
                  + f" | best {best}", flush=True)
            del xs, outs
        del ws
        cupy.get_default_memory_pool().free_all_blocks()
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".json").write_text(json.dumps({"meta": run_meta(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
