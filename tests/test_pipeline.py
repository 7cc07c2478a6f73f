"""Decode steps launched one ahead (runtime/pipeline.py).

CPU: the feed rule, the slot bookkeeping, and decode_steps on a fake executor that runs a step
when it is launched (as the device does) and hands its tokens to the host only when asked: the
launch order, the feeds, and that a step launched past a stop token leaves the pool and the
sequences as a run that never launched it. Then generate() on the NumPy executor, overlapped and
not: the same tokens, greedy and seeded, with stop tokens, and the next call unaffected.

GPU (marker gpu): overlapped generation gives exactly the tokens of the synchronous one on the
tiny models of every architecture, graphs on and off, greedy and seeded, with stop tokens, and a
batch decoding in lockstep (static steps and eager ones); and on SmolLM2 (markers model, gpu).
"""

import json
from pathlib import Path

import numpy as np
import pytest
from gguf_factory import tiny_model
from test_cuda_executor import load_decoder, tiny_cuda_model

from glimmer_cupy.errors import GlimmerError
from glimmer_cupy.model.model import load_model
from glimmer_cupy.ops import feed_tokens_
from glimmer_cupy.reference.sampling import GREEDY, SamplingParams
from glimmer_cupy.runtime.cell_pool import CellPool
from glimmer_cupy.runtime.generate import generate
from glimmer_cupy.runtime.host_executor import HostExecutor
from glimmer_cupy.runtime.pipeline import PLACEHOLDER, Ready, Slots, check_feed, decode_steps
from glimmer_cupy.runtime.sequence import Sequence
from glimmer_cupy.runtime.step_planner import plan_step

VOCAB = 50
GOLDEN = Path(__file__).parent / "golden"


# ---- CPU: the feed rule and the slots -------------------------------------------------------

def test_check_feed():
    assert check_feed(None, 3, 0) is None
    assert check_feed([-1, -1, -1], 3, 0) is None                      # nothing fed: a plain step
    f = check_feed(np.array([-1, 1, 0]), 3, 2)
    assert f.dtype == np.int32 and f.tolist() == [-1, 1, 0]
    with pytest.raises(GlimmerError, match=r"feed must be in \[-1, 2\) .* got -1\.\.2"):
        check_feed([-1, 2, 0], 3, 2)
    with pytest.raises(GlimmerError, match=r"feed must be in \[-1, 0\)"):
        check_feed([0], 1, 0)                                           # no previous samples
    with pytest.raises(GlimmerError, match=r"in \[-1, 4\) .* got -2\.\.0"):
        check_feed([-2, 0], 2, 4)
    with pytest.raises(GlimmerError, match=r"shape \(3,\), got int64 \(2,\)"):
        check_feed(np.array([0, 1]), 3, 2)


class Handle:
    """A launched step whose result the host has not read yet."""

    def __init__(self, name, log):
        self.name, self.log, self.done = name, log, False

    def result(self):
        self.log.append(self.name)
        self.done = True
        return self.name


def test_slots_read_every_step_use_one_slot():
    """run_step's pattern (each result read before the next launch): always slot 0, as before."""
    slots, log = Slots(), []
    for i in range(4):
        s = slots.take(fed=False)
        assert s == 0
        h = Handle(i, log)
        slots.launched(s, h, 1)
        h.result()
    assert log == [0, 1, 2, 3]


def test_slots_alternate_one_ahead_and_wait_two_back():
    slots, log = Slots(), []
    h0 = Handle("h0", log)
    slots.launched(slots.take(fed=False), h0, 1)
    assert slots.prev == 0 and slots.prev_rows == 1
    s1 = slots.take(fed=True)                    # feeds on h0's samples: the other slot, no wait
    assert s1 == 1 and log == []
    h1 = Handle("h1", log)
    slots.launched(s1, h1, 1)
    assert slots.take(fed=True) == 0 and log == ["h0"]   # slot 0 again: waits for h0 (two back)
    assert not h1.done
    h2 = Handle("h2", log)
    slots.launched(0, h2, 1)
    h1.result()
    assert slots.take(fed=False) == 1            # h2 still in flight: the other slot, h1 already read
    assert log == ["h0", "h1"]
    slots.launched(1, Ready(np.zeros(1, np.int32), np.zeros(1, np.int32)), 1)
    assert slots.take(fed=False) == 1            # a step that is done keeps its slot
    assert slots.take(fed=True) == 0 and log == ["h0", "h1", "h2"]
    slots.forget()
    assert slots.prev_rows == 0


