"""runtime/prefix_cache.py: finished sequences' prefix blocks kept and reused by later requests that
begin with the same tokens, and dropped (least recently used, unshared leaves first) when cells are
needed. Against the scheduler's fake model (test_scheduler.py) and the tiny NumPy model: the same
tokens as without the cache, fewer prompt tokens computed, and no cell lost."""

from types import SimpleNamespace

import pytest
from test_scheduler import CONTEXT, VOCAB, FakeExecutor, expected

from glimmer_cupy.runtime.cell_pool import CellPool
from glimmer_cupy.runtime.engine import Engine
from glimmer_cupy.runtime.prefix_cache import BLOCK, PrefixCache
from glimmer_cupy.runtime.scheduler import Request
from glimmer_cupy.runtime.sequence import Sequence


def computed(pool: CellPool, tokens: list[int], n: int) -> Sequence:
    """A sequence whose first n tokens have cells (as if run)."""
    seq = Sequence(list(tokens), None)
    seq.add_cells(pool.alloc(n))
    return seq


def test_blocks_are_keyed_by_their_whole_prefix():
    pool = CellPool(200)
    cache = PrefixCache(pool)
    a = computed(pool, list(range(40)), 40)                  # two full blocks and 8 tokens
    cache.insert(a)
    assert len(cache.blocks) == 2 and cache.n_cells == 2 * BLOCK
    a.free(pool)                                             # the cache's references keep them
    assert pool.n_free == 199 - 2 * BLOCK
    assert [blk.cells for blk in cache.match(list(range(40)) + [7])] == [a_cells for a_cells in
                                                                         (list(range(1, 17)), list(range(17, 33)))]
    assert len(cache.match(list(range(33)))) == 2             # 32 cached, the 33rd runs
    assert len(cache.match(list(range(32)))) == 1             # the last token is never taken
    assert cache.match([0] * 16 + list(range(16, 40))) == []  # block 1's tokens after another block 0
    other = list(range(16)) + [99] * 20
    assert len(cache.match(other)) == 1                       # block 0 only
    seq = Sequence(other, None)
    cache.attach(seq, cache.match(other))
    assert seq.n_computed == BLOCK and seq.n_pending == len(other) - BLOCK and cache.hits == BLOCK
    assert all(pool.owners[c] == 2 for c in seq.cells)


def test_eviction_drops_unshared_leaves_least_recently_used_first():
    pool = CellPool(1 + 5 * BLOCK)
    cache = PrefixCache(pool)
    x = computed(pool, [1] * 32, 32)                          # chain x0 <- x1
    cache.insert(x)
    x.free(pool)
    y = computed(pool, [2] * 16, 16)                          # y0, used later than x
    cache.insert(y)
    y.free(pool)
    user = Sequence([1] * 20, None)
    cache.attach(user, cache.match(user.tokens))              # x0 shared by a running sequence
    assert pool.n_free == 2 * BLOCK
    cache.evict(3 * BLOCK)                                    # x1 (a leaf, least recent) goes first
    assert sorted(b.key[1][0] for b in cache.blocks.values()) == [1, 2] and pool.n_free == 3 * BLOCK
    cache.evict(5 * BLOCK)                                    # y0 next; x0 is shared: it stays
    assert [b.key[1][0] for b in cache.blocks.values()] == [1] and pool.n_free == 4 * BLOCK
    z = computed(pool, [3] * 16, 16)
    cache.insert(z)
    z.free(pool)
    cache.evict(5 * BLOCK, keep=cache.match([3] * 17))        # kept for an admission: not dropped
    assert len(cache.blocks) == 2
    user.free(pool)
    cache.clear()
    assert pool.n_free == 5 * BLOCK and not cache.blocks


def engine(n_cells=400, budget=64, cache=True):
    dec = SimpleNamespace(cfg=SimpleNamespace(context=CONTEXT, vocab=VOCAB))
    eng = Engine(dec, n_cells, budget, executor=FakeExecutor(), prefix_cache=cache)
    return eng


def prompt_tokens_run(eng) -> int:
    return sum(len(step.tokens) for step in eng.executor.steps)


