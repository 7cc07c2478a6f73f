"""Prefix cache: the K/V cells of finished sequences' token prefixes, kept for later requests that
begin with the same tokens (a shared system prompt, a conversation's earlier turns).

A sequence's computed tokens are cut into blocks of BLOCK tokens from position 0; block i is keyed
by (block i - 1's key, its tokens), so a key names its whole prefix, and a block's cells hold the
K/V of exactly those positions of any sequence that starts with that prefix. The cache owns one
reference of each cell it keeps (CellPool.share), so a block stays valid after its sequence frees
its own; the engine inserts a running sequence's blocks as they are computed, so a request
admitted while another is still decoding can share what that one has run. A new sequence takes
the longest chain of cached blocks its tokens begin with (never its last token, which must run to
give logits), sharing their cells, and computes only the rest.
Eviction, when the scheduler needs cells, drops least recently used blocks that no sequence shares
and no cached block extends, so every cached chain stays whole from position 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

from .cell_pool import CellPool
from .sequence import Sequence

BLOCK = 16


@dataclass
class Block:
    key: tuple
    cells: list[int]
    parent: tuple | None
    children: int = 0
    last_used: int = 0


@dataclass
class PrefixCache:
    pool: CellPool
    block: int = BLOCK
    blocks: dict = field(default_factory=dict)
    _clock: count = field(default_factory=count)
    _done: dict = field(default_factory=dict)    # sequence id -> (its blocks inserted, the last one's key)
    hits: int = 0                       # tokens taken from the cache, over all lookups

    @property
    def n_cells(self) -> int:
        """Cells the cache holds a reference to."""
        return len(self.blocks) * self.block

    def match(self, tokens: list[int]) -> list[Block]:
        """The longest chain of cached blocks that tokens begin with, leaving at least its last token."""
        chain, parent = [], None
        b = self.block
        for i in range(0, len(tokens) - 1 - b + 1, b):
            blk = self.blocks.get((parent, tuple(tokens[i:i + b])))
            if blk is None:
                break
            chain.append(blk)
            parent = blk.key
        return chain

    def attach(self, seq: Sequence, chain: list[Block]) -> None:
        """Give a sequence with no cells the cells of a chain match() found for its tokens."""
        assert seq.n_computed == 0, "attach: the sequence already has cells"
        now = next(self._clock)
        for blk in chain:
            self.pool.share(blk.cells)
            seq.add_cells(blk.cells)
            blk.last_used = now
        self.hits += len(chain) * self.block

    def insert(self, seq: Sequence) -> None:
        """Keep the full blocks of a sequence's computed tokens that are not cached yet, from where
        the last insert of this sequence stopped (so calling it after every step costs only the new
        blocks); call forget(seq) when the sequence frees its cells."""
        now = next(self._clock)
        n, parent = self._done.get(seq.id, (0, None))
        b = self.block
        for i in range(n * b, seq.n_computed - b + 1, b):
            key = (parent, tuple(seq.tokens[i:i + b]))
            blk = self.blocks.get(key)
            if blk is None:
                cells = seq.cells[i:i + b]
                self.pool.share(cells)
                blk = self.blocks[key] = Block(key, list(cells), parent)
                if parent is not None:
                    self.blocks[parent].children += 1
            blk.last_used = now
            parent, n = key, n + 1
        self._done[seq.id] = (n, parent)

    def forget(self, seq: Sequence) -> None:
        """A sequence is about to free its cells: its next insert starts from position 0."""
        self._done.pop(seq.id, None)

    def evict(self, free_needed: int, keep: list[Block] = ()) -> None:
        """Drop least recently used blocks that only the cache holds and no cached block extends,
        until the pool has free_needed free cells or nothing more can go. keep: blocks not to drop
        (a chain about to be attached)."""
        kept = {blk.key for blk in keep}
        owners = self.pool.owners
        while self.pool.n_free < free_needed:
            leaves = sorted((blk for blk in self.blocks.values() if blk.children == 0 and blk.key not in kept),
                            key=lambda blk: blk.last_used)
            dropped = False
            for blk in leaves:                            # shared ones are skipped as they come up
                if all(owners[c] == 1 for c in blk.cells):
                    self._drop(blk)
                    dropped = True
                    if self.pool.n_free >= free_needed:
                        return
            if not dropped:
                return

    def clear(self) -> None:
        """Drop every block (cells still shared by a sequence stay that sequence's)."""
        for blk in list(self.blocks.values()):
            self.pool.release(blk.cells)
        self.blocks.clear()

    def _drop(self, blk: Block) -> None:
        del self.blocks[blk.key]
        if blk.parent is not None:
            self.blocks[blk.parent].children -= 1
        self.pool.release(blk.cells)
