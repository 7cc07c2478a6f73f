"""Build a StepBatch from chunks of sequences: allocate their cells and lay out the arrays."""

from __future__ import annotations

import numpy as np

from ..model.step import StepBatch
from .cell_pool import SCRATCH_CELL, CellPool
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
        seq.add_cells(cells[at:at + n])
        at += n
        if seq.n_pending == 0:
            logit_rows.append(len(tokens) - 1)
    width = max(len(seq.cells) for seq, _ in chunks)
    table = np.zeros((len(chunks), width), np.int32)
    for s, (seq, _) in enumerate(chunks):
        table[s, :len(seq.cells)] = seq.cell_row()
    return StepBatch(
        tokens=np.array(tokens, np.int32), positions=np.array(positions, np.int32),
        cells=np.array(cells, np.int32), tok_seq=np.array(tok_seq, np.int32), cell_table=table,
        seq_lens=np.array([len(seq.cells) for seq, _ in chunks], np.int32),
        logit_rows=np.array(logit_rows, np.int32))


# Static step widths: a step pads up to the next one, so the GPU executor captures one graph per
# width and replays it. Wider steps run eagerly, up to MAX_STEP_TOKENS; wider still are sliced
# (slice_chunks) before planning. A prompt runs in eager steps of up to MAX_STEP_TOKENS, not in
# graph-wide ones: on the H200 (f049b01) a 512-token prompt in 64-token graph steps prefilled at
# 18.4k tok/s on Qwen3-0.6B and 2.2k on Qwen3-8B, against 30.4k and 17.6k in one eager step
# (graph steps must use the mma bucket; eager wide steps use cuBLAS).
STEP_WIDTHS = (1, 2, 4, 8, 16, 32, 64)
MAX_STEP_TOKENS = 512


def run_width(n_tokens: int) -> int:
    """The width a step of n_tokens runs at: its static width, or n_tokens for an eager step."""
    return step_width(n_tokens) if n_tokens <= STEP_WIDTHS[-1] else n_tokens


def step_width(n_tokens: int) -> int:
    """The smallest static width that holds n_tokens."""
    for w in STEP_WIDTHS:
        if n_tokens <= w:
            return w
    raise ValueError(f"step_width: {n_tokens} tokens exceed the widest static step of {STEP_WIDTHS[-1]}; slice it")


def pad_step(step: StepBatch, width: int) -> StepBatch:
    """step padded to width tokens. The padding tokens (id 0, position 0) form one extra
    step-sequence whose table row holds only the scratch cell and whose seq_len is 0: they write
    their K/V to the scratch cell, attend to nothing (the reference gives zeros, not NaN), and are
    never logit rows, so real rows' K/V, attention and logits are untouched."""
    t, pad = step.n_tokens, width - step.n_tokens
    if pad < 0:
        raise ValueError(f"pad_step: a step of {t} tokens does not fit width {width}")
    if pad == 0:
        return step
    s, L = step.cell_table.shape
    fill = lambda a, v: np.concatenate([a, np.full(pad, v, a.dtype)])
    visible = None
    if step.visible is not None:
        visible = np.concatenate([step.visible, np.zeros((pad, L), bool)])
    return StepBatch(
        tokens=fill(step.tokens, 0), positions=fill(step.positions, 0),
        cells=fill(step.cells, SCRATCH_CELL), tok_seq=fill(step.tok_seq, s),
        cell_table=np.concatenate([step.cell_table, np.full((1, L), SCRATCH_CELL, np.int32)]),
        seq_lens=np.concatenate([step.seq_lens, np.zeros(1, np.int32)]), logit_rows=step.logit_rows, visible=visible)


def slice_chunks(chunks: list[tuple[Sequence, int]], width: int) -> list[list[tuple[Sequence, int]]]:
    """Cut one step's chunks into steps of at most width tokens, in order. A chunk cut in two runs
    its first part in the earlier step, so its K/V is in the pool when the rest attends to it."""
    steps, cur, room = [], [], width
    for seq, n in chunks:
        while n:
            take = min(n, room)
            cur.append((seq, take))
            n -= take
            room -= take
            if room == 0:
                steps.append(cur)
                cur, room = [], width
    if cur:
        steps.append(cur)
    return steps
