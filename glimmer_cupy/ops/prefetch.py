"""Weight ranges a latency-bound kernel asks the memory system to bring into L2 while it runs.

A decode step alternates long matmuls, which stream their weights from DRAM, with short kernels
during which DRAM is idle. Decode attention given L2Ranges (ops.attention's `prefetch`) has warp 0
of each block of a pushed cluster merge but rank 0 issue bulk prefetches (cp.async.bulk.prefetch.L2,
cuda_src/pdl.cuh: prefetch_l2_share) of its share of every range as the block leaves, after its
last K/V tile and its rows are sent, so that the matmuls after attention find those bytes in L2 and
no load of attention's own waits behind them (asked for at the kernel's start, the same burst
delayed attention's dependent trips: bench/results/NOTES.md, thirty-fourth and sixty-second
sessions). Weights only: no kernel writes them; it changes no result.

The ranges are kernel arguments by value (three (address, bytes) pairs), fixed when built, so a
captured CUDA graph replays them as they are.
"""

from __future__ import annotations

import numpy as np

from ..weights.quant_tensor import QuantTensor
from ._check import data_ptr, fail
from ._dispatch import is_host

MAX_RANGES = 3                        # kPrefetchRanges in cuda_src/pdl.cuh
NO_PREFETCH = (np.uint64(0),) * (2 * MAX_RANGES)


class L2Ranges:
    """Up to MAX_RANGES (device array, bytes) pairs: the first `bytes` of each array's data."""

    __slots__ = ("args", "nbytes")

    def __init__(self, args: tuple, nbytes: int):
        self.args, self.nbytes = args, nbytes


def l2_ranges(*parts) -> L2Ranges | None:
    """parts: (array or QuantTensor, bytes) pairs; bytes is rounded down to 16 and must not exceed the
    array's size. None for host arrays (the reference path has no cache to warm) or no bytes."""
    op = "l2_ranges"
    if len(parts) > MAX_RANGES:
        raise fail(op, "parts", f"at most {MAX_RANGES} ranges", len(parts))
    args, total = [], 0
    for i, (a, n) in enumerate(parts):
        data = a.data if isinstance(a, QuantTensor) else a
        if is_host(data):
            return None
        n = int(n)
        if not 0 <= n <= data.nbytes:
            raise fail(op, f"parts[{i}] bytes", f"0..{data.nbytes} (the array's size)", n)
        ptr = data_ptr(data)
        if ptr % 16:
            raise fail(op, f"parts[{i}]", "an array on a 16-byte boundary", f"address {ptr:#x}")
        n -= n % 16
        args += [np.uint64(ptr), np.uint64(n)]
        total += n
    if total == 0:
        return None
    args += [np.uint64(0)] * (2 * MAX_RANGES - len(args))
    return L2Ranges(tuple(args), total)


def prefetch_args(ranges: L2Ranges | None) -> tuple:
    """The kernel arguments of `ranges` (L2_PREFETCH_ARGS): null pairs for None."""
    return NO_PREFETCH if ranges is None else ranges.args
