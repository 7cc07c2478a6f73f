"""The KV cell pool's bookkeeping: which cells are free, and how many sequences own each.

Every layer has one pool of the same number of cells; a cell holds one position's K and V
for all KV heads. A sequence owns a list of cells (its cell table, position -> cell). Cloning
a sequence shares its cells (the owner count goes up); a cell returns to the free list when
its last owner lets go. A position's K/V is written once, by the sequence that allocated the
cell, so shared cells are never written. Cell 0 is the scratch cell: padding rows write there
and nobody reads it.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..errors import GlimmerError

SCRATCH_CELL = 0


class PoolExhausted(GlimmerError):
    """Not enough free cells; the scheduler queues or rejects the request."""


class CellPool:
    def __init__(self, n_cells: int):
        if n_cells < 2:
            raise GlimmerError(f"a KV pool needs at least 2 cells (one is scratch), got {n_cells}")
        self.n_cells = n_cells
        self.owners = np.zeros(n_cells, np.int32)
        self.owners[SCRATCH_CELL] = 1
        self._free = deque(range(1, n_cells))

    @property
    def n_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        """n fresh cells, each owned once; PoolExhausted (nothing taken) when fewer are free."""
        if n > len(self._free):
            raise PoolExhausted(f"KV pool exhausted: {n} cells needed, {len(self._free)} of {self.n_cells} free")
        cells = [self._free.popleft() for _ in range(n)]
        self.owners[cells] = 1
        return cells

    def share(self, cells: list[int]) -> None:
        """Another owner for each cell (a cloned sequence, a cached prefix)."""
        if cells:
            self.owners[cells] += 1

    def release(self, cells: list[int]) -> None:
        """Drop one owner of each cell; cells left unowned become free."""
        for c in cells:
            if c == SCRATCH_CELL or self.owners[c] <= 0:
                raise GlimmerError(f"KV pool: release of cell {c}, which is not owned")
            self.owners[c] -= 1
            if self.owners[c] == 0:
                self._free.append(c)
