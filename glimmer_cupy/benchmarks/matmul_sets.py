"""What the quantized-matmul A/B scripts (bench/ab_mma_*.py) share: device weights in enough copies
that a timed pass reads them from DRAM (timing.n_sets), and the table's M = 1 time on them, the
denominator of issue 3's M = 16 bar."""

from __future__ import annotations

import numpy as np

from .. import ops
from ..kernels.launch import overlapped
from ..ops.matmul import TRAITS, quantize_x
from ..ops.q8 import Q8Rows
from ..weights.quant_tensor import QType, QuantTensor, block_geometry
from ..weights.random_blocks import random_blocks
from .timing import n_sets, time_us


def parse_shapes(text: str, default) -> list[tuple[int, ...]]:
    """A --shapes argument "NxK,NxK,..." as (N, K) tuples; empty: default."""
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s] or list(default)


def weight_sets(qtype: QType, n: int, k: int, rng: np.random.Generator, std: float = 0.02) -> list[QuantTensor]:
    """Random (n, k) matrices of qtype on the device, as many as rotate past L2."""
    import cupy
    block, nbytes = block_geometry(qtype)
    return [QuantTensor("w", qtype, (n, k), cupy.asarray(random_blocks(qtype, n, k, rng, std)))
            for _ in range(n_sets(n * k // block * nbytes))]


def m1_us(ws: list[QuantTensor], rng: np.random.Generator, launches: int, reps: int) -> float:
    """The table's time at M = 1 over the sets (x's int8 codes made beforehand, as the op before the
    matmul makes them in a model), in a PDL graph."""
    import cupy
    n, k = ws[0].shape
    xs = [cupy.asarray(rng.normal(0, 1, (1, k)).astype(np.float32)) for _ in ws]
    codes = [Q8Rows(x, *quantize_x(x, TRAITS[ws[0].qtype])) for x in xs]
    outs = [cupy.empty((1, n), np.float32) for _ in ws]
    with overlapped(True):
        return time_us(lambda i: ops.quant_matmul(codes[i], ws[i], out=outs[i]), len(ws), launches, reps)[0]
