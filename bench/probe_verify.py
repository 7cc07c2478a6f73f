"""Where a stochastic verification's time goes: speculative.cu compiled with GLIMMER_STAMPS
(cuda_src/stamps.cuh), so thread 0 of each block stamps the global timer at each stage of every
(position, row) item it takes. 64 rows x 16 positions at vocab 151936 (top-k 50, top-p 0.9, T 0.8),
drafts from q (the benchmark's) and without drafts (one bonus draw a row), at each cluster size C.
Printed per stage: the median µs since the item's previous stage (rank 0's stamps), and when the
items started and ended from the launch's first stamp.

    PYTHONPATH=$PWD python3 bench/probe_verify.py [--clusters 1,4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.kernels.build as build  # noqa: E402

build.add_defines("GLIMMER_STAMPS")

from stamp_stats import module_stamps  # noqa: E402

STAGES = ("claimed", "not ended", "first read", "bound", "list gathered", "weights, E(d)", "decided",
          "cluster done", "counted")


def case_inputs(rows: int, n: int, vocab: int):
    import cupy
    from glimmer_cupy.ops.sampling import DeviceSamplingParams
    from glimmer_cupy.reference import sampling as ref
    rng = np.random.default_rng(5)
    x = cupy.asarray(rng.normal(0, 3, (rows, n + 1, vocab)).astype(np.float32))
    z = (x[:, :n] + cupy.asarray(rng.normal(0, 1, (rows, n, vocab)).astype(np.float32))) / 0.8
    q = cupy.exp(z - z.max(-1, keepdims=True))
    q /= q.sum(-1, keepdims=True)
    params = [ref.SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.0, seed=77 + r) for r in range(rows)]
    d = DeviceSamplingParams.from_params(params, vocab)
    pos = cupy.asarray(np.arange(0, 100 * rows, 100, dtype=np.int32))
    return x, q, d, pos, cupy.argmax(q, -1).astype(cupy.int32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", default="1,4")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    import cupy
    from glimmer_cupy import ops
    from glimmer_cupy.ops import speculative as spec
    rows, n, vocab = args.rows, 15, 151936
    x, q, d, pos, drafts = case_inputs(rows, n, vocab)
    out = (cupy.empty(rows, np.int32), cupy.empty((rows, n + 1), np.int32), cupy.empty(rows, np.int32))
    cases = {"drafts from q": None, "no drafts (bonus only)": cupy.zeros(rows, cupy.int32)}
    for c in (int(v) for v in args.clusters.split(",")):
        spec.verify_shape = lambda r, n_, v, b, sms=0, c=c: (c, spec.chunk_ids(v, c) if 4 * spec.chunk_ids(v, c) + 16 <= b else 0)
        for name, nd in cases.items():
            f = lambda: ops.sample_token(x, d, pos, drafts, q, n_drafts=nd, out=out)
            f()
            cupy.cuda.runtime.deviceSynchronize()
            st = module_stamps(build._load("speculative", (), ()))
            runs = []
            for _ in range(args.reps):
                st.fill(0)
                f()
                cupy.cuda.runtime.deviceSynchronize()
                runs.append(cupy.asnumpy(st).astype(np.float64))
            s = runs[len(runs) // 2][::c]                      # rank 0 of each item
            s = s[s[:, 0] > 0]
            t0 = s[:, 0].min()
            print(f"== C={c} {name}: {len(s)} items run, mean accepted {float(cupy.asnumpy(out[0]).mean()):.2f}, "
                  f"span {(s[:, 8].max() - t0) / 1e3:.1f} us", flush=True)
            prev = s[:, 0]
            for i, stage in enumerate(STAGES):
                v = s[:, i]
                ok = (v > 0) & (prev > 0)
                if i and ok.any():
                    dt = (v[ok] - prev[ok]) / 1e3
                    print(f"   {i} {stage:16s} n={ok.sum():4d} median {np.median(dt):7.2f} p90 {np.percentile(dt, 90):7.2f} us",
                          flush=True)
                prev = np.where(v > 0, v, prev)
            starts = (s[:, 0] - t0) / 1e3
            ends = (s[:, 8] - t0) / 1e3
            print("   starts (us): " + " ".join(f"{p:.1f}" for p in np.percentile(starts, (0, 25, 50, 75, 90, 100))),
                  flush=True)
            print("   item time median %.2f us, p90 %.2f" % (np.median(ends - starts), np.percentile(ends - starts, 90)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
