"""The stochastic verification at each block size of its cluster kernel, side by side: speculative.cu
built with VERIFY_THREADS=512 (two blocks an SM at C = 1) and 1024 (the default: one block an SM),
on bench_sampling's stochastic+q inputs (16-token blocks, top-k 50, top-p 0.9, T 0.8, drafts from
q), checking that every build gives the same tokens, accepted counts and flags as the first. (The run in bench/results/probe_verify_threads_d06099c.txt launched the
512-thread build at the driver's occupancy, two blocks an SM; the op now sizes the launch by
threads, 2048 // VERIFY_THREADS an SM, of which two fit.)

    PYTHONPATH=$PWD python3 bench/probe_verify_threads.py [--rows 8,64] [--vocabs 151936] [--threads 512,1024]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_sampling import BLOCK, verify_inputs  # noqa: E402
from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.benchmarks.timing import copy_bandwidth, time_us  # noqa: E402
from glimmer_cupy.kernels.launch import overlapped  # noqa: E402
from glimmer_cupy.ops import speculative as spec  # noqa: E402
from glimmer_cupy.ops.sampling import DeviceSamplingParams  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,8,64")
    ap.add_argument("--vocabs", default="49152,151936,262144")
    ap.add_argument("--threads", default="512,1024")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args(argv)
    import cupy
    copy_bw = copy_bandwidth()
    print(f"# copy {copy_bw / 1e12:.2f} TB/s; the default build's VERIFY_THREADS {spec.VERIFY_BUILD_THREADS}")
    same_everywhere = True
    with overlapped(True):
        for vocab in map(int, args.vocabs.split(",")):
            for rows in map(int, args.rows.split(",")):
                x, params, positions, drafts, q = verify_inputs(rows, vocab, False, np.random.default_rng(0))
                d = DeviceSamplingParams.from_params(params, vocab)
                pos = cupy.asarray(np.array(positions, np.int32))
                out = (cupy.empty(rows, np.int32), cupy.empty((rows, BLOCK), np.int32), cupy.empty(rows, np.int32))
                first = None
                line = f"stochastic+q rows={rows:<3d} V={vocab:<6d}"
                for threads in map(int, args.threads.split(",")):
                    spec.VERIFY_THREADS = threads       # the launch takes the cluster kernel's build for it
                    out[1].fill(-7)
                    ops.sample_token(x, d, pos, drafts, q, out=out)
                    got = [cupy.asnumpy(o) for o in out]
                    first = first or got
                    same = all(np.array_equal(a, b) for a, b in zip(got, first))
                    same_everywhere &= same
                    us, _ = time_us(lambda i: ops.sample_token(x, d, pos, drafts, q, out=out), 1, 10, args.reps)
                    kern = spec.get_kernel("speculative", "verify_i32_c1", spec.verify_defines(threads))
                    line += (f" | {threads} threads ({kern.fn.num_regs} regs, "
                             f"{spec._blocks_per_sm(kern.ptr, threads)} an SM): {us:7.1f} us"
                             f"{'' if same else ' TOKENS DIFFER'}")
                print(line + f" | mean accepted {float(first[0].mean()):.2f}", flush=True)
                cupy.get_default_memory_pool().free_all_blocks()
    return 0 if same_everywhere else 1


if __name__ == "__main__":
    sys.exit(main())
