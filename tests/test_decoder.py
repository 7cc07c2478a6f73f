"""The decoder graph on tiny random models of each architecture: one prefill, token-by-token
decoding and a packed batch over scattered cells must give the same logits."""

import numpy as np
import pytest
from gguf_factory import tiny_model

from glimmer_cupy.model.config import ModelConfig
from glimmer_cupy.model.decoder import Decoder
from glimmer_cupy.model.weights import load_weights
from glimmer_cupy.reference.sampling import GREEDY
from glimmer_cupy.runtime.cell_pool import CellPool
from glimmer_cupy.runtime.host_executor import HostExecutor
from glimmer_cupy.runtime.sequence import Sequence
from glimmer_cupy.runtime.step_planner import plan_step
from glimmer_cupy.weights import GGUFFile

ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]


@pytest.fixture(scope="module", params=ARCHS)
def decoder(request, tmp_path_factory):
    path = tiny_model(tmp_path_factory.mktemp("m") / f"{request.param}.gguf", request.param)
    f = GGUFFile(path)
    cfg = ModelConfig.from_gguf(f)
    return Decoder(cfg, load_weights(f, cfg))


def run_one_step(dec, tokens):
    pool = CellPool(64)
    ex = HostExecutor(dec, 64)
    seq = Sequence(list(tokens), GREEDY)
    return ex.logits(plan_step(pool, [(seq, len(tokens))]))[0]


def test_prefill_equals_token_by_token(decoder):
    tokens = [3, 70, 200, 5, 9, 44, 13, 250, 1, 77, 100]       # longer than Gemma's tiny window of 4
    pool = CellPool(64)
    ex = HostExecutor(decoder, 64)
    seq = Sequence(tokens[:1], GREEDY)
    for i in range(len(tokens)):
        if i:
            seq.tokens.append(tokens[i])
        last = ex.logits(plan_step(pool, [(seq, 1)]))[0]
    np.testing.assert_allclose(last, run_one_step(decoder, tokens), rtol=1e-4, atol=1e-4)


def test_packed_batch_over_scattered_cells(decoder):
    rng = np.random.default_rng(1)
    a, b = [3, 70, 200, 5, 9, 44, 13], [250, 1, 77, 100, 8]
    pool = CellPool(64)
    pool.alloc(20)                                             # others hold cells: scattered tables
    pool._free = type(pool._free)(rng.permutation(list(pool._free)))
    ex = HostExecutor(decoder, 64)
    sa, sb = Sequence(a[:4], GREEDY), Sequence(b, GREEDY)
    ex.logits(plan_step(pool, [(sa, 2)]))
    step = plan_step(pool, [(sb, 5), (sa, 2)])                 # b whole, a's rest of its prompt
    logits = ex.logits(step)
    sa.tokens += a[4:]
    logits_a = ex.logits(plan_step(pool, [(sa, 3)]))
    np.testing.assert_allclose(logits[0], run_one_step(decoder, b), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(logits_a[0], run_one_step(decoder, a), rtol=1e-4, atol=1e-4)
    assert np.isfinite(logits).all() and logits.std() > 0.1


def test_linear_joins_runs_of_one_type():
    """q and k of one type are one matrix when v has another; outputs keep the parts' order."""
    from glimmer_cupy.model.linear import Linear
    from glimmer_cupy.weights.quant_tensor import QType, QuantTensor
    from glimmer_cupy.weights.random_blocks import random_blocks

    rng = np.random.default_rng(4)
    q = QuantTensor("q", QType.Q4_0, (64, 96), random_blocks(QType.Q4_0, 64, 96, rng))
    k = QuantTensor("k", QType.Q4_0, (32, 96), random_blocks(QType.Q4_0, 32, 96, rng))
    v = QuantTensor("v", QType.Q8_0, (32, 96), random_blocks(QType.Q8_0, 32, 96, rng))
    lin = Linear("qkv", [q, k, v])
    assert [(p.qtype, p.shape) for p in lin.parts] == [(QType.Q4_0, (96, 96)), (QType.Q8_0, (32, 96))]
    assert len(Linear("kvq", [k, v, q]).parts) == 3
    x = rng.normal(0, 1, (3, 96)).astype(np.float32)
    want = np.concatenate([x @ t.dequantize(np.float64).T for t in (q, k, v)], axis=1)
    np.testing.assert_allclose(lin(x), want, rtol=1e-5, atol=1e-5)