# ---- CPU: decode_steps on a fake device -----------------------------------------------------

def next_token(tok, pos):
    return (3 * tok + pos + 1) % VOCAB


class FakeDevice:
    """Runs a step when it is launched: input ids from the host's step, or for fed rows from the
    previous launch's samples (which the host may not have read); the next token of a row is
    next_token(its id, its position). log: ('launch', n), ('read', n) in order."""

    def __init__(self):
        self.log, self.steps, self._last = [], [], np.zeros(0, np.int32)

    def launch(self, step, params, positions, feed=None):
        feed = check_feed(feed, step.n_tokens, len(self._last))
        ids = np.array(step.tokens, np.int32)
        if feed is not None:
            assert (ids[feed >= 0] == PLACEHOLDER).all()
            feed_tokens_(ids, feed, self._last)
        n = len(self.steps)
        self.steps.append((step, None if feed is None else feed.tolist()))
        self.log.append(("launch", n))
        tokens = np.array([next_token(int(ids[r]), int(step.positions[r])) for r in step.logit_rows], np.int32)
        self._last = tokens
        dev = self

        class Launched:
            done = False

            def result(self):
                if not self.done:
                    dev.log.append(("read", n))
                    self.done = True
                return tokens, np.zeros(len(tokens), np.int32)
        return Launched()


def prefilled(pool, prompts):
    """Sequences with their prompts' K/V planned and the first token sampled (next_token rule)."""
    seqs = []
    for p in prompts:
        s = Sequence(list(p), GREEDY)
        plan_step(pool, [(s, len(p))])
        s.tokens.append(next_token(p[-1], len(p) - 1))
        seqs.append(s)
    return seqs


def chain(prompt, n):
    toks = list(prompt) + [next_token(prompt[-1], len(prompt) - 1)]
    while len(toks) < len(prompt) + 1 + n:
        toks.append(next_token(toks[-1], len(toks) - 1))
    return toks


@pytest.mark.parametrize("overlap", [False, True])
def test_decode_steps_tokens_and_launch_order(overlap):
    prompts = [[3, 9, 4], [7, 1], [20, 21, 22, 23]]
    pool, dev = CellPool(64), FakeDevice()
    seqs = prefilled(pool, prompts)
    got = [t.tolist() for t, _ in decode_steps(dev, pool, seqs, 5, overlap)]
    for s, p in zip(seqs, prompts):
        assert s.tokens == chain(p, 5) and s.n_pending == 1
    assert got == [[s.tokens[len(p) + 1 + i] for s, p in zip(seqs, prompts)] for i in range(5)]
    assert pool.n_free == 63 - sum(len(s.cells) for s in seqs)
    if overlap:      # step i + 1 launched before step i's tokens are read, fed row j <- sampled row j
        assert dev.log == [("launch", 0), ("launch", 1), ("read", 0), ("launch", 2), ("read", 1),
                           ("launch", 3), ("read", 2), ("launch", 4), ("read", 3), ("read", 4)]
        assert [f for _, f in dev.steps] == [None] + [[0, 1, 2]] * 4
    else:
        assert dev.log == [(e, i) for i in range(5) for e in ("launch", "read")]
        assert all(f is None for _, f in dev.steps)
    # the same positions and cells either way: the sampling counters do not move
    assert [s.positions.tolist() for s, _ in dev.steps] == [[len(p) + i for p in prompts] for i in range(5)]


