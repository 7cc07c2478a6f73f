"""How verify_greedy's time depends on how many blocks it keeps in flight and on the ids each
block reads an item (GREEDY_IDS), on the benchmark's greedy inputs (bench_sampling.py's verify
case: drafts equal to the argmax for a random prefix of each row, then a wrong id).

Every block in flight holds a claimed item of some (position, row), so the number in flight bounds
how far past a row's rejection the queue can run before the rejection is known, and also how many
loads keep the memory busy; the probe says which of the two sets the time. Printed per setting: µs
a call (graph of many calls, median), the examined floor beside it, and whether the tokens equal
the default setting's.

    PYTHONPATH=$PWD python3 bench/probe_verify_greedy.py [--rows 8,64] [--per-sm 1,2,3,4,5] [--ids 8192,16384,32768]
        [--builds "GREEDY_THREADS=512,GREEDY_MIN_BLOCKS=3;GREEDY_LOADS=6,GREEDY_MIN_BLOCKS=5"]

--builds compiles verify_greedy once for each set of its compile-time switches (semicolon-separated
sets of NAME=V, comma-separated: GREEDY_THREADS = threads a block, which the launch follows;
GREEDY_LOADS = float4 loads in flight a thread; GREEDY_MIN_BLOCKS = blocks an SM that its registers
must allow; GREEDY_MAX4 = 1, aligned slices scanned through rowmath::Max4) and times each at the
op's own launch size; the default setting's tokens are the reference.

--knockout also times the call with the cluster kernel's launch left out (every row is greedy, so
its blocks would find their queue empty): what that empty launch costs a call.

With --calls N it only makes N eager calls at the default setting and at each build (for a profiler:
ncu's duration and DRAM bytes of each kernel of a call say what the call's fixed part and its
unexamined reads cost).
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_sampling import BLOCK, verify_inputs  # noqa: E402
from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.benchmarks.timing import copy_bandwidth, time_us  # noqa: E402
from glimmer_cupy.kernels.launch import overlapped  # noqa: E402
from glimmer_cupy.ops import speculative as spec  # noqa: E402
from glimmer_cupy.ops.sampling import DeviceSamplingParams  # noqa: E402


def greedy_case(rows: int, vocab: int, rng):
    """bench_sampling's greedy verification case, with device parameters and positions."""
    import cupy
    x, params, positions, drafts, _ = verify_inputs(rows, vocab, True, rng)
    return x, DeviceSamplingParams.from_params(params, vocab), cupy.asarray(np.array(positions, np.int32)), drafts


@contextmanager
def spec_build(defines: dict, kernels: tuple[str, ...], threads_attr: str):
    """ops.speculative with the kernels whose names start with one of `kernels` compiled with
    `defines`, and spec.<threads_attr> (their block size) set to defines[threads_attr] if given."""
    get, threads = spec.get_kernel, getattr(spec, threads_attr)
    spec.get_kernel = (lambda name, kernel, *a, **kw: get(name, kernel, defines) if kernel.startswith(kernels)
                       else get(name, kernel, *a, **kw))
    setattr(spec, threads_attr, defines.get(threads_attr, threads))
    try:
        yield
    finally:
        spec.get_kernel = get
        setattr(spec, threads_attr, threads)


@contextmanager
def built(build: str):
    """The op with verify_greedy compiled with the switches of `build` ('NAME=V,...'; '': as it is),
    launched at the build's block size."""
    if not build:
        yield
        return
    with spec_build({k: int(v) for k, v in (kv.split("=") for kv in build.split(","))}, ("verify_greedy",),
                    "GREEDY_THREADS"):
        yield


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="8,64")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--per-sm", default="1,2,3,4,5", help="blocks in flight per SM (0: the op's own rule)")
    ap.add_argument("--ids", default="8192,16384,32768", help="GREEDY_IDS values")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--builds", default="", help="sets of NAME=V switches of verify_greedy, ';'-separated")
    ap.add_argument("--knockout", action="store_true", help="also time without the cluster kernel's launch")
    ap.add_argument("--calls", type=int, default=0, help="only this many eager calls, for a profiler")
    args = ap.parse_args(argv)
    import cupy
    if args.calls:
        for rows in map(int, args.rows.split(",")):
            x, d, pos, drafts = greedy_case(rows, args.vocab, np.random.default_rng(0))
            for build in ["", *filter(None, args.builds.split(";"))]:
                with built(build):
                    for _ in range(args.calls):
                        ops.sample_token(x, d, pos, drafts)
        cupy.cuda.Device().synchronize()
        return 0
    copy_bw = copy_bandwidth()
    default_blocks, default_ids = spec._resident_greedy_blocks, spec.GREEDY_IDS
    for rows in map(int, args.rows.split(",")):
        x, d, pos, drafts = greedy_case(rows, args.vocab, np.random.default_rng(0))
        out = tuple(cupy.empty(s, np.int32) for s in ((rows,), (rows, BLOCK), (rows,)))
        with overlapped(True):
            want = [cupy.asnumpy(o) for o in ops.sample_token(x, d, pos, drafts)]
            accepted = float(want[0].mean())
            floor = rows * (accepted + 1) * args.vocab * 4 / copy_bw * 1e6

            def measure(label: str) -> None:
                ops.sample_token(x, d, pos, drafts, out=out)        # compiles a new build outside the timing
                same = all(np.array_equal(cupy.asnumpy(o), w) for o, w in zip(out, want))
                us, how = time_us(lambda i: ops.sample_token(x, d, pos, drafts, out=out), 1, 50, args.reps)
                print(f"{label} | {us:7.1f} us ({how}) | {us / floor:5.2f}x floor | tokens {'same' if same else 'DIFFER'}",
                      flush=True)

            print(f"# rows {rows} vocab {args.vocab}: mean accepted {accepted:.2f}, examined floor {floor:.1f} us, "
                  f"default {default_blocks(spec.get_kernel('speculative', 'verify_greedy_i32'))} blocks")
            for ids in map(int, args.ids.split(",")):
                spec.GREEDY_IDS = ids
                for per_sm in map(int, args.per_sm.split(",")):
                    spec._resident_greedy_blocks = (default_blocks if per_sm == 0
                                                    else lambda kernel, k=per_sm: k * spec.sm_count())
                    measure(f"ids {ids:6d} per-SM {per_sm}")
            spec._resident_greedy_blocks, spec.GREEDY_IDS = default_blocks, default_ids
            if args.knockout:
                launch = spec._launch_clusters
                spec._launch_clusters = lambda *a, **kw: None
                measure("default without the cluster kernel's launch")
                spec._launch_clusters = launch
            for build in filter(None, args.builds.split(";")):
                with built(build):
                    kern = spec.get_kernel("speculative", "verify_greedy_i32")
                    measure(f"build {build} ({kern.fn.num_regs} registers, {default_blocks(kern)} blocks)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
