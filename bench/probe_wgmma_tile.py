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

NS = (128, 256)


def main(argv=None) -> int:
    import cupy
    from cupy_backends.cuda.api import driver
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="128,132,64")
    ap.add_argument("--chunks", type=int, default=64, help="stages of 64 values of K a block (64: K = 4096)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    rows = []
    names = tuple(f"wgmma_ss_probe<{n}>" for n in NS) + ("wgmma_rs_probe<1>", "wgmma_rs_probe<2>")
    for n in NS:
        kern = get_kernel("wgmma_probe", f"wgmma_ss_probe<{n}>", name_expressions=names)
        smem = 4 * (128 + n) * 128 + 1024
        driver.funcSetAttribute(kern.fn.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
        for blocks in map(int, a.blocks.split(",")):
            y = cupy.empty(blocks * 256, np.float32)
            us = time_us(lambda i: kern((blocks,), (256,), (y, np.int32(a.chunks)), shared_mem=smem), 1, 50, 15)[0]
            flops = 2.0 * blocks * 128 * n * 64 * a.chunks
            rows.append(dict(n=n, blocks=blocks, chunks=a.chunks, us=us, tflops=flops / us / 1e6))
            print(f"m64n{n} x 2 warpgroups, {blocks} blocks x {a.chunks} stages: {us:8.2f} us "
                  f"{flops / us / 1e6:6.1f} TFLOP/s", flush=True)
    for halves in (2, 1):
        kern = get_kernel("wgmma_probe", f"wgmma_rs_probe<{halves}>", name_expressions=names)
        smem = 4 * 128 * 128 + 1024
        driver.funcSetAttribute(kern.fn.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
        for blocks in map(int, a.blocks.split(",")):
            y = cupy.empty(blocks * 256, np.float32)
            us = time_us(lambda i: kern((blocks,), (256,), (y, np.int32(a.chunks)), shared_mem=smem), 1, 50, 15)[0]
            flops = 2.0 * blocks * 128 * 128 * 64 * a.chunks
            rows.append(dict(rs_halves=halves, blocks=blocks, chunks=a.chunks, us=us, tflops=flops / us / 1e6))
            print(f"RS {'2 x m64n64' if halves == 2 else 'm64n128'} x 2 warpgroups, {blocks} blocks x {a.chunks} "
                  f"stages: {us:8.2f} us {flops / us / 1e6:6.1f} TFLOP/s", flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".json").write_text(json.dumps({"meta": run_meta(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
