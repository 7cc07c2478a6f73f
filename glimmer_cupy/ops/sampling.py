"""Token selection per row with per-row parameters (rules in reference/sampling.py; kernels:
cuda_src/sampling.cu).

On the device the parameters live in device arrays, one entry per row, so a captured decode step
replays with new temperatures, seeds and positions written into the same arrays, and nothing
waits on the host. `sample_rows` takes them as either
- a list of `SamplingParams` (checked here, uploaded into fresh arrays: for eager calls), or
- a `DeviceSamplingParams` (arrays already on the device, filled by `DeviceSamplingParams.update`,
  which checks the values on the host before it copies them; for graphs).
Positions likewise: a host sequence of ints (checked, uploaded) or an int32 device array.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels.build import get_kernel
from ..reference import sampling as ref
from ..reference.sampling import GREEDY, SamplingParams
from ._check import F32, I32, check, check_out, fail
from ._dispatch import host_result, is_host

__all__ = ["GREEDY", "DeviceSamplingParams", "SamplingParams", "argmax", "sample_rows"]

THREADS = 1024                      # kThreads in sampling.cu
U64 = np.dtype(np.uint64)

# (largest rows, blocks per row): a row is split over a cluster of C blocks so that a few rows
# still occupy many of the 132 SMs (one 1024-thread block fits an SM); from 65 rows on, one block
# per row already fills the device. Edges set from the SM count, not yet measured.
CLUSTER = ((16, 8), (32, 4), (64, 2), (None, 1))


def cluster_size(rows: int) -> int:
    for edge, c in CLUSTER:
        if edge is None or rows <= edge:
            return c
    raise AssertionError("unreachable")


def _kernel(name: str):
    return get_kernel("sampling", name)


def argmax(logits, *, out=None):
    """(rows, vocab) -> (rows,) int32, ties to the lowest id, NaN read as -inf."""
    if is_host(logits):
        return host_result(ref.argmax(logits), out)
    import cupy

    check(logits, "argmax", "logits", dtypes=(F32,), shape=("rows", "vocab"))
    rows, vocab = logits.shape
    if vocab == 0:
        raise fail("argmax", "logits", "at least one column", "(rows, 0)")
    if out is None:
        out = cupy.empty(rows, dtype=cupy.int32)
    check_out(out, "argmax", (rows,), I32, like=logits)
    if rows:
        c = cluster_size(rows)
        _kernel(f"argmax_c{c}")((rows * c,), (THREADS,), (out, logits, np.int32(vocab)))
    return out


def check_params(params, rows: int, vocab: int, op: str = "sample_rows") -> None:
    """Raise OpArgumentError (a ValueError) naming the first bad field of a list of SamplingParams."""
    if len(params) != rows:
        raise fail(op, "params", f"one SamplingParams per row ({rows})", f"{len(params)}")
    for r, p in enumerate(params):
        name = f"params[{r}]"
        if not isinstance(p, SamplingParams):
            raise fail(op, name, "a SamplingParams", type(p).__name__)
        if not (np.isfinite(p.temperature) and p.temperature >= 0):
            raise fail(op, f"{name}.temperature", "a finite number >= 0", p.temperature)
        if not 0 <= p.top_k <= vocab:
            raise fail(op, f"{name}.top_k", f"in [0, {vocab}]", p.top_k)
        if not 0 < p.top_p <= 1:
            raise fail(op, f"{name}.top_p", "in (0, 1]", p.top_p)
        if not 0 <= p.min_p < 1:
            raise fail(op, f"{name}.min_p", "in [0, 1)", p.min_p)
        if not 0 <= p.seed < 2 ** 64:
            raise fail(op, f"{name}.seed", "in [0, 2^64)", p.seed)


def host_positions(positions, rows: int, op: str = "sample_rows") -> np.ndarray:
    """A host sequence of `rows` positions (RNG counters) checked and as int32, or OpArgumentError."""
    pos = np.asarray(positions)
    if pos.size == 0 and pos.ndim == 1:
        pos = pos.astype(np.int32)                     # an empty list has no integer dtype to check
    if pos.shape != (rows,) or pos.dtype.kind not in "iu":
        raise fail(op, "positions", f"{rows} integers", f"{pos.dtype.name} {pos.shape}")
    if rows and (pos.min() < 0 or pos.max() >= 2 ** 31):
        raise fail(op, "positions", "in [0, 2^31)", int(pos.min() if pos.min() < 0 else pos.max()))
    return pos.astype(np.int32)


@dataclass
class DeviceSamplingParams:
    """Per-row sampling parameters as device arrays of length `rows`: temperature float32, top_k
    int32, top_p float32, min_p float32, seed uint64. The kernel reads them as they are, so a
    graph replays with whatever they hold; write them through `update` (which checks)."""
    temperature: object
    top_k: object
    top_p: object
    min_p: object
    seed: object

    FIELDS = (("temperature", F32), ("top_k", I32), ("top_p", F32), ("min_p", F32), ("seed", U64))

    @classmethod
    def empty(cls, rows: int) -> DeviceSamplingParams:
        """Arrays for `rows` rows, all greedy until updated."""
        import cupy
        d = cls(*(cupy.zeros(rows, dtype=dt) for _, dt in cls.FIELDS))
        d.top_p.fill(1.0)
        return d

    @classmethod
    def from_params(cls, params, vocab: int) -> DeviceSamplingParams:
        d = cls.empty(len(params))
        d.update(params, vocab)
        return d

    @property
    def rows(self) -> int:
        return int(self.temperature.shape[0])

    def update(self, params, vocab: int) -> None:
        """Check a list of SamplingParams on the host, then copy it into the arrays (current stream)."""
        check_params(params, self.rows, vocab)
        for name, dt in self.FIELDS:
            getattr(self, name).set(np.array([getattr(p, name) for p in params], dtype=dt))

    def check(self, rows: int, like, op: str = "sample_rows") -> None:
        for name, dt in self.FIELDS:
            check(getattr(self, name), op, f"params.{name}", dtypes=(dt,), shape=(rows,), like=like)


def sample_rows(logits, params, positions, *, out=None, blocks_per_row: int | None = None,
                short_path: bool = True):
    """(rows, vocab) logits -> (tokens int32, flags int32), one set of parameters and position per
    row. On CuPy logits, params is a list of SamplingParams or a DeviceSamplingParams, positions a
    host sequence or an int32 device array, out an optional (tokens, flags) pair of int32 (rows,).
    blocks_per_row (tests, benchmarks) overrides the CLUSTER table: 1, 2, 4 or 8. short_path=False
    (tests, benchmarks) sends rows with top-k <= 256 through the radix-select path as well; the
    tokens are the same either way (cuda_src/sampling_topk.cuh)."""
    if is_host(logits):
        tokens, flags = ref.sample_rows(logits, params, positions)
        if out is None:
            return tokens, flags
        return host_result(tokens, out[0]), host_result(flags, out[1])
    import cupy

    op = "sample_rows"
    check(logits, op, "logits", dtypes=(F32,), shape=("rows", "vocab"))
    rows, vocab = logits.shape
    if vocab == 0:
        raise fail(op, "logits", "at least one column", "(rows, 0)")
    if isinstance(params, DeviceSamplingParams):
        params.check(rows, logits)
    else:
        params = DeviceSamplingParams.from_params(list(params), vocab)
    if isinstance(positions, cupy.ndarray):
        check(positions, op, "positions", dtypes=(I32,), shape=(rows,), like=logits)
    else:
        positions = cupy.asarray(host_positions(positions, rows))
    if out is None:
        out = (cupy.empty(rows, dtype=cupy.int32), cupy.empty(rows, dtype=cupy.int32))
    tokens, flags = out
    check_out(tokens, op, (rows,), I32, like=logits)
    check_out(flags, op, (rows,), I32, like=logits)
    c = blocks_per_row or cluster_size(rows)
    if c not in (1, 2, 4, 8):
        raise fail(op, "blocks_per_row", "1, 2, 4 or 8", c)
    if rows:
        _kernel(f"sample_rows_c{c}")(
            (rows * c,), (THREADS,),
            (tokens, flags, logits, params.temperature, params.top_k, params.top_p, params.min_p,
             params.seed, positions, np.int32(vocab), np.int32(bool(short_path))))
    return tokens, flags
