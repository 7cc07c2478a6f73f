import numpy as np
import pytest

from glimmer_cupy.errors import GlimmerError
from glimmer_cupy.reference.sampling import GREEDY
from glimmer_cupy.runtime.cell_pool import SCRATCH_CELL, CellPool, PoolExhausted
from glimmer_cupy.runtime.sequence import Sequence
from glimmer_cupy.runtime.step_planner import plan_step


def test_alloc_share_release():
    pool = CellPool(6)
    a = pool.alloc(3)
    assert SCRATCH_CELL not in a and pool.n_free == 2
    pool.share(a)
    pool.release(a)
    assert pool.n_free == 2                      # still owned once
    pool.release(a)
    assert pool.n_free == 5
    with pytest.raises(GlimmerError):
        pool.release([a[0]])                     # not owned any more


def test_exhaustion_takes_nothing():
    pool = CellPool(4)
    pool.alloc(2)
    with pytest.raises(PoolExhausted, match="2 cells needed, 1 of 4 free"):
        pool.alloc(2)
    assert pool.n_free == 1


def test_plan_step_mixes_prefill_and_decode():
    pool = CellPool(32)
    a = Sequence([5, 6, 7, 8, 9], GREEDY)
    b = Sequence([1, 2], GREEDY)
    s1 = plan_step(pool, [(a, 3), (b, 2)])       # a: first chunk, b: whole prompt
    assert s1.tokens.tolist() == [5, 6, 7, 1, 2]
    assert s1.positions.tolist() == [0, 1, 2, 0, 1]
    assert s1.tok_seq.tolist() == [0, 0, 0, 1, 1]
    assert s1.logit_rows.tolist() == [4]         # only b finished its prompt
    assert s1.seq_lens.tolist() == [3, 2]
    b.tokens.append(42)
    s2 = plan_step(pool, [(b, 1), (a, 2)])
    assert s2.tokens.tolist() == [42, 8, 9] and s2.positions.tolist() == [2, 3, 4]
    assert s2.logit_rows.tolist() == [0, 2]
    assert s2.cell_table[1, :5].tolist() == a.cells and len(set(a.cells) | set(b.cells)) == 8


def test_plan_step_failure_leaves_state():
    pool = CellPool(4)
    a = Sequence([1, 2, 3, 4], GREEDY)
    with pytest.raises(PoolExhausted):
        plan_step(pool, [(a, 4)])
    assert a.cells == [] and pool.n_free == 3
    with pytest.raises(ValueError, match="pending"):
        plan_step(pool, [(a, 5)])


def test_clone_shares_and_rewind_frees():
    pool = CellPool(16)
    a = Sequence([1, 2, 3], GREEDY)
    plan_step(pool, [(a, 3)])
    b = a.clone(pool)
    assert b.cells == a.cells and np.all(pool.owners[a.cells] == 2)
    b.tokens += [9, 9]
    plan_step(pool, [(b, 2)])
    b.rewind(pool, 3)
    assert b.tokens == [1, 2, 3] and len(b.cells) == 3 and pool.n_free == 12
    a.free(pool)
    b.free(pool)
    assert pool.n_free == 15


def test_cell_row_follows_the_cells_through_growth_rewind_and_free():
    pool = CellPool(400)
    seq = Sequence(list(range(300)), GREEDY)
    for n in (1, 70, 5, 100, 1):                              # grows past the 64-entry start
        seq.add_cells(pool.alloc(n))
        assert seq.cell_row().tolist() == seq.cells
    seq.rewind(pool, 30)
    assert seq.cell_row().tolist() == seq.cells and len(seq.cells) == 30
    seq.add_cells(pool.alloc(4))                              # same length as before the rewind, other cells
    assert seq.cell_row().tolist() == seq.cells
    twin = seq.clone(pool)
    assert twin.cell_row().tolist() == seq.cells
    seq.free(pool)
    assert seq.cell_row().tolist() == [] and twin.cell_row().tolist() == twin.cells