def test_a_later_request_computes_only_past_the_shared_prefix():
    system = [(7 * i + 3) % VOCAB for i in range(50)]
    first, second = Request(system + [1, 2, 3], 5, id="a"), Request(system + [4, 5], 6, id="b")
    runs = {}
    for cache in (False, True):
        eng = engine(cache=cache)
        res = {r.id: r for r in eng.generate([first])}
        before = prompt_tokens_run(eng)
        res.update({r.id: r for r in eng.generate([second])})
        runs[cache] = prompt_tokens_run(eng) - before
        assert res["a"].tokens == expected(first) and res["b"].tokens == expected(second)
        cached = eng.cache.n_cells if cache else 0
        assert eng.pool.n_free + cached == 399                # every cell free or the cache's
    assert runs[False] - runs[True] == 48                     # three blocks of the 50 shared tokens
    # a request whose prompt continues the first's whole exchange takes its generated tokens' blocks too
    eng = engine()
    eng.generate([first])
    follow = Request(first.prompt + expected(first) + [9] * 10, 3, id="c")
    assert eng.generate([follow])[0].tokens == expected(follow)
    assert eng.cache.hits == 48                               # 58 tokens computed: three blocks


def test_a_small_pool_evicts_and_still_completes_everything():
    reqs = [Request([(5 * i + j) % VOCAB for j in range(30)] + [i] * 9, 12, id=i) for i in range(12)]
    want = {r.id: expected(r) for r in reqs}
    eng = engine(n_cells=81, budget=16)                       # 80 cells: a few requests at a time
    res = eng.generate(reqs + [Request(reqs[0].prompt, 5, id="again")])
    assert {r.id: r.tokens for r in res if r.id != "again"} == want
    assert res[-1].tokens == expected(reqs[0])[:5]
    assert eng.pool.n_free + eng.cache.n_cells == 80


@pytest.mark.parametrize("shared", [False, True], ids=["distinct", "shared"])
def test_under_pressure_the_cache_never_costs_work(shared):
    """Twelve requests through 80 cells, preempting: with the cache, a preempted sequence's
    recompute takes back its own blocks, and requests admitted while others run share their
    prompt's blocks; fewer tokens computed and no more steps, the same tokens, no cell lost."""
    head = (lambda i: [(3 * j) % VOCAB for j in range(30)]) if shared else \
        (lambda i: [(5 * i + j) % VOCAB for j in range(30)])
    reqs = [Request(head(i) + [i] * 9, 12, id=i) for i in range(12)]
    work = {}
    for cache in (False, True):
        eng = engine(n_cells=81, budget=16, cache=cache)
        res = eng.generate([Request(r.prompt, r.max_new, id=r.id) for r in reqs])
        assert [r.tokens for r in res] == [expected(r) for r in reqs]
        assert eng.pool.n_free + (eng.cache.n_cells if cache else 0) == 80
        work[cache] = prompt_tokens_run(eng), len(eng.executor.steps)
    assert work[True][0] < work[False][0] and work[True][1] <= work[False][1]
    if shared:
        assert work[True][0] < 0.6 * work[False][0]          # 514 tokens against 1024


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from gguf_factory import tiny_model

    from glimmer_cupy.model.model import load_model
    return load_model(tiny_model(tmp_path_factory.mktemp("pc") / "llama.gguf", "llama"))


def test_the_numpy_model_gives_the_same_tokens_with_the_cache(model):
    from glimmer_cupy.reference.sampling import GREEDY, SamplingParams

    shared = [(11 * i + 5) % 300 for i in range(37)]
    reqs = [Request(shared + [i, i + 1], 6, GREEDY if i % 2 else SamplingParams(0.9, 40, 0.95, seed=i), id=i)
            for i in range(6)]
    plain = Engine(model.decoder, 256).generate(reqs)
    eng = Engine(model.decoder, 256, budget=16, prefix_cache=True)
    cached = eng.generate(reqs[:1]) + eng.generate(reqs[1:])
    assert [r.tokens for r in cached] == [r.tokens for r in plain]
    assert eng.cache.hits == 5 * 2 * BLOCK
