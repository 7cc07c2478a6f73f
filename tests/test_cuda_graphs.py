"""Static steps and CUDA graphs (marker gpu; host-side pieces on the CPU).

For every step width from 1 to 65 and a few beyond, a random mix of sequences — each with some
context already in the pool, chunks of random length, some ending mid-prompt — runs through the
CUDA executor with graphs on (twice: the first run of a step shape is eager, later ones replay its
graph), with graphs off, and through the NumPy path with the GPU's roundings (gpu_rounding.py).
Tokens are greedy and teacher-forced along the prompts: every logit row is sampled from the same
tokens in all three. Graphs on and off must agree exactly (same kernels, same buffers); the NumPy
path where its top-1 margin is clear (test_cuda_executor.py's rule).
"""

import numpy as np
import pytest
from gpu_rounding import GpuRoundingExecutor
from test_cuda_executor import LOGIT_RTOL, load_decoder, tiny_cuda_model

from glimmer_cupy.reference.sampling import GREEDY, SamplingParams
from glimmer_cupy.runtime.cell_pool import CellPool
from glimmer_cupy.runtime.sequence import Sequence
from glimmer_cupy.runtime.static_step import MIN_TABLE_WIDTH, StaticStep, staging_fields, table_width
from glimmer_cupy.runtime.step_planner import plan_step

WIDTHS = list(range(1, 66)) + [80, 127, 130]
POOL = 1024


