"""What a dependence between two kernels of a step costs, by how it is kept (cuda_src/dep_probe.cu):
a CUDA graph of --links launches of dep_link, each reading the whole vector the one before wrote
and writing the next, timed per launch, for each grid size and mode:
  plain      no launch attribute: the stream orders the launches
  pdl        programmatic dependent launch, griddepcontrol.wait then release (the step's default)
  pdl-early  the same, released before the wait (the step's short kernels)
  counter    PDL launches kept in order by a counter a launch (release add / acquire poll)
  flags      the same by a flag a block (release store / the next launch's threads poll them all)
The difference between pdl and counter is what the grid's completion costs a step's kernel beyond
the last block's own signal.

    PYTHONPATH=$PWD python3 bench/probe_dep_wait.py [--grids 1,132,528,2112] [--links 256] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.timing import graph_time_us, run_meta  # noqa: E402
from glimmer_cupy.kernels.build import get_kernel  # noqa: E402
from glimmer_cupy.kernels.launch import launch_pdl  # noqa: E402

MODES = {"plain": (0, False), "pdl": (0, True), "pdl-early": (1, True), "counter": (2, True), "flags": (3, True)}
NAMES = tuple(f"dep_link<{m}>" for m in range(4))


def chain_us(mode: str, grid: int, n: int, links: int, reps: int) -> float:
    """Median over reps of a graph's time per link, µs (timing.graph_time_us, the whole chain one
    captured call); then checks the chain's last vector and the counters of the last replay."""
    import cupy
    m, pdl = MODES[mode]
    kern = get_kernel("dep_probe", f"dep_link<{m}>", name_expressions=NAMES)
    bufs = [cupy.full(n, 1.0, np.float32), cupy.zeros(n, np.float32)]
    counters = cupy.zeros(links * (grid if m == 3 else 1), np.uint32)

    def run(_):
        counters.fill(0)
        for i in range(links):
            args = (bufs[(i + 1) % 2], bufs[i % 2], np.int32(n), counters, np.int32(i), np.uint32(grid))
            if pdl:
                launch_pdl(kern.fn, kern.name, (grid,), (128,), args)
            else:
                kern((grid,), (128,), args)

    us = graph_time_us(run, 1, 1, reps) / links
    got = cupy.asnumpy(bufs[links % 2])
    if not np.array_equal(np.floor(got), (np.arange(n) % 8).astype(np.float32)):   # the integer parts
        raise SystemExit(f"{mode} grid {grid}: the chain's last vector is wrong")
    if m >= 2 and not (cupy.asnumpy(counters) == (grid if m == 2 else 1)).all():
        raise SystemExit(f"{mode} grid {grid}: not every launch's blocks signalled")
    return us


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grids", default="1,132,528,2112")
    ap.add_argument("--n", type=int, default=4096, help="floats a vector (a multiple of 4)")
    ap.add_argument("--links", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    grids = [int(g) for g in a.grids.split(",")]
    rows = []
    print(f"# µs a launch in a graph of {a.links} dependent launches (median of {a.reps}), "
          f"vector of {a.n} floats", flush=True)
    print(f"{'grid':>6} " + " ".join(f"{m:>10}" for m in MODES), flush=True)
    for g in grids:
        row = dict(grid=g)
        for mode in MODES:
            row[mode] = chain_us(mode, g, a.n, a.links, a.reps)
        rows.append(row)
        print(f"{g:>6} " + " ".join(f"{row[m]:>10.2f}" for m in MODES), flush=True)
    if a.out:
        a.out.write_text(json.dumps(dict(meta=run_meta(), n=a.n, links=a.links, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
