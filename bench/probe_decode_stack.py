"""How long the one-launch layer stack (model/fused_stack.py) takes alone on a model after a prompt
(CUDA events around back-to-back launches, µs a call), for each size of the pieces its weight copies
are issued in, and where a layer's time goes (the kernel's global-timer stamps at 15 points of every
layer of every block). The step with the stack against the ops: bench/ab_decode_stack_model.py.

    PYTHONPATH=$PWD python3 bench/probe_decode_stack.py -m SMOLLM2.gguf [--prompt 512] [--calls 50]
    PYTHONPATH=$PWD python3 bench/probe_decode_stack.py -m random     # random weights, SmolLM2's shapes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.model import fused_stack  # noqa: E402
from glimmer_cupy.model.model import load_model  # noqa: E402
from glimmer_cupy.reference.sampling import GREEDY  # noqa: E402
from glimmer_cupy.runtime.cell_pool import CellPool  # noqa: E402
from glimmer_cupy.runtime.cuda_executor import CudaExecutor  # noqa: E402
from glimmer_cupy.runtime.sequence import Sequence  # noqa: E402
from glimmer_cupy.runtime.step_planner import plan_step  # noqa: E402


STAGES = ["start", "wqkv in", "qkv sent", "qkv gathered", "attn local", "partials in", "att gathered", "wo in",
          "o gathered", "normed", "wgu in", "act gathered", "wd in", "down gathered", "layer end"]


def random_smollm2() -> str:
    """A GGUF file of random weights with SmolLM2-135M's geometry (30 layers, Q4_1), made once."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import gguf_factory
    from glimmer_cupy.weights import QType
    gguf_factory.TINY.update(hidden=576, ffn=1536, layers=30, heads=9, kv_heads=3, head_dim=64, vocab=49152)
    return str(gguf_factory.tiny_model(Path("/tmp/random_smol.gguf"), "llama", QType.Q4_1))


def after_prompt(model, prompt: int, cells: int = 4096):
    """An executor (graphs off) that has run a prompt of `prompt` tokens, and the host step of the
    one token that follows it."""
    ex = CudaExecutor(model.decoder, cells, graphs=False)
    pool, seq = CellPool(cells), Sequence([int(t) for t in np.arange(prompt) % 1000 + 10], GREEDY)
    ex.logits(plan_step(pool, [(seq, prompt)]))
    seq.tokens.append(42)
    return ex, plan_step(pool, [(seq, 1)])


def stage_stamps(stack, x, step, kv, n_layers: int) -> None:
    """One call with the kernel's stamps on: µs from each block's layer start to each stage, medians
    over blocks and the layers after the first two, and the layer's time."""
    import cupy
    stack.stamps = cupy.zeros((fused_stack.CLUSTER, n_layers, 16), np.uint64)
    stack(x, step, kv)
    cupy.cuda.Device().synchronize()
    st = cupy.asnumpy(stack.stamps).astype(np.int64)
    stack.stamps = None
    rel = (st[:, :, :15] - st[:, :, :1]) / 1e3
    print(f"  layer time (block 0, start to start): median {np.median(np.diff(st[0, :, 0]) / 1e3):.2f} us", flush=True)
    for i, name in enumerate(STAGES):
        print(f"  {name:14s} median {np.median(rel[:, 2:, i]):7.2f} us, max {np.max(rel[:, 2:, i]):7.2f}", flush=True)


def main(argv=None) -> int:
    import cupy
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--chunks", default="0,16384,4096",
                    help="bulk copy pieces to try, bytes (decode_stack.cu: STACK_CHUNK; 0 = one copy a matrix)")
    a = ap.parse_args(argv)
    if a.model == "random":
        a.model = random_smollm2()
    model = load_model(a.model)
    ex, host_step = after_prompt(model, a.prompt)
    stack = ex.decoder.stack
    print(f"stack: {'serves' if stack else 'does not serve'} {a.model}", flush=True)
    step = ex.upload_step(host_step)
    import glimmer_cupy.ops as ops
    x = ops.embed(ex.decoder.w.embed, step.tokens, model.cfg.embed_scale)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()

    def timed(fn) -> float:
        fn()
        cupy.cuda.Device().synchronize()
        start.record()
        for _ in range(a.calls):
            fn()
        end.record()
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) * 1e3 / a.calls

    if stack:
        for chunk in (int(c) for c in a.chunks.split(",")):
            st = fused_stack.DecodeStack(model.cfg, ex.decoder.w, defines={"STACK_CHUNK": chunk})
            print(f"stack alone, copies in pieces of {chunk or 'whole'}: "
                  f"{timed(lambda: st(x, step, ex.kv)):.1f} us a call", flush=True)
            stage_stamps(st, x, step, ex.kv, model.cfg.n_layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
