"""Decode steps launched one ahead: step i+1 is planned and launched while step i runs, and its
input tokens are taken on the device from step i's samples, so the device does not wait for the
host between steps.

Everything of a decode step but its input token is known on the host before the token is:
position, cell, cell table, lengths. So the host plans step i+1 with a placeholder id and a feed:
per token row, -1 (use the host's id) or j (take row j of the ids the previous launch sampled).
The executor resolves the feed before the forward (CUDA: ops.feed_tokens_ in the step's graph,
reading a fixed device buffer; NumPy: the same op on the host's last tokens). Only token ids come
back to the host, and the host waits for step i's only after step i+1 is launched.

- check_feed: the feed rule, checked on the host (the kernel reads it unchecked).
- Ready: the handle of a step that ran synchronously; CUDA launches return one of their own.
- Slots: which of two sets of step buffers a launch uses (runtime/cuda_executor.py).
- decode_steps: the loop, for one sequence (generate) or a batch decoding in lockstep (the
  decode benchmark). Closing it early (a stop token) discards the step launched ahead.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..errors import GlimmerError
from .cell_pool import CellPool
from .sequence import Sequence
from .step_planner import plan_step

FROM_HOST = -1        # a feed entry: the row's token is the host's
PLACEHOLDER = 0       # a fed row's host id: any valid id (check_step reads it; the feed replaces it)


def check_feed(feed, n_tokens: int, prev_rows: int) -> np.ndarray | None:
    """feed as int32 (n_tokens,), or None when no row takes a sampled id. prev_rows: the rows the
    previous launch sampled (0: none to take). GlimmerError naming the bound and the values."""
    if feed is None:
        return None
    feed = np.asarray(feed)
    if feed.shape != (n_tokens,) or feed.dtype.kind not in "iu":
        raise GlimmerError(f"step: feed must be integers of shape ({n_tokens},), got {feed.dtype} {feed.shape}")
    v = feed.tolist()
    lo, hi = (min(v), max(v)) if v else (FROM_HOST, FROM_HOST)
    if hi == FROM_HOST and lo == FROM_HOST:
        return None
    if lo < FROM_HOST or hi >= prev_rows:
        raise GlimmerError(f"step: feed must be in [-1, {prev_rows}) (-1: the host's token; j: row j of the "
                           f"{prev_rows} the previous step sampled), got {lo}..{hi}")
    return feed.astype(np.int32, copy=False)


class Ready:
    """A step that has run: its sampled (tokens, flags), int32 (K,)."""

    __slots__ = ("tokens", "flags")
    done = True

    def __init__(self, tokens: np.ndarray, flags: np.ndarray):
        self.tokens, self.flags = tokens, flags

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        return self.tokens, self.flags


class Slots:
    """Which of two sets of step buffers (host staging, sampled ids) the next launch uses.

    A launch rewrites its slot's pinned staging and pinned ids, which the slot's previous launch
    reads and writes when it executes on the device. So a launch takes the slot its predecessor
    did not use when that one is still in flight or when the launch feeds on its samples (they are
    in that slot's buffer), and first waits for the slot's previous launch (two launches back: in a
    pipeline one step deep it is done). A caller that reads every step before launching the next
    (run_step) always gets slot 0: the same buffers, and graphs, as without pipelining.

    handles are anything with `done` (its result is read) and `result()` (waits, reads, keeps)."""

    def __init__(self):
        self.last = [None, None]          # each slot's latest launch
        self.prev: int | None = None      # the slot of the latest launch
        self.prev_rows = 0                # rows the latest launch sampled where a feed can take them

    def take(self, fed: bool) -> int:
        """The slot for the next launch, free to rewrite (its previous launch's ids are read)."""
        p = self.prev
        if p is None:
            s = 0
        elif fed or not self.last[p].done:
            s = 1 - p                     # p holds the samples fed on, or is still in flight
        else:
            s = p
        if self.last[s] is not None and not self.last[s].done:
            self.last[s].result()
        return s

    def launched(self, slot: int, handle, rows: int) -> None:
        self.last[slot], self.prev, self.prev_rows = handle, slot, rows

    def forget(self) -> None:
        """A step ran outside the slots (CudaExecutor.logits): nothing for the next to feed on."""
        self.prev_rows = 0


def decode_steps(executor, pool: CellPool, seqs: list[Sequence], n_steps: int,
                 overlap: bool = True) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """n_steps decode steps of one token for every sequence (each has one pending token, its last
    sampled one); yields each step's (tokens, flags) after appending the tokens to the sequences.
    Each sequence samples with its own params at the new token's position, as run_step does.

    overlap: step i+1 is launched before step i's tokens are read (executor.launch with a feed:
    row j takes step i's sampled row j). Closing the generator while step i+1 is launched ahead
    of need (after a stop token) discards it: its cells go back to the pool and the sequences are
    as if it had never been planned. It still runs on the device, into those cells; any later
    step runs after it on the executor's stream and writes a cell before anything reads it."""
    chunks = [(s, 1) for s in seqs]
    feed = np.arange(len(seqs), dtype=np.int32)

    def launch(fed: bool):
        step = plan_step(pool, chunks)
        return executor.launch(step, [s.params for s in seqs], [len(s.tokens) for s in seqs],
                               feed if fed else None)

    ahead = None
    try:
        for i in range(n_steps):
            now = ahead if ahead is not None else launch(False)
            ahead = None
            if overlap and i + 1 < n_steps:
                for s in seqs:
                    s.tokens.append(PLACEHOLDER)          # step i's token, still on the device
                ahead = launch(True)
            tokens, flags = now.result()
            for s, t in zip(seqs, tokens.tolist()):
                if ahead is not None:
                    s.tokens[-1] = t
                else:
                    s.tokens.append(t)
            yield tokens, flags
    finally:
        if ahead is not None:
            for s in seqs:                                # forget the position ahead computed
                t = s.tokens[-1]
                s.rewind(pool, s.n_computed - 1)
                s.tokens.append(t)
