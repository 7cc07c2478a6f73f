"""gemv_dp4a's bucket on the small-block types with each warp's rows staged in shared memory first
(ops/matmul.py: STAGED_TYPES, gemv_staged.cu) against gemv_dp4a_kernel, in a model's own decode step
(glimmer_cupy/benchmarks/model_ab.py). Both real models' LM heads are Q8_0; SmolLM2's layers are
Q4_1, Gemma 3's Q5_0 and Q8_0 beside K-quants.

Arms:
  dp4a          every small-block matmul on gemv_dp4a_kernel
  staged q8_0   Q8_0 staged (the library's table)
  staged all    Q4_0, Q4_1, Q5_0 and Q8_0 staged
  staged q8_0 r4  Q8_0 staged at most 4 rows a warp

    PYTHONPATH=$PWD python3 bench/ab_gemv_staged_model.py -m SMOLLM2.gguf -m GEMMA3.gguf [--out FILE]
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.model_ab import main  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType  # noqa: E402

matmul = importlib.import_module("glimmer_cupy.ops.matmul")

ARMS = {
    "dp4a": {(matmul, "STAGED_TYPES"): frozenset()},
    "staged q8_0": {(matmul, "STAGED_TYPES"): frozenset({QType.Q8_0})},
    "staged all": {(matmul, "STAGED_TYPES"): frozenset(matmul.STAGED_KERNEL_TYPES)},
    "staged q8_0 r4": {(matmul, "STAGED_TYPES"): frozenset({QType.Q8_0}), (matmul, "STAGED_ROWS"): (4, 2, 1)},
}

if __name__ == "__main__":
    sys.exit(main(__doc__, ARMS))
