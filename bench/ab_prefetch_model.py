"""How many bytes of a layer's weights its decode attention asks into L2 as its blocks leave
(model/decoder.py: L2_PREFETCH_BYTES; ops/prefetch.py), in a model's own decode step
(glimmer_cupy/benchmarks/model_ab.py).

Arms:
  off     none
  rule    the decoder's default (L2_PREFETCH_BYTES where a layer's gate/up reaches L2_PREFETCH_MIN_GATE_UP)
  N MB    the layer's gate/up, then down weights, the first N MB of them (at most three ranges),
          asked for by attention's pushing blocks as they leave, whatever the layer's size

    PYTHONPATH=$PWD python3 bench/ab_prefetch_model.py --synthetic qwen3-8b [--arms "off,rule,6 MB"] [--out FILE]
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
    "rule": {},
    **{f"{mb} MB": {(decoder, "L2_PREFETCH_BYTES"): mb << 20, (decoder, "L2_PREFETCH_MIN_GATE_UP"): 0}
       for mb in (1, 2, 3, 4, 6, 8, 16)},
}

if __name__ == "__main__":
    sys.exit(main(__doc__, ARMS))
