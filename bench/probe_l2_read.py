"""The rate at which the SMs read a buffer that L2 holds (cuda_src/l2_probe.cu), beside the same
kernel over a buffer far larger than L2 (HBM) and the device-to-device copy: the ceiling for a
kernel that reads the same bytes from many blocks, as the prefill attention reads a sequence's K/V
tiles once for each block of query rows (bench/results/NOTES.md, forty-second session).

    PYTHONPATH=$PWD python3 bench/probe_l2_read.py [--mib 4,8,16,32,1024] [--blocks-per-sm 4,8] [--out FILE]

Each line: the buffer, the way it is read (ld.global.cg into registers, or cp.async.cg into shared
memory), blocks an SM, and TB/s (bytes read over the launch's time, median of --reps graph
replays; each launch reads --read-gib GiB).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.timing import copy_bandwidth, graph_time_us, run_meta, write_results  # noqa: E402
from glimmer_cupy.kernels.build import get_kernel, sm_count  # noqa: E402

NAMES = ("l2_read<false>", "l2_read<true>")
THREADS = 256


def pieces(mib: int) -> int:
    """16-byte pieces of a buffer of `mib` MiB; the kernel wraps its index with a mask, so a power of two."""
    n16 = mib << 16
    if mib <= 0 or n16 & (n16 - 1):
        raise SystemExit(f"probe_l2_read: --mib {mib}: a power of two")
    return n16


def read_rate(buf, cp: bool, blocks_per_sm: int, read_gib: float, reps: int) -> float:
    """TB/s of one l2_read launch reading read_gib GiB from `buf` (int32, a power of two of 16-byte pieces)."""
    import cupy
    n16 = buf.size // 4
    blocks = blocks_per_sm * sm_count()
    total = int(read_gib * (1 << 30)) // 16 // (blocks * THREADS) * (blocks * THREADS)
    out = cupy.empty(blocks * THREADS, np.uint32)
    kern = get_kernel("l2_probe", NAMES[cp], name_expressions=NAMES)
    us = graph_time_us(lambda _: kern((blocks,), (THREADS,), (buf, np.int64(n16), np.int64(total), out)), 1, 1, reps)
    return total * 16 / (us * 1e-6) / 1e12


def main(argv=None) -> int:
    import cupy
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", default="4,8,16,32,1024", help="buffer sizes, MiB (powers of two; L2 is 60 MiB)")
    ap.add_argument("--blocks-per-sm", default="4,8")
    ap.add_argument("--read-gib", type=float, default=4.0)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.mib.split(",")]
    for mib in sizes:
        pieces(mib)
    copy = copy_bandwidth()
    meta = run_meta(copy_tb_s=copy / 1e12)
    rows, lines = [], [f"# L2 read rate ({meta['gpu']}, {meta['date']}, {meta['commit']}); "
                       f"device-to-device copy {copy / 1e12:.2f} TB/s (read + written)", "",
                       "| MiB | read | blocks / SM | TB/s |", "|---|---|---|---|"]
    for mib in sizes:
        buf = cupy.random.randint(0, 2 ** 31, size=pieces(mib) * 4, dtype=np.int32)   # one buffer a size
        for cp in (False, True):
            for bps in (int(x) for x in a.blocks_per_sm.split(",")):
                tb = read_rate(buf, cp, bps, a.read_gib, a.reps)
                how = "cp.async.cg" if cp else "ld.global.cg"
                rows.append(dict(mib=mib, read=how, blocks_per_sm=bps, tb_s=tb))
                lines.append(f"| {mib} | {how} | {bps} | {tb:.2f} |")
                print(lines[-1], flush=True)
    if a.out:
        write_results(a.out, meta, rows, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