@pytest.mark.parametrize("stop_after", [1, 2, 4])
def test_closing_early_discards_the_step_launched_ahead(stop_after):
    """A consumer that stops after a token (a stop token) leaves the pool and the sequences as a
    run that never launched the step ahead; that step's cells are free again."""
    states = []
    for overlap in (False, True):
        pool, dev = CellPool(32), FakeDevice()
        seqs = prefilled(pool, [[3, 9, 4], [7, 1]])
        steps = decode_steps(dev, pool, seqs, 6, overlap)
        for _ in range(stop_after):
            next(steps)
        launched = len(dev.steps)
        steps.close()
        states.append((pool.n_free, sorted(pool._free), [(s.tokens, list(s.cells)) for s in seqs], launched))
    (free0, list0, seqs0, n0), (free1, list1, seqs1, n1) = states
    assert seqs1 == seqs0 and free1 == free0 and sorted(list1) == sorted(list0)
    assert n1 == n0 + 1                          # one step launched past the last one read
    # and the sequences go on as if nothing happened
    pool, dev = CellPool(32), FakeDevice()
    seqs = prefilled(pool, [[3, 9, 4], [7, 1]])
    steps = decode_steps(dev, pool, seqs, 6, True)
    for _ in range(stop_after):
        next(steps)
    steps.close()
    list(decode_steps(dev, pool, seqs, 2, True))
    assert seqs[0].tokens == chain([3, 9, 4], stop_after + 2) and seqs[1].tokens == chain([7, 1], stop_after + 2)


def test_the_last_step_is_not_launched_ahead():
    pool, dev = CellPool(32), FakeDevice()
    seqs = prefilled(pool, [[3, 9, 4]])
    assert len(list(decode_steps(dev, pool, seqs, 3, True))) == 3 and len(dev.steps) == 3
    assert list(decode_steps(dev, pool, seqs, 0, True)) == []


# ---- CPU: generate() on the NumPy executor --------------------------------------------------

@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(tiny_model(tmp_path_factory.mktemp("p") / "llama.gguf", "llama"))


SAMPLED = SamplingParams(temperature=50.0, top_k=0, top_p=1.0, seed=11)   # near uniform: the seed shows


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_generate_overlapped_gives_the_same_tokens_on_numpy(model, params):
    ex = HostExecutor(model.decoder, 64)
    prompt = [3, 70, 200, 5, 9]
    want = list(generate(model, prompt, 10, params, executor=ex, overlap=False))
    assert list(generate(model, prompt, 10, params, executor=ex, overlap=True)) == want
    assert list(generate(model, prompt, 1, params, executor=ex, overlap=True)) == want[:1]
    for at in (0, 3, 9):
        stop = {want[at]}
        cut = want[:want.index(want[at]) + 1]
        assert list(generate(model, prompt, 10, params, stop, executor=ex, overlap=True)) == cut
        # the next call on the same executor, after the discarded step: unaffected
        assert list(generate(model, prompt, 10, params, executor=ex, overlap=True)) == want


def test_host_executor_feed(model):
    ex = HostExecutor(model.decoder, 16)
    pool, seq = CellPool(16), Sequence([3, 70, 200], GREEDY)
    tok, _ = ex.run_step(plan_step(pool, [(seq, 3)]), [GREEDY], [3])
    seq.tokens.append(PLACEHOLDER)
    fed = ex.launch(plan_step(pool, [(seq, 1)]), [GREEDY], [4], feed=[0]).result()[0]
    pool2, seq2 = CellPool(16), Sequence([3, 70, 200, int(tok[0])], GREEDY)
    assert fed.tolist() == ex.run_step(plan_step(pool2, [(seq2, 4)]), [GREEDY], [4])[0].tolist()
    with pytest.raises(GlimmerError, match=r"feed must be in \[-1, 1\)"):
        ex.launch(plan_step(CellPool(16), [(Sequence([1, 2], GREEDY), 2)]), [GREEDY], [2], feed=[-1, 1])


# ---- GPU: the CUDA executor, overlapped against synchronous ----------------------------------

@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "gemma3"])
def dec(request, tmp_path_factory):
    return load_decoder(tiny_cuda_model(tmp_path_factory.mktemp("o") / f"{request.param}.gguf", request.param))


