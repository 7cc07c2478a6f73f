"""The buffers of one static step shape, for CUDA graphs: what a captured step reads and writes.

A step of T tokens (T a static width, runtime/step_planner.py), K logit rows (padded likewise) and
cell tables L wide is one key. For each key, StaticStep holds, allocated once and reused by every
replay:
- a pinned host staging buffer of the step's int32 index arrays and its device twin (one copy
  per step, captured in the graph, so the graph reads whatever the host wrote before launch);
- the per-row sampling parameters (DeviceSamplingParams), rewritten only when they change;
- where the sampled (tokens, flags) go on the device and their pinned host copy (one copy,
  captured): the executor's buffers of the step's slot (runtime/pipeline.py's Slots), shared by
  every shape, so that the next step's feed finds them in one place;
- for a fed step, the previous slot's sampled tokens, which ops.feed_tokens_ reads (captured).

Padding: tokens past the step's own are pad_step's (id 0 at position 0, K/V to the scratch cell, a
sequence of length 0 that attends to nothing); logit rows past K repeat row 0 and their samples
are dropped. Table columns past a sequence's length are never read.
"""

from __future__ import annotations

import numpy as np

from ..model.step import StepBatch
from ..ops.sampling import GREEDY, DeviceSamplingParams
from .step_planner import pad_step

MIN_TABLE_WIDTH = 256     # cell-table widths are powers of two from here: few keys, little padding


def table_width(need: int, cap: int) -> int:
    """Static cell-table width for sequences of up to `need` cells: the next power of two from
    MIN_TABLE_WIDTH, at most cap (the pool's cell count, which no sequence exceeds)."""
    w = MIN_TABLE_WIDTH
    while w < need:
        w *= 2
    return max(min(w, cap), need)


def staging_fields(t: int, k: int, width: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of each int32 array in a static step's staging buffer."""
    s = t + 1                             # at most t sequences of the step's own, and one of padding
    return (("tokens", (t,)), ("positions", (t,)), ("cells", (t,)), ("tok_seq", (t,)), ("feed", (t,)),
            ("seq_lens", (s,)), ("logit_rows", (k,)), ("sample_pos", (k,)), ("cell_table", (s, width)))


class StaticStep:
    """Buffers for steps of up to t tokens, k logit rows and cell tables `width` wide.

    ids, ids_host: (2, rows) int32, device and pinned: sampled tokens and flags go to [:, :k].
    feed_from: the (rows,) device tokens a fed step's feed reads, or None (a step that feeds nothing)."""

    def __init__(self, t: int, k: int, width: int, ids, ids_host, feed_from=None):
        import cupy
        import cupyx

        self.t, self.k, self.width = t, k, width
        fields = staging_fields(t, k, width)
        n = sum(int(np.prod(shape)) for _, shape in fields)
        self.host = cupyx.empty_pinned((n,), np.int32)
        self.host[:] = 0
        self.dev = cupy.zeros(n, dtype=cupy.int32)
        self.h, self.d, at = {}, {}, 0
        for name, shape in fields:
            size = int(np.prod(shape))
            self.h[name] = self.host[at:at + size].reshape(shape)
            self.d[name] = self.dev[at:at + size].reshape(shape)
            at += size
        self.params = DeviceSamplingParams.empty(k)
        self.params_set = None            # the SamplingParams in self.params (frozen: equal is same)
        self.ids, self.ids_host, self.feed_from = ids, ids_host, feed_from
        self.logits = None                # the last run's (k, vocab) logits (in the graph: its output array)
        self.graph = None                 # captured on the second run (the first warms the kernels)
        self.runs = 0

    def device_step(self) -> StepBatch:
        d = self.d
        return StepBatch(tokens=d["tokens"], positions=d["positions"], cells=d["cells"], tok_seq=d["tok_seq"],
                         cell_table=d["cell_table"], seq_lens=d["seq_lens"], logit_rows=d["logit_rows"])

    def fill(self, step: StepBatch, params, positions, vocab: int, feed=None) -> None:
        """Write the step (already checked against the pool), padded to t tokens by pad_step, into
        the host staging buffer, and the parameters into their device arrays when they differ from
        the last step's (a decode loop passes the same objects: the list comparison stops at `is`).
        feed: (T,) int32 (checked), -1 on padding rows and when None."""
        h, k, n = self.h, len(step.logit_rows), step.n_tokens
        step = pad_step(step, self.t)
        s, w = step.cell_table.shape
        for name in ("tokens", "positions", "cells", "tok_seq"):
            h[name][:] = getattr(step, name)
        h["feed"][:n] = -1 if feed is None else feed
        h["feed"][n:] = -1
        h["seq_lens"][:s] = step.seq_lens
        h["seq_lens"][s:] = 0
        h["cell_table"][:s, :w] = step.cell_table
        h["logit_rows"][:k] = step.logit_rows
        h["logit_rows"][k:] = 0
        h["sample_pos"][:k] = positions
        h["sample_pos"][k:] = 0
        if self.k:
            params = list(params) + [GREEDY] * (self.k - k)
            if params != self.params_set:
                self.params.update(params, vocab)
                self.params_set = params

    def upload(self, stream) -> None:
        """Host staging -> device, on `stream` (captured into the graph)."""
        import cupy
        rt = cupy.cuda.runtime
        rt.memcpyAsync(self.dev.data.ptr, self.host.ctypes.data, self.host.nbytes, rt.memcpyHostToDevice, stream.ptr)

    def download(self, stream) -> None:
        """Sampled ids (tokens and flags, k each) -> pinned host memory, on `stream` (captured into
        the graph): one two-row copy."""
        import cupy
        rt = cupy.cuda.runtime
        pitch = self.ids.shape[1] * 4
        rt.memcpy2DAsync(self.ids_host.ctypes.data, pitch, self.ids.data.ptr, pitch, self.k * 4, 2,
                         rt.memcpyDeviceToHost, stream.ptr)
