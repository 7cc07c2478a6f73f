"""The short kernels' launch shapes (ops/norm.py, ops/activation.py, ops/prepare_qkv.py,
ops/sampling.py), chosen alone or by reasoning, against neighbours of them in a model's own decode
step (glimmer_cupy/benchmarks/model_ab.py).

Arms:
  rule            the library's shapes
  norm 2 packs    RMSNorm rows with two packs a thread (half the threads: 512 at Qwen3-8B's 4096)
  act 128         the gated activation in blocks of 128 threads instead of 256
  prepare 4 warps prepare_qkv with 4 warps a token instead of 8
  sample cN       every row sampled by a cluster of N 1024-thread blocks (the rule: 8 up to 16 rows;
                  its edges were set from the SM count, never measured in a step)

    PYTHONPATH=$PWD python3 bench/ab_small_ops_model.py --synthetic qwen3-8b [--arms ...] [--out FILE]
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.model_ab import main  # noqa: E402

# the modules (glimmer_cupy.ops re-exports ops of the same names)
norm = importlib.import_module("glimmer_cupy.ops.norm")
activation = importlib.import_module("glimmer_cupy.ops.activation")
prepare_qkv = importlib.import_module("glimmer_cupy.ops.prepare_qkv")
sampling = importlib.import_module("glimmer_cupy.ops.sampling")
SHAPE = norm._launch_shape


def two_packs(rows: int, d: int, vec: int) -> tuple[tuple[int], tuple[int, int]]:
    (_,), (tx, _) = SHAPE(rows, d, vec)
    tx = max(32, tx // 2)
    ty = max(1, 256 // tx)
    return ((rows + ty - 1) // ty,), (tx, ty)


ARMS = {
    "rule": {},
    "norm 2 packs": {(norm, "_launch_shape"): two_packs},
    "act 128": {(activation, "_THREADS"): 128},
    "prepare 4 warps": {(prepare_qkv, "WARPS"): 4},
    **{f"sample c{c}": {(sampling, "CLUSTER"): ((None, c),)} for c in (1, 2, 4)},
}

if __name__ == "__main__":
    sys.exit(main(__doc__, ARMS))
