"""A sequence: its tokens, its cells, how far its KV is computed, and its sampling parameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

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

    def clone(self, pool: CellPool) -> "Sequence":
        """A new sequence sharing this one's computed cells."""
        pool.share(self.cells)
        return Sequence(list(self.tokens), self.params, self.n_prompt, list(self.cells))

    def free(self, pool: CellPool) -> None:
        pool.release(self.cells)
        self.cells = []

    def rewind(self, pool: CellPool, n_positions: int) -> None:
        """Forget positions n_positions.. (their tokens and cells)."""
        pool.release(self.cells[n_positions:])
        del self.cells[n_positions:]
        del self.tokens[max(n_positions, self.n_prompt):]
