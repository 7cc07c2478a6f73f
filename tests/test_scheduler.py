"""Scheduler policy on a fake executor: budget, decode-first, chunking, slicing, rejection,
queueing, preemption with recompute, and that no request is ever lost."""

from types import SimpleNamespace

import numpy as np
import pytest

from glimmer_cupy.reference.sampling import SamplingParams
from glimmer_cupy.runtime.cell_pool import CellPool
from glimmer_cupy.runtime.engine import Engine
from glimmer_cupy.runtime.scheduler import Request, Scheduler
from glimmer_cupy.runtime.sequence import Sequence
from glimmer_cupy.runtime.step_planner import plan_step, slice_chunks

VOCAB, CONTEXT = 50, 256


def next_token(tok, pos):
    """The fake model: the next token is a function of the last token and its position."""
    return (3 * tok + pos + 1) % VOCAB


class FakeExecutor:
    """Logits whose argmax is next_token(last token, its position); records every step."""

    def __init__(self):
        self.steps = []

    def logits(self, step):
        self.steps.append(step)
        out = np.zeros((len(step.logit_rows), VOCAB), np.float32)
        for i, r in enumerate(step.logit_rows):
            out[i, next_token(int(step.tokens[r]), int(step.positions[r]))] = 1.0
        return out

    def run_step(self, step, params, positions):
        assert len(params) == len(positions) == len(step.logit_rows)
        logits = self.logits(step)
        return logits.argmax(-1).astype(np.int32), np.zeros(len(logits), np.int32)


def expected(r: Request) -> list[int]:
    toks = list(r.prompt)
    while len(toks) - len(r.prompt) < r.max_new:
        toks.append(next_token(toks[-1], len(toks) - 1))
        if toks[-1] in r.stop_ids:
            break
    return toks[len(r.prompt):]


def engine(n_cells=300, budget=64, max_step=512):
    dec = SimpleNamespace(cfg=SimpleNamespace(context=CONTEXT, vocab=VOCAB))
    eng = Engine(dec, n_cells, budget, executor=FakeExecutor(), max_step=max_step)
    eng.planned = []
    schedule = eng.scheduler.schedule
    def recording():
        chunks = schedule()
        eng.planned.append([(eng.scheduler.entry(s).request.id, n) for s, n in chunks])
        return chunks
    eng.scheduler.schedule = recording
    return eng


def test_decode_first_budget_and_chunking():
    eng = engine(budget=8)
    res = eng.generate([Request([1, 2, 3], 4, id="a"), Request(list(range(20)), 2, id="b")])
    assert eng.planned[:5] == [
        [("a", 3), ("b", 5)],        # a's whole prompt, b's first chunk up to the budget
        [("a", 1), ("b", 7)],        # a decodes first
        [("a", 1), ("b", 7)],
        [("a", 1), ("b", 1)],        # a is done after this step; b's last prompt token
        [("b", 1)]]
    assert all(sum(n for _, n in p) <= 8 for p in eng.planned)
    assert [r.tokens for r in res] == [expected(Request([1, 2, 3], 4)), expected(Request(list(range(20)), 2))]
    assert [r.stop_reason for r in res] == ["length", "length"]


def test_wide_prompts_chunked_and_sliced():
    r = Request([i % VOCAB for i in range(150)], 2)
    eng = engine()
    assert eng.generate([r])[0].tokens == expected(r)
    assert eng.widths_run == [64, 64, 32, 1]                 # 64 + 64 + 22 (padded to 32), a decode
    eng = engine(budget=100)                                 # wider than the widest static step: eager
    assert eng.generate([Request(r.prompt, 2, id=1)])[0].tokens == expected(r)
    assert eng.widths_run == [100, 64, 1]                    # 100 eager, 50 padded to 64, a decode
    eng = engine(budget=100, max_step=40)                    # wider than the widest step: sliced
    assert eng.generate([Request(r.prompt, 2, id=2)])[0].tokens == expected(r)
    assert eng.widths_run == [64, 64, 32, 64, 16, 1]         # 100 = 40 + 40 + 20, 50 = 40 + 10 (padded)
    a, b = Sequence([1] * 50, None), Sequence([2] * 30, None)
    assert [[(s.tokens[0], n) for s, n in p] for p in slice_chunks([(a, 50), (b, 30)], 64)] == \
        [[(1, 50), (2, 14)], [(2, 16)]]


