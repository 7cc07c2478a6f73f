"""mma_dq at every K split beside the rule's (ops/matmul.py: mma_dq_config), on the Qwen3-8B layer
shapes, its head and two of Qwen3-0.6B's in Q4_K: the same weights and x for every split count,
timed in a PDL graph as decode runs them, with M = 1 (the table's GEMV) for the M = 16 / M = 1
ratio of issue 3. Splits of 16 run
mma_dq_wide_kernel (a non-portable cluster of 16 blocks). Each row is timed twice, the rule's first
and last, so that drift between them shows.

    PYTHONPATH=$PWD python3 bench/ab_mma_dq_splits.py [--ms 16] [--splits 2,4,8,16] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.benchmarks.matmul_sets import m1_us, weight_sets  # noqa: E402
from glimmer_cupy.benchmarks.model_ab import applied  # noqa: E402
from glimmer_cupy.benchmarks.timing import run_meta, time_us  # noqa: E402
from glimmer_cupy.kernels.launch import overlapped  # noqa: E402
from glimmer_cupy.ops import matmul  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType  # noqa: E402


def forced(ks: int | None) -> dict:
    """The arm (model_ab.applied) that makes mma_dq split K ks ways; None: the rule's."""
    return {} if ks is None else {(matmul, "mma_dq_config"): lambda m, n, k: (-(-m // 8), ks)}


SHAPES = ((4096, 4096), (12288, 4096), (4096, 12288), (24576, 4096), (151936, 4096), (6144, 1024), (1024, 3072))


def main(argv=None) -> int:
    import cupy
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="16")
    ap.add_argument("--splits", default="1,2,4,8", help="comma-separated, each 1, 2, 4 or 8")
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    ms = [int(v) for v in a.ms.split(",")]
    splits = [int(v) for v in a.splits.split(",")]
    if not set(splits) <= {1, 2, 4, 8}:
        ap.error(f"--splits: each of 1, 2, 4, 8 (mma_dq_kernel's clusters), got {a.splits}")
    rule = matmul.mma_dq_config
    rng = np.random.default_rng(7)
    rows = []
    for n, k in SHAPES:
        ws = weight_sets(QType.Q4_K, n, k, rng)
        sets = len(ws)
        m1 = m1_us(ws, rng, a.launches, a.reps)
        for m in ms:
            xs = [cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32)) for _ in range(sets)]
            outs = [cupy.empty((m, n), np.float32) for _ in range(sets)]

            def timed(ks):
                with applied(forced(ks)), overlapped(True):
                    return time_us(lambda i: ops.quant_matmul(xs[i], ws[i], out=outs[i], force_bucket="mma_dq"),
                                   sets, a.launches, a.reps)[0]

            want = ops.quant_matmul(xs[0], ws[0], force_bucket="mma_dq")
            row = dict(n=n, k=k, m=m, rule_splits=rule(m, n, k)[1], m1_us=m1, rule_us=[timed(None)], split_us={})
            for ks in splits:
                with applied(forced(ks)):
                    got = ops.quant_matmul(xs[0], ws[0], force_bucket="mma_dq")
                err = float(cupy.abs(got - want).max() / cupy.abs(want).max())
                row["split_us"][ks] = (timed(ks), err)
            row["rule_us"].append(timed(None))
            rows.append(row)
            best = min(row["split_us"].items(), key=lambda kv: kv[1][0])
            print(f"{n:>6}x{k:<6} M={m:<3} M=1 {m1:6.1f} us | rule (ks {row['rule_splits']:>2}) "
                  f"{row['rule_us'][0]:6.1f} / {row['rule_us'][1]:6.1f} | "
                  + " ".join(f"ks {s:>2}: {t:6.1f}" for s, (t, _) in row["split_us"].items())
                  + f" | best ks {best[0]} = {best[1][0] / m1:.2f}x M=1 | "
                  f"max rel diff to the rule {max(e for _, e in row['split_us'].values()):.1e}", flush=True)
        ws = xs = outs = None           # this shape's buffers go before the next one's
        cupy.get_default_memory_pool().free_all_blocks()
    if a.out:
        a.out.write_text(json.dumps(dict(meta=run_meta(), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
