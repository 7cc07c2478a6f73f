"""What the LM head reads in a one-token decode step (model/decoder.py: HEAD_READS_NORM_CODES), in a
model's own decode step (glimmer_cupy/benchmarks/model_ab.py).

Arms:
  norm codes   the final norm makes the row's int8 codes and the head reads them (the default)
  gather       the final norm's plain rows, gathered by logit_rows, then quantize_x before the head

    PYTHONPATH=$PWD python3 bench/ab_head_input_model.py -m SMOLLM2.gguf [--synthetic qwen3-0.6b] [--out FILE]
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.model_ab import main  # noqa: E402

decoder = importlib.import_module("glimmer_cupy.model.decoder")

ARMS = {
    "norm codes": {(decoder, "HEAD_READS_NORM_CODES"): True},
    "gather": {(decoder, "HEAD_READS_NORM_CODES"): False},
}

if __name__ == "__main__":
    sys.exit(main(__doc__, ARMS))
