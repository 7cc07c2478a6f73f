"""The one-launch layer stack (model/fused_stack.py, cuda_src/decode_stack.cu) against the decoder's ops.

A random llama model with SmolLM2-135M's layer geometry (hidden 576, 9 query heads over 3 KV heads
of 64, FFN 1536; Q4_1 matrices) and 3 layers: a prompt runs through the ops, then one-token steps
run through the stack and, from the same K/V, through the ops, over scattered cells and past the
lengths where the positions split into several 32-position tiles a block (2,100: a warp merges
three tiles, and most cells come from the table, past the 16 a block keeps of a 256-token context).
Both paths quantize the same activations to int8 and K/V to bf16, in different orders of summation:
logits within test_cuda_executor's LOGIT_RTOL, and against the NumPy path with the GPU's roundings
emulated.
"""

from pathlib import Path

import gguf_factory
import numpy as np
import pytest
from gguf_factory import tiny_model
from gpu_rounding import GpuRoundingExecutor
from test_attention_gpu import bf16_float
from test_cuda_executor import assert_logits_close, load_decoder, to_host

from glimmer_cupy.model import fused_stack
from glimmer_cupy.model.config import ModelConfig
from glimmer_cupy.reference.sampling import GREEDY
from glimmer_cupy.runtime.cell_pool import CellPool
from glimmer_cupy.runtime.sequence import Sequence
from glimmer_cupy.runtime.step_planner import plan_step
from glimmer_cupy.weights import GGUFFile, QType

SMOL = dict(hidden=576, ffn=1536, layers=3, heads=9, kv_heads=3, head_dim=64, vocab=320)


def smol_model(path: Path, qtype: QType = QType.Q4_1) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in SMOL.items():
            mp.setitem(gguf_factory.TINY, k, v)
        return tiny_model(path, "llama", qtype)


@pytest.fixture(scope="module")
def smol_dec(tmp_path_factory):
    return load_decoder(smol_model(tmp_path_factory.mktemp("m") / "smol.gguf"))


def test_who_the_stack_serves(smol_dec, tmp_path):
    cfg = smol_dec.cfg
    assert fused_stack.why_not(cfg, smol_dec.w.layers) is None
    most = 2 ** 33 // cfg.kv_dim                   # cells whose pools stay below 2^32 4-byte words
    assert fused_stack.why_not(cfg, smol_dec.w.layers, n_cells=most) is None
    assert "32-bit offsets" in fused_stack.why_not(cfg, smol_dec.w.layers, n_cells=most + 1)
    offs, total = fused_stack.smem_layout(cfg, QType.Q4_1)
    assert total <= fused_stack.SMEM_LIMIT and offs == sorted(offs) and all(o % 128 == 0 for o in offs)
    qwen = load_decoder(tiny_model(tmp_path / "qwen3.gguf", "qwen3"))
    assert "head_dim" in fused_stack.why_not(qwen.cfg, qwen.w.layers)
    f = GGUFFile(tiny_model(tmp_path / "llama.gguf", "llama"))
    assert fused_stack.why_not(ModelConfig.from_gguf(f), load_decoder(tmp_path / "llama.gguf").w.layers)


@pytest.mark.gpu
@pytest.mark.parametrize("prompt_len", [1, 5, 40, 700, 2100])
def test_stack_equals_the_ops(smol_dec, prompt_len, monkeypatch):
    from glimmer_cupy.runtime.cuda_executor import CudaExecutor

    rng = np.random.default_rng(prompt_len)
    ex = CudaExecutor(smol_dec, 4096, graphs=False)
    assert ex.decoder.stack is not None
    host = GpuRoundingExecutor(smol_dec, 4096)
    pools = CellPool(4096), CellPool(4096)
    for pool in pools:                                   # scattered cells, the same in both
        pool.alloc(50)
        pool._free = type(pool._free)(np.random.default_rng(7).permutation(list(pool._free)))
    tokens = [int(t) for t in rng.integers(0, SMOL["vocab"] - 2, prompt_len + 4)]
    seqs = Sequence(tokens[:prompt_len], GREEDY), Sequence(tokens[:prompt_len], GREEDY)
    for i in range(prompt_len, prompt_len + 4):
        n = seqs[0].n_pending
        steps = [plan_step(pool, [(seq, n)]) for pool, seq in zip(pools, seqs)]
        want = host.logits(steps[0])
        if n == 1:
            monkeypatch.setattr(fused_stack, "ENABLED", False)
            plain = to_host(ex.logits(steps[1]))
            monkeypatch.setattr(fused_stack, "ENABLED", True)
            fused = to_host(ex.logits(steps[1]))
            assert_logits_close(fused, plain, f"stack against the ops at position {i - 1}")
            assert_logits_close(fused, want, f"stack against NumPy at position {i - 1}")
        else:
            assert_logits_close(ex.logits(steps[1]), want, f"prompt of {n}")
        for seq in seqs:
            seq.tokens.append(tokens[i])


@pytest.mark.gpu
def test_stack_writes_the_pools_as_the_ops_do(smol_dec, monkeypatch):
    """The step's K and V rows, written by the stack, are the ops' rows (bf16 of the same values up
    to summation order): the next step through the ops reads them."""
    import cupy

    from glimmer_cupy.runtime.cuda_executor import CudaExecutor

    ex = CudaExecutor(smol_dec, 64, graphs=False)
    pool, seq = CellPool(64), Sequence([3, 70, 200, 5, 9], GREEDY)
    ex.logits(plan_step(pool, [(seq, 5)]))
    seq.tokens.append(11)
    step = plan_step(pool, [(seq, 1)])
    cell = int(step.cells[0])
    monkeypatch.setattr(fused_stack, "ENABLED", False)
    ex.logits(step)
    cupy.cuda.Device().synchronize()
    want = [(to_host(k[cell]).copy(), to_host(v[cell]).copy()) for k, v in ex.kv]
    monkeypatch.setattr(fused_stack, "ENABLED", True)
    for k, v in ex.kv:
        k[cell] = 0
        v[cell] = 0
    ex.logits(step)
    cupy.cuda.Device().synchronize()
    for layer, ((k, v), (wk, wv)) in enumerate(zip(ex.kv, want)):
        for got, ref, name in ((to_host(k[cell]), wk, "K"), (to_host(v[cell]), wv, "V")):
            g, r = bf16_float(got), bf16_float(ref)
            assert np.abs(g - r).max() <= 2e-2 * np.abs(r).max() + 1e-6, f"layer {layer} {name}"