def mix(width: int, vocab: int, seed: int):
    """(sequences with their prior context length, chunks summing to width) for one step."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, min(width, 6) + 1))
    cuts = np.sort(rng.choice(np.arange(1, width), n - 1, replace=False)) if n > 1 else np.array([], int)
    sizes = np.diff(np.concatenate([[0], cuts, [width]])).tolist()
    out = []
    for size in sizes:
        prior = int(rng.integers(0, 30))
        extra = int(rng.integers(1, 4)) if rng.random() < 0.3 else 0      # chunk ends mid-prompt
        tokens = rng.integers(0, vocab, prior + size + extra).tolist()
        out.append((tokens, prior, size))
    return out


def run_mix(ex, pool: CellPool, spec, params):
    """Prior context of each sequence as steps of its own, then the mixed step; its sampled tokens,
    and the logits when the executor is the NumPy one."""
    seqs = []
    for tokens, prior, _ in spec:
        seq = Sequence(list(tokens), params)
        if prior:
            ex.run_step(plan_step(pool, [(seq, prior)]), [], [])
        seqs.append(seq)
    step = plan_step(pool, [(seq, size) for seq, (_, _, size) in zip(seqs, spec)])
    k = len(step.logit_rows)
    rows = [s for s in seqs if s.n_pending == 0]
    positions = [len(s.tokens) for s in rows]
    logits = ex.logits(step) if isinstance(ex, GpuRoundingExecutor) else None
    tokens, flags = ex.run_step(step, [params] * k, positions) if logits is None else \
        ex.sample(logits, [params] * k, positions)
    assert not np.asarray(flags).any()
    return list(np.asarray(tokens)), logits


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def dec(request, tmp_path_factory):
    return load_decoder(tiny_cuda_model(tmp_path_factory.mktemp("g") / f"{request.param}.gguf", request.param))


@pytest.mark.gpu
def test_every_width_graph_equals_eager_equals_numpy(dec):
    from glimmer_cupy.runtime.cuda_executor import CudaExecutor

    graphs, eager = CudaExecutor(dec, POOL, graphs=True), CudaExecutor(dec, POOL, graphs=False)
    host = GpuRoundingExecutor(dec, POOL)
    compared = 0
    for width in WIDTHS:
        spec = mix(width, dec.cfg.vocab, seed=width)
        first, _ = run_mix(graphs, CellPool(POOL), spec, GREEDY)
        replay, _ = run_mix(graphs, CellPool(POOL), spec, GREEDY)
        plain, _ = run_mix(eager, CellPool(POOL), spec, GREEDY)
        want, logits = run_mix(host, CellPool(POOL), spec, GREEDY)
        assert first == replay == plain, f"width {width}: graph first run {first}, replay {replay}, eager {plain}"
        for r, row in enumerate(logits):
            top2 = np.sort(row)[-2:]
            if top2[1] - top2[0] > 4 * LOGIT_RTOL * np.abs(row).max():
                assert plain[r] == want[r], f"width {width}, logit row {r}: cuda {plain[r]}, numpy {want[r]}"
                compared += 1
    assert graphs.graph_replays >= len(WIDTHS) - 3      # all but the three eager wide steps' widths
    assert eager.graph_replays == 0
    assert compared > len(WIDTHS)


@pytest.mark.gpu
def test_graph_replay_samples_with_fresh_parameters_and_seeds(dec):
    """A captured step replays with whatever parameters and positions the host wrote: sampled
    tokens equal eager execution for changing seeds, and differ between seeds (the tiny models'
    logits are sharp: at temperature 1.5 every seed picks the same tokens on gemma3)."""
    from glimmer_cupy.runtime.cuda_executor import CudaExecutor

    graphs, eager = CudaExecutor(dec, POOL, graphs=True), CudaExecutor(dec, POOL, graphs=False)
    spec = mix(12, dec.cfg.vocab, seed=7)
    seen = set()
    for seed in range(6):
        p = SamplingParams(temperature=50.0, top_k=0, top_p=1.0, seed=seed)   # near uniform: seeds show
        got = [run_mix(ex, CellPool(POOL), spec, p)[0] for ex in (graphs, eager)]
        assert got[0] == got[1], f"seed {seed}: graph {got[0]}, eager {got[1]}"
        seen.add(tuple(got[0]))
    assert graphs.graph_replays >= 4 and len(seen) > 1


def test_table_width():
    assert table_width(1, 4096) == MIN_TABLE_WIDTH
    assert table_width(257, 4096) == 512
    assert table_width(3000, 4096) == 4096
    assert table_width(3000, 3001) == 3001


def test_mix_covers_the_width():
    for w in WIDTHS:
        spec = mix(w, 320, w)
        assert sum(size for _, _, size in spec) == w and all(size > 0 for _, _, size in spec)


class _RecordingParams:
    """Stands in for DeviceSamplingParams: records what update() was given."""

    def __init__(self):
        self.updates = []

    def update(self, params, vocab):
        self.updates.append(list(params))


def host_static_step(t: int, k: int, width: int) -> StaticStep:
    """A StaticStep whose buffers are NumPy arrays (fill() only touches the host side)."""
    st = object.__new__(StaticStep)
    st.t, st.k, st.width = t, k, width
    st.h = {name: np.full(shape, -7, np.int32) for name, shape in staging_fields(t, k, width)}
    st.params, st.params_set = _RecordingParams(), None
    return st


def test_fill_pads_tokens_sequences_and_rows():
    pool = CellPool(64)
    a, b = Sequence([5, 6, 7], GREEDY), Sequence([8, 9], GREEDY)
    step = plan_step(pool, [(a, 3), (b, 2)])
    st = host_static_step(8, 2, 256)
    hot = SamplingParams(temperature=1.0, seed=3)
    st.fill(step, [hot, GREEDY], [3, 2], 320)
    h = st.h
    assert h["tokens"].tolist() == [5, 6, 7, 8, 9, 0, 0, 0]
    assert h["cells"][:5].tolist() == step.cells.tolist() and (h["cells"][5:] == 0).all()      # scratch cell
    assert h["tok_seq"].tolist() == [0, 0, 0, 1, 1, 2, 2, 2]                                  # padding sequence
    assert h["seq_lens"].tolist()[:2] == [3, 2] and (h["seq_lens"][2:] == 0).all()
    assert h["logit_rows"].tolist() == [2, 4] and h["sample_pos"].tolist() == [3, 2]
    assert h["cell_table"][0, :3].tolist() == a.cells and h["cell_table"][1, :2].tolist() == b.cells
    assert st.params.updates == [[hot, GREEDY]]
    assert h["feed"].tolist() == [-1] * 8                                 # no feed: every row the host's
    st.fill(step, [hot, GREEDY], [3, 2], 320, feed=np.array([-1, -1, 1, -1, 0], np.int32))
    assert h["feed"].tolist() == [-1, -1, 1, -1, 0, -1, -1, -1]           # padding rows never feed


def test_fill_rewrites_parameters_only_when_they_change():
    pool = CellPool(64)
    seq = Sequence([1, 2, 3], GREEDY)
    st = host_static_step(4, 2, 256)
    p = SamplingParams(temperature=0.7, seed=1)
    step = plan_step(pool, [(seq, 3)])
    st.fill(step, [p], [3], 320)
    st.fill(step, [p], [3], 320)                                            # the same objects
    st.fill(step, [SamplingParams(temperature=0.7, seed=1)], [3], 320)      # equal values, new object
    assert len(st.params.updates) == 1
    st.fill(step, [SamplingParams(temperature=0.7, seed=2)], [3], 320)      # a new seed
    assert len(st.params.updates) == 2 and st.params.updates[-1][0].seed == 2
    assert st.params.updates[-1][1] is GREEDY                               # the padding row
