"""Which decode steps of test_gemma_shaped_decode's graph mode get wrong int8 codes from the
attention's q8 epilogue: the rule path at a 9-position prompt and a 256-wide table, run as the
test runs it ("graph": the second step captured, the rest replays), with PDL on eagerly, with the
capture's allocations from a memory pool of its own, and with PDL off. Per decode step and layer:
how many codes differ from those of the float output, and the output's error against the
reference (which passes in every mode).

    PYTHONPATH=$PWD python3 bench/diag_gemma_graph_codes.py
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def bad_codes(results) -> list[tuple[str, int, float]]:
    import cupy
    from gpu_rounding import q8_blocks
    rows = []
    for what, got, ref, res in results:
        if hasattr(res, "q") and "decode" in what:
            codes, _, _ = q8_blocks(got.reshape(got.shape[0], -1))
            q = cupy.asnumpy(res.q).view(np.int8).reshape(codes.shape)
            err = float(np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) + 1e-30))
            rows.append((what, int((q != codes).sum()), err))
    return rows


def run(name: str, ctx, mode: str = "graph") -> None:
    import test_attention_gpu as t
    with ctx():
        rows = bad_codes(t.gemma_decode(9, 256, mode, {}))
    print(f"{name:<13s} {mode:<5s} " + " ".join(f"[{w.split(',')[0]}: {n} codes, err {e:.1e}]" for w, n, e in rows),
          flush=True)


def main() -> int:
    import cupy
    import glimmer_cupy.kernels.launch as launch
    run("default pool", contextlib.nullcontext)
    run("default pool", contextlib.nullcontext, "pdl")
    pool = cupy.cuda.MemoryPool()
    run("own pool", lambda: cupy.cuda.using_allocator(pool.malloc))
    on = launch.overlapped
    launch.overlapped = lambda _=True: on(False)          # gemma_decode imports it at each call
    run("pdl off", contextlib.nullcontext)
    return 0


if __name__ == "__main__":
    sys.exit(main())
