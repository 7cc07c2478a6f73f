"""Every layer of a one-token step in one cluster launch (model/fused_stack.py, decode_stack.cu)
against the decoder's ops, in a model's own decode step (glimmer_cupy/benchmarks/model_ab.py).
The stack serves SmolLM2-135M (llama, Q4_1, head_dim 64); other models run the ops in both arms.

Arms:
  ops     the decoder's kernels, ~9 a layer
  stack   one launch for all the layers, then the LM head

    PYTHONPATH=$PWD python3 bench/ab_decode_stack_model.py -m SMOLLM2.gguf [--rounds N] [--out FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.model_ab import main  # noqa: E402
from glimmer_cupy.model import fused_stack  # noqa: E402

ARMS = {
    "ops": {(fused_stack, "ENABLED"): False},
    "stack": {(fused_stack, "ENABLED"): True},
}

if __name__ == "__main__":
    sys.exit(main(__doc__, ARMS))
