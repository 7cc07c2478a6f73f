"""Where a row's time goes in sample_rows' short top-k path: sampling.cu compiled with
GLIMMER_TOPK_CLOCKS, so thread 0 of block 0 stamps clock64() at each stage boundary of
cuda_src/sampling_topk.cuh; printed as cycles and microseconds (at the device's clock rate)
from the kernel's start, median of many launches, for a few batches and vocabularies.

    PYTHONPATH=$PWD python3 bench/probe_sampling_topk.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.kernels.build import load_module  # noqa: E402
from glimmer_cupy.ops.sampling import THREADS, DeviceSamplingParams, cluster_size  # noqa: E402
from glimmer_cupy.reference.sampling import SamplingParams  # noqa: E402

STAGES = ("start", "pass 1 read", "block max", "cluster max read", "cluster sync", "tau", "pass 2 list",
          "list sync", "top-k, E, S", "top-p", "weights, total", "draw")


def probe(batch: int, vocab: int, runs: int = 50) -> np.ndarray:
    import cupy
    mod = load_module("sampling", {"GLIMMER_TOPK_CLOCKS": 1})
    c = cluster_size(batch)
    fn = mod.get_function(f"sample_rows_c{c}")
    clocks = cupy.ndarray((24,), np.int64, mod.get_global("topk_clocks"))
    rng = np.random.default_rng(batch + vocab)
    x = cupy.asarray(rng.normal(0, 3, (batch, vocab)).astype(np.float32))
    d = DeviceSamplingParams.from_params([SamplingParams(0.8, 50, 0.9, 0.0, seed=r) for r in range(batch)], vocab)
    pos = cupy.arange(batch, dtype=cupy.int32)
    out = cupy.empty((2, batch), np.int32)
    stamps = []
    for _ in range(runs):
        clocks.fill(0)
        fn((batch * c,), (THREADS,), (out[0], out[1], x, d.temperature, d.top_k, d.top_p, d.min_p, d.seed, pos,
                                       np.int32(vocab), np.int32(1)))
        cupy.cuda.Device().synchronize()
        stamps.append(cupy.asnumpy(clocks))
    s = np.median(np.array(stamps, np.float64), axis=0)
    return np.where(s > 0, s - s[0], np.nan)              # NaN: a stamp this cluster size does not reach


def main() -> int:
    import cupy
    mhz = cupy.cuda.Device().attributes["ClockRate"] / 1e3
    print(f"# clock {mhz:.0f} MHz; cycles from the kernel's start (thread 0 of block 0), median of 50 launches")
    cases = [(1, 151936), (8, 151936), (64, 151936), (256, 151936), (1, 262144)]
    table = {case: probe(*case) for case in cases}
    print("stage".ljust(20) + "".join(f"B={b} V={v}".rjust(18) for b, v in cases))
    for i, name in enumerate(STAGES):
        print(name.ljust(20) + "".join(f"{table[c][i]:9.0f} {table[c][i] / mhz:6.2f}us" for c in cases))
    first = {c: table[c][15] - table[c][7] for c in cases}
    second = {c: table[c][11] - table[c][16] for c in cases}
    print("last block, 1st run".ljust(20) + "".join(f"{first[c]:9.0f} {first[c] / mhz:6.2f}us" for c in cases))
    print("last block, 2nd run".ljust(20) + "".join(f"{second[c]:9.0f} {second[c] / mhz:6.2f}us" for c in cases))
    print("(cycles of thread 0 of block 0; after a barrier they are the block's, after a cluster barrier the cluster's;"
          " the last block's steps run twice here, the second time from a warm instruction cache)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
