"""How many bytes of a layer's weights its decode attention brings into L2 while it runs
(model/decoder.py: L2_PREFETCH_BYTES; ops/prefetch.py), in a model's own decode step
(glimmer_cupy/benchmarks/model_ab.py).

Arms:
  off     none
  N MB    the layer's gate/up, then down weights, the first N MB of them (at most three ranges),
          asked for by attention's pushing blocks as they leave

    PYTHONPATH=$PWD python3 bench/ab_prefetch_model.py --synthetic qwen3-8b [--arms "off,12 MB"] [--out FILE]
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.model_ab import main  # noqa: E402

decoder = importlib.import_module("glimmer_cupy.model.decoder")

ARMS = {
    "off": {(decoder, "L2_PREFETCH_BYTES"): 0},
    **{f"{mb} MB": {(decoder, "L2_PREFETCH_BYTES"): mb << 20} for mb in (2, 4, 8, 16)},
}

if __name__ == "__main__":
    sys.exit(main(__doc__, ARMS))
