"""Weights asked into L2 before the GEMV that reads them (kernel: cuda_src/l2_prefetch.cu).

A decode step alternates GEMVs, which stream weights at the DRAM's rate, with short kernels
(attention, the norms, the gated activation) that wait on latency and leave the DRAM idle.
prefetch_l2 forks the current stream: a small kernel on a side stream asks the first bytes of the
next GEMV's weights into L2 while the short kernels run, so the GEMV finds them on chip. The
main stream never waits for the side stream until prefetch_join (the end of a forward pass),
which a captured graph needs: its branch must rejoin before the capture ends.

Only inside kernels.launch.overlapped() — static steps, which CUDA graphs replay; elsewhere, and on
NumPy weights, both are no-ops. A prefetch is a hint: it changes no result, only where bytes are.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from ..kernels.build import get_kernel
from ..kernels.launch import overlapping

CHUNK = 16 << 10            # bytes a thread asks for with one bulk prefetch (under the instruction's 1 MiB)
THREADS = 4                 # threads a block: the chunks of a few MB spread over ~100 SMs' copy engines

_side: dict[int, tuple] = {}     # main stream pointer -> (side stream, fork event, join event)
_pending: set[int] = set()       # main streams whose side stream has work not yet joined


@cache
def _kernel():
    return get_kernel("l2_prefetch", "l2_prefetch_kernel")


def _device_arrays(tensors):
    """The device arrays of tensors (QuantTensors or arrays), 16-byte aligned as the bulk prefetch
    needs; None when any is on the host."""
    out = []
    for t in tensors:
        a = t if isinstance(t, np.ndarray) or hasattr(t, "__cuda_array_interface__") else t.data
        if isinstance(a, np.ndarray):
            return None
        if a.data.ptr % 16 == 0:
            out.append(a)
    return out


def prefetch_l2(tensors, max_bytes: int, delay_ns: int = 0) -> int:
    """Ask the first max_bytes of tensors' bytes (in the order given) into L2 from a side stream.
    Returns the bytes asked for (0 outside a static step or for host tensors)."""
    if max_bytes <= 0 or not overlapping():
        return 0
    arrays = _device_arrays(tensors)
    if not arrays:
        return 0
    import cupy

    main = cupy.cuda.get_current_stream()
    if main.ptr not in _side:
        _side[main.ptr] = (cupy.cuda.Stream(non_blocking=True), cupy.cuda.Event(disable_timing=True),
                           cupy.cuda.Event(disable_timing=True))
    side, fork, _ = _side[main.ptr]
    fork.record(main)
    side.wait_event(fork)
    asked = 0
    with side:
        for a in arrays:
            n = min(a.nbytes, max_bytes - asked) // 16 * 16
            if n <= 0:
                break
            blocks = -(-n // (CHUNK * THREADS))
            _kernel()((blocks,), (THREADS,), (a, np.int64(n), np.int32(CHUNK), np.int32(delay_ns)))
            asked += n
    _pending.add(main.ptr)
    return asked


def prefetch_join() -> None:
    """The current stream waits for its side stream's prefetches (no-op when none are pending)."""
    if not _pending:
        return
    import cupy

    main = cupy.cuda.get_current_stream()
    if main.ptr not in _pending:
        return
    side, _, join = _side[main.ptr]
    join.record(side)
    main.wait_event(join)
    _pending.discard(main.ptr)
