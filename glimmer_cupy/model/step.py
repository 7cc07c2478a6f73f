"""StepBatch: one step's tokens, from one or more sequences, as the decoder graph reads them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class StepBatch:
    """T tokens of S step-sequences; K of the tokens ask for logits.

    tokens, positions, cells, tok_seq: (T,) — the token id, its position in its sequence, the
    pool cell its K/V goes to, and the index of its sequence in this step.
    cell_table: (S, L) — position -> cell for each sequence, valid up to seq_lens (S,), which
    count the positions written by this step too. logit_rows: (K,) indices into the T tokens.
    visible: optional (T, L) bool, replaces causal visibility (non-causal or packed blocks).
    """

    tokens: np.ndarray
    positions: np.ndarray
    cells: np.ndarray
    tok_seq: np.ndarray
    cell_table: np.ndarray
    seq_lens: np.ndarray
    logit_rows: np.ndarray
    visible: np.ndarray | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])
