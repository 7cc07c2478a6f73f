"""How much of the tensor rate the multiply side of a 128 x N tile allows with nothing to wait for:
wgmma_probe.cu's two warpgroups, each m64 x N from shared memory, four multiplies a stage of 64
values of K, a commit and a wait for the group before (the consumer loop of the warp-specialised
kernel in bench/results/NOTES.md's nineteenth session); then A from registers as mma_wg has it (two
m64n64 a k-step, or one m64n128, a commit every two k-steps); on `blocks` blocks of `chunks` stages
each. Prints µs and TFLOP/s; GPU.md's cuBLAS fp16 rate is the ceiling to read them against.

    PYTHONPATH=$PWD python3 bench/probe_wgmma_tile.py --out bench/results/probe_wgmma_tile
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.timing import run_meta, time_us  # noqa: E402
from glimmer_cupy.kernels.build import get_kernel  # noqa: E402

# (kernel, what it multiplies, stage bytes, MACs a block a stage)
KERNELS = (
    ("wgmma_ss_probe<128>", "SS m64n128", (128 + 128) * 128, 128 * 128 * 64),
    ("wgmma_ss_probe<256>", "SS m64n256", (128 + 256) * 128, 128 * 256 * 64),
    ("wgmma_rs_probe<2>", "RS 2 x m64n64", 128 * 128, 128 * 128 * 64),
    ("wgmma_rs_probe<1>", "RS m64n128", 128 * 128, 128 * 128 * 64),
)


def main(argv=None) -> int:
    import cupy
    from cupy_backends.cuda.api import driver
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="128,132,64")
    ap.add_argument("--chunks", type=int, default=64, help="stages of 64 values of K a block (64: K = 4096)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    rows = []
    names = tuple(name for name, *_ in KERNELS)
    for name, what, stage, macs in KERNELS:
        kern = get_kernel("wgmma_probe", name, name_expressions=names)
        smem = 4 * stage + 1024
        driver.funcSetAttribute(kern.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
        for blocks in map(int, a.blocks.split(",")):
            y = cupy.empty(blocks * 256, np.float32)
            us = time_us(lambda i: kern((blocks,), (256,), (y, np.int32(a.chunks)), shared_mem=smem), 1, 50, 15)[0]
            tflops = 2.0 * blocks * macs * a.chunks / us / 1e6
            rows.append(dict(kernel=name, blocks=blocks, chunks=a.chunks, us=us, tflops=tflops))
            print(f"{what} x 2 warpgroups, {blocks} blocks x {a.chunks} stages: {us:8.2f} us {tflops:6.1f} TFLOP/s",
                  flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".json").write_text(json.dumps({"meta": run_meta(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
