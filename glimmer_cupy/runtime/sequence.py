"""A sequence: its tokens, its cells, how far its KV is computed, and its sampling parameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

import numpy as np

from ..reference.sampling import SamplingParams
from .cell_pool import CellPool

_ids = count()


@dataclass
class Sequence:
    tokens: list[int]                       # prompt, then generated tokens
    params: SamplingParams
    n_prompt: int = 0
    cells: list[int] = field(default_factory=list)   # position -> cell, for computed positions
    id: int = field(default_factory=lambda: next(_ids))
    # cells as int32, grown with them: a decode step's cell table row without converting the whole
    # list each step (O(context) per token). Change cells only through add_cells, rewind and free.
    _cell_buf: np.ndarray = field(default_factory=lambda: np.zeros(64, np.int32), repr=False, compare=False)
    _cell_n: int = field(default=0, repr=False, compare=False)

    def __post_init__(self):
        self.n_prompt = self.n_prompt or len(self.tokens)

    @property
    def n_computed(self) -> int:
        """Positions whose K/V are in the pool."""
        return len(self.cells)

    @property
    def n_pending(self) -> int:
        """Tokens not yet run through the model (the prompt's rest, or the last sampled token)."""
        return len(self.tokens) - len(self.cells)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.n_prompt:]

    def add_cells(self, cells: list[int]) -> None:
        """The K/V of the next len(cells) positions now live in these cells."""
        self.cells += cells

    def cell_row(self) -> np.ndarray:
        """The cells as an int32 array (a view, valid until the cells change)."""
        n = len(self.cells)
        if n > self._cell_buf.size:
            grown = np.zeros(max(n, 2 * self._cell_buf.size), np.int32)
            grown[:self._cell_n] = self._cell_buf[:self._cell_n]
            self._cell_buf = grown
        self._cell_n = min(self._cell_n, n)
        if self._cell_n < n:
            self._cell_buf[self._cell_n:n] = self.cells[self._cell_n:n]
            self._cell_n = n
        return self._cell_buf[:n]

    def clone(self, pool: CellPool) -> Sequence:
        """A new sequence sharing this one's computed cells."""
        pool.share(self.cells)
        return Sequence(list(self.tokens), self.params, self.n_prompt, list(self.cells))

    def free(self, pool: CellPool) -> None:
        pool.release(self.cells)
        self.cells = []
        self._cell_n = 0

    def rewind(self, pool: CellPool, n_positions: int) -> None:
        """Forget positions n_positions.. (their tokens and cells)."""
        pool.release(self.cells[n_positions:])
        del self.cells[n_positions:]
        self._cell_n = min(self._cell_n, n_positions)
        del self.tokens[max(n_positions, self.n_prompt):]
