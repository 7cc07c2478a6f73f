"""Build a StepBatch from chunks of sequences: allocate their cells and lay out the arrays."""

from __future__ import annotations

import numpy as np

from ..model.step import StepBatch
from .cell_pool import CellPool
from .sequence import Sequence


def plan_step(pool: CellPool, chunks: list[tuple[Sequence, int]]) -> StepBatch:
    """chunks: (sequence, n) runs the next n pending tokens of each sequence; every chunk that
    reaches the end of its sequence's tokens asks for logits at its last token.

    Cells are allocated for all chunks or for none (PoolExhausted leaves the pool as it was).
    """
    for seq, n in chunks:
        if not 0 < n <= seq.n_pending:
            raise ValueError(f"plan_step: sequence {seq.id} has {seq.n_pending} pending tokens, asked to run {n}")
    cells = pool.alloc(sum(n for _, n in chunks))
    tokens, positions, tok_seq, logit_rows = [], [], [], []
    at = 0
    for s, (seq, n) in enumerate(chunks):
        start = seq.n_computed
        tokens += seq.tokens[start:start + n]
        positions += range(start, start + n)
        tok_seq += [s] * n
        seq.cells += cells[at:at + n]
        at += n
        if seq.n_pending == 0:
            logit_rows.append(len(tokens) - 1)
    width = max(len(seq.cells) for seq, _ in chunks)
    table = np.zeros((len(chunks), width), np.int32)
    for s, (seq, _) in enumerate(chunks):
        table[s, :len(seq.cells)] = seq.cells
    return StepBatch(
        tokens=np.array(tokens, np.int32), positions=np.array(positions, np.int32),
        cells=np.array(cells, np.int32), tok_seq=np.array(tok_seq, np.int32), cell_table=table,
        seq_lens=np.array([len(seq.cells) for seq, _ in chunks], np.int32),
        logit_rows=np.array(logit_rows, np.int32))
