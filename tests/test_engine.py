"""The engine on tiny random models: padding changes no real row, and batched serving gives each
request exactly the tokens it gets alone (greedy and seeded sampling, any arrival order, a pool
too small for everyone at once)."""

import numpy as np
import pytest
from gguf_factory import tiny_model

from glimmer_cupy import ops
from glimmer_cupy.model.model import load_model
from glimmer_cupy.model.step import StepBatch
from glimmer_cupy.reference.sampling import GREEDY, SamplingParams
from glimmer_cupy.runtime.cell_pool import SCRATCH_CELL, CellPool
from glimmer_cupy.runtime.engine import Engine
from glimmer_cupy.runtime.generate import generate
from glimmer_cupy.runtime.host_executor import HostExecutor
from glimmer_cupy.runtime.scheduler import Request
from glimmer_cupy.runtime.sequence import Sequence
from glimmer_cupy.runtime.step_planner import pad_step, plan_step

ARCHS = ["llama", "gemma3"]                      # gemma3: sliding window of 4, local/global layers


@pytest.fixture(scope="module", params=ARCHS)
def model(request, tmp_path_factory):
    return load_model(tiny_model(tmp_path_factory.mktemp("m") / f"{request.param}.gguf", request.param))


def requests(params=lambda i: GREEDY):
    rng = np.random.default_rng(0)
    lens, news = [3, 11, 40, 70, 7, 1], [6, 3, 9, 4, 8, 5]
    return [Request(rng.integers(0, 300, n).tolist(), m, params(i), id=i) for i, (n, m) in enumerate(zip(lens, news))]


def alone(model, r):
    return list(generate(model, r.prompt, r.max_new, r.params, r.stop_ids))


def test_padding_changes_no_real_row(model):
    dec = model.decoder
    runs = []
    for width in (None, 8):
        pool = CellPool(32)
        ex = HostExecutor(dec, 32)
        a, b = Sequence([3, 70, 200, 5, 9, 44], GREEDY), Sequence([250, 1, 77], GREEDY)
        ex.logits(plan_step(pool, [(a, 4)]))
        before = [(k.copy(), v.copy()) for k, v in ex.kv]
        step = plan_step(pool, [(b, 3), (a, 2)])             # 5 tokens: b whole, a's rest
        if width:
            step = pad_step(step, width)
            assert step.n_tokens == 8 and step.logit_rows.tolist() == [2, 4]
        runs.append((ex.logits(step), before, ex.kv, step))
    (plain, _, kv_plain, _), (padded, before, kv_pad, step) = runs
    # OpenBLAS sgemm rounds a row differently for 5 rows than for 8 (x[:5] @ W != (x @ W)[:5]
    # bitwise), so the whole forward agrees to float32 rounding; attention, where padding could
    # leak into real rows, is checked bitwise below
    np.testing.assert_allclose(padded, plain, rtol=0, atol=2e-5)
    for (k0, v0), (kp, vp), (k1, v1) in zip(before, kv_pad, kv_plain):
        def written(k, v, k0=k0, v0=v0):
            return set(np.nonzero(np.any(k != k0, axis=(1, 2)) | np.any(v != v0, axis=(1, 2)))[0])
        assert written(kp, vp) - written(k1, v1) == {SCRATCH_CELL}   # padding wrote scratch only
        assert SCRATCH_CELL not in written(k1, v1)
    rng = np.random.default_rng(0)
    cfg = dec.cfg
    k_pool, v_pool = kv_pad[0]
    q = rng.standard_normal((8, cfg.n_heads, cfg.head_dim)).astype(np.float32)
    att = lambda st, w: ops.attention(q[:st.n_tokens], k_pool, v_pool, st.cell_table, st.seq_lens,
                                      st.tok_seq, st.positions, cfg.attn_scale, w)
    unpadded = StepBatch(*(getattr(step, f)[:5] for f in ("tokens", "positions", "cells", "tok_seq")),
                         step.cell_table[:2], step.seq_lens[:2], step.logit_rows)
    for window in (0, 4):
        out = att(step, window)
        np.testing.assert_array_equal(out[:5], att(unpadded, window))
        assert not out[5:].any()                             # padding rows see nothing at all


def test_greedy_batched_equals_alone(model):
    reqs = requests()
    want = [alone(model, r) for r in reqs]
    eng = Engine(model.decoder, 256, budget=16)              # mixes decodes and prefill chunks
    res = eng.generate(reqs)
    assert [r.tokens for r in res] == want
    assert {1, 16} <= set(eng.widths_run) and eng.pool.n_free == 255


def test_sampled_independent_of_batch_and_order(model):
    reqs = requests(lambda i: SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=100 + i))
    want = [alone(model, r) for r in reqs]
    batched = Engine(model.decoder, 256).generate(reqs)
    reordered = Engine(model.decoder, 256, budget=8).generate(reqs[::-1])[::-1]
    assert [r.tokens for r in batched] == want
    assert [r.tokens for r in reordered] == want


def test_small_pool_still_completes_everything(model):
    reqs = requests()
    want = [alone(model, r) for r in reqs]
    streamed = {r.id: [] for r in reqs}
    eng = Engine(model.decoder, 80, budget=16)              # 79 cells: never all at once
    res = eng.generate(reqs, on_token=lambda rid, t: streamed[rid].append(t))
    assert [r.tokens for r in res] == want
    assert all(streamed[r.id] == r.tokens for r in res)
    assert sum(r.preemptions for r in res) > 0 and eng.pool.n_free == 79