def as_model(dec):
    class M:                                     # the fields generate() reads
        decoder, cfg = dec, dec.cfg
    return M


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_overlapped_generation_equals_synchronous(dec, graphs):
    from glimmer_cupy.runtime.cuda_executor import CudaExecutor

    ex = CudaExecutor(dec, 512, graphs=graphs)
    m = as_model(dec)
    prompts = [[3, 70, 200, 5, 9], [(7 * i + 3) % dec.cfg.vocab for i in range(100)]]   # static, eager prefill
    for prompt in prompts:
        for params in (GREEDY, SamplingParams(temperature=50.0, top_k=0, top_p=1.0, seed=5),
                       SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=6)):
            want = list(generate(m, prompt, 24, params, executor=ex, overlap=False))
            assert list(generate(m, prompt, 24, params, executor=ex, overlap=True)) == want
            for at in (0, 2, 11):
                cut = want[:want.index(want[at]) + 1]
                got = list(generate(m, prompt, 24, params, {want[at]}, executor=ex, overlap=True))
                assert got == cut, f"stop at {want[at]}: {got} against {cut}"
                # chat's next turn on the same executor, after the discarded step
                assert list(generate(m, prompt, 24, params, executor=ex, overlap=True)) == want
    assert (ex.graph_replays > 0) == graphs


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [3, 70])       # 70 sequences: wider than a graph, eager fed steps
def test_overlapped_batch_decode_equals_synchronous(dec, batch):
    from glimmer_cupy.runtime.cuda_executor import CudaExecutor

    ex = CudaExecutor(dec, 2048)
    rng = np.random.default_rng(batch)
    prompts = [rng.integers(0, dec.cfg.vocab, int(rng.integers(1, 9))).tolist() for _ in range(batch)]
    params = [SamplingParams(temperature=50.0, top_k=0, top_p=1.0, seed=i) if i % 2 else GREEDY
              for i in range(batch)]
    runs = []
    for overlap in (False, True, True):
        pool = CellPool(ex.n_cells)
        seqs = [Sequence(list(p), q) for p, q in zip(prompts, params)]
        for s in seqs:
            tok, _ = ex.run_step(plan_step(pool, [(s, s.n_pending)]), [s.params], [len(s.tokens)])
            s.tokens.append(int(tok[0]))
        list(decode_steps(ex, pool, seqs, 7, overlap))
        runs.append([s.tokens for s in seqs])
    assert runs[1] == runs[0] and runs[2] == runs[0]


@pytest.mark.gpu
def test_an_error_in_an_overlapped_step_names_the_step_and_op(dec):
    import cupy

    from glimmer_cupy.runtime.cuda_executor import CudaExecutor, CudaStepError

    ex = CudaExecutor(dec, 64, graphs=False)
    lw = ex.decoder.w.layers[1]
    good = lw.ffn_norm
    lw.ffn_norm = cupy.asarray(good, dtype=cupy.float64)            # the op's check refuses it
    with pytest.raises(CudaStepError) as e:
        list(generate(as_model(dec), [3, 70, 200], 6, GREEDY, executor=ex, overlap=True))
    msg = str(e.value)
    assert "step 1" in msg and "layer 1" in msg and "add_rms_norm_" in msg and len(msg.splitlines()) == 1
    lw.ffn_norm = good
    assert len(list(generate(as_model(dec), [3, 70, 200], 6, GREEDY, executor=ex, overlap=True))) == 6


@pytest.mark.gpu
@pytest.mark.model
def test_smollm2_overlapped_generation_equals_synchronous(model_file):
    from glimmer_cupy.runtime.cuda_executor import CudaExecutor

    m = load_model(model_file("smollm2-135m"))
    golden = json.loads((GOLDEN / "smollm2-135m.json").read_text())
    ex = CudaExecutor(m.decoder, 1024)
    for i, p in enumerate(golden["prompts"][:3]):
        for params in (GREEDY, SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=1000 + i)):
            want = list(generate(m, p["prompt_ids"], 48, params, executor=ex, overlap=False))
            assert list(generate(m, p["prompt_ids"], 48, params, executor=ex, overlap=True)) == want
            stop = {want[20]}
            cut = want[:want.index(want[20]) + 1]
            assert list(generate(m, p["prompt_ids"], 48, params, stop, executor=ex, overlap=True)) == cut
            assert list(generate(m, p["prompt_ids"], 48, params, executor=ex, overlap=True)) == want