def test_rejections_name_the_numbers_and_others_run():
    eng = engine(n_cells=40)
    reqs = [Request([1] * 250, 10, id="ctx"), Request([], 3, id="empty"), Request([1], 0, id="zero"),
            Request([1] * 30, 20, id="pool"), Request([1], 3, SamplingParams(top_p=0), id="params"),
            Request([5, 6], 3, id="ok")]
    res = {r.id: r for r in eng.generate(reqs)}
    assert "250 tokens plus 10 to generate exceeds the context of 256" in res["ctx"].reason
    assert "empty" in res["empty"].reason and "> 0, got 0" in res["zero"].reason
    assert "needs 49 KV cells, the pool has 39" in res["pool"].reason
    assert "top-p" in res["params"].reason
    assert all(res[i].stop_reason == "rejected" and res[i].tokens == [] for i in res if i != "ok")
    assert res["ok"].tokens == expected(reqs[-1])


def test_queued_until_cells_free_then_admitted():
    eng = engine(n_cells=21)                                  # 20 usable cells
    a, b = Request(list(range(12)), 5, id="a"), Request(list(range(10)), 3, id="b")
    eng.add(a)
    eng.add(b)
    eng.step()
    assert [e.request.id for e in eng.scheduler.waiting] == ["b"]   # 10 cells > 20 - 12
    eng.run()
    assert eng.scheduler.idle
    res = eng.scheduler.results
    assert res["a"].tokens == expected(a) and res["b"].tokens == expected(b)
    assert res["b"].preemptions == 0
    first_b = next(i for i, p in enumerate(eng.planned) if any(rid == "b" for rid, _ in p))
    assert first_b > max(i for i, p in enumerate(eng.planned) if any(rid == "a" for rid, _ in p))
    assert eng.pool.n_free == 20


def test_preemption_recomputes_newest():
    eng = engine(n_cells=21)
    a, b = Request(list(range(10)), 8, id="a"), Request(list(range(20, 30)), 6, id="b")
    res = {r.id: r for r in eng.generate([a, b])}
    # both prompts fill the pool; the first decode step has no cells, so b (newest) is preempted,
    # requeued with its generated token, and recomputed when a finishes
    assert res["a"].preemptions == 0 and res["b"].preemptions == 1
    assert res["a"].tokens == expected(a) and res["b"].tokens == expected(b)
    assert ("b", 11) in [c for p in eng.planned for c in p]  # prompt + 1 generated, recomputed
    assert eng.pool.n_free == 20


def test_stop_ids_and_streaming():
    eng = engine()
    r = Request([4], 20, stop_ids=frozenset({expected(Request([4], 20))[2]}))
    seen = []
    res = eng.generate([r], on_token=lambda rid, t: seen.append((rid, t)))[0]
    assert res.stop_reason == "stop token" and len(res.tokens) == 3
    assert seen == [(r.id, t) for t in res.tokens]


@pytest.mark.parametrize("seed", range(6))
def test_no_request_lost(seed):
    rng = np.random.default_rng(seed)
    n_cells, budget = int(rng.integers(30, 90)), int(rng.choice([1, 3, 8, 64, 100]))
    eng = engine(n_cells, budget)
    reqs = []
    for i in range(int(rng.integers(5, 25))):
        n = int(rng.integers(0, 60))
        stop = frozenset(rng.integers(0, VOCAB, 2).tolist())
        reqs.append(Request(rng.integers(0, VOCAB, n).tolist(), int(rng.integers(0, 30)), stop_ids=stop, id=i))
    res = eng.generate(reqs)
    assert [r.id for r in res] == [r.id for r in reqs]
    for q, r in zip(reqs, res):
        fits = 0 < len(q.prompt) and 0 < q.max_new and len(q.prompt) + q.max_new - 1 <= n_cells - 1
        assert (r.stop_reason == "rejected") == (not fits)
        if fits:
            assert r.tokens == expected(q) and r.stop_reason in ("length", "stop token")
    assert eng.pool.n_free == n_cells - 1 and eng.scheduler.idle
    assert all(sum(n for _, n in p) <= budget for p in eng.planned)


def test_scheduler_alone_with_plan_step():
    pool = CellPool(64)
    sch = Scheduler(pool, CONTEXT, VOCAB, budget=4)
    for i in range(3):
        sch.add(Request([1, 2, 3], 2, id=i))
    chunks = sch.schedule()
    assert [(sch.entry(s).request.id, n) for s, n in chunks] == [(0, 3), (1, 1)]
    plan_step(pool, chunks)
    with pytest.raises(Exception, match="already in use"):
        sch.add(Request([1], 1, id=0))
