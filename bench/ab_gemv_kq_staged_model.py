"""gemv_kq's Q4_K matrices staged in shared memory before the wait (ops/matmul.py: KQ_STAGED_TYPES,
gemv_kq_staged.cu) against gemv_kq_kernel, in a model's own decode step
(glimmer_cupy/benchmarks/model_ab.py). On Qwen3-8B the rule stages o (4096x4096) on every layer and
q|k|v (6144x4096) where v is Q4_K and, where it fits one wave, the Q4_K
down projection (4096x12288, 28 MB); on 0.6B nothing (its matrices keep the launch-bound gemv_kq).

Arms:
  gemv_kq        every Q4_K matrix on gemv_kq_kernel
  staged         the library's rule: the fewest row sets a block that fit one wave
  staged T>=4    at least 4 row sets (8 rows) a block: fewer, larger blocks
  staged T>=8    at least 8
  staged <=16MB  matrices of at most 16 MB only (o and q|k|v, not the 28 MB Q4_K down projection)
  early N        N KB an SM copied before the wait (the library's KQ_STAGED_EARLY_SM_BYTES otherwise);
                 all: every byte
  carveout none  the staged kernel with no shared memory preference (the driver's choice)
  all carveout 100  gemv_kq and its pair kernel prefer all shared memory too, as attention does
  gemv_kq carveout N  nothing staged, gemv_kq preferring N% shared memory (0: all L1)

    PYTHONPATH=$PWD python3 bench/ab_gemv_kq_staged_model.py --synthetic qwen3-8b [--out FILE]
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.model_ab import main  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType  # noqa: E402

matmul = importlib.import_module("glimmer_cupy.ops.matmul")


def at_least(t: int) -> dict:
    return {m: tuple(s for s in ts if s >= t) for m, ts in matmul.KQ_STAGED_KERNEL_SETS.items()}


ARMS = {
    "gemv_kq": {(matmul, "KQ_STAGED_TYPES"): frozenset()},
    "staged": {(matmul, "KQ_STAGED_TYPES"): frozenset({QType.Q4_K})},
    "staged T>=4": {(matmul, "KQ_STAGED_TYPES"): frozenset({QType.Q4_K}), (matmul, "KQ_STAGED_SETS"): at_least(4)},
    "staged T>=8": {(matmul, "KQ_STAGED_SETS"): at_least(8)},
    "staged <=16MB": {(matmul, "KQ_STAGED_MAX_BYTES"): 16 << 20},
    "early 0": {(matmul, "KQ_STAGED_EARLY_SM_BYTES"): 0},
    "early 16": {(matmul, "KQ_STAGED_EARLY_SM_BYTES"): 16 << 10},
    "early 64": {(matmul, "KQ_STAGED_EARLY_SM_BYTES"): 64 << 10},
    "early all": {(matmul, "KQ_STAGED_EARLY_SM_BYTES"): 1 << 30},
    "carveout none": {(matmul, "KQ_STAGED_CARVEOUT"): None},
    "all carveout 100": {(matmul, "KQ_CARVEOUT"): 100},
    "gemv_kq carveout 100": {(matmul, "KQ_STAGED_TYPES"): frozenset(), (matmul, "KQ_CARVEOUT"): 100},
    "gemv_kq carveout 0": {(matmul, "KQ_STAGED_TYPES"): frozenset(), (matmul, "KQ_CARVEOUT"): 0},
}

if __name__ == "__main__":
    sys.exit(main(__doc__, ARMS))
