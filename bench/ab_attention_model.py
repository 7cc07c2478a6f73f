"""Decode attention's launch choices (ops/attention.py: stream_splits, STREAM_DEPTH) against
neighbours of them in a model's own decode step (glimmer_cupy/benchmarks/model_ab.py).

Arms:
  rule        the library's choices
  old rule    below 16 units the wave's split count whatever the width (no width capped)
  depth 2     two K/V stages a warp instead of three (head dims 64 and 128; alone at batch 1, 2 stages
              timed 0.4-0.6 us faster at 8k and 32k, the same at 128k: bench/results/NOTES.md, the
              twenty-sixth session)
  splits x2   twice the splits of a decode step (at most MAX_SPLITS)
  splits /2   half of them (at least one)
  splits <= N the rule's splits, at most N (so a cluster of at most N blocks)
  no cluster  the rule's splits merged through global memory (stream_cluster_cap 1)
  cluster <= 8 at most 8 blocks a cluster; more splits merge through global memory
  early       old K/V rows copied before pdl_wait by the stream kernel at every head dim (the rule
              before the thirty-second session; stream_early True)
  no early    none copied before pdl_wait by either tensor-core kernel (stream_early, mma_early False)
  depth 2 early  both of depth 2 and early
  spread      cluster launches placed by the spread policy (kernels/launch.py: CLUSTER_POLICY)
  balanced    cluster launches placed by the load-balancing policy

    PYTHONPATH=$PWD python3 bench/ab_attention_model.py --synthetic qwen3-8b [--prompt 512] [--out FILE]
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.model_ab import main  # noqa: E402

attention = importlib.import_module("glimmer_cupy.ops.attention")   # the module (ops.attention is the op)
launch = importlib.import_module("glimmer_cupy.kernels.launch")

RULE = attention.stream_splits
CLUSTER_CAP = attention.stream_cluster_cap


def splits_scaled(factor: float):
    def splits(units: int, max_len: int, sms: int = 132) -> int:
        return max(1, min(attention.MAX_SPLITS, int(RULE(units, max_len, sms) * factor)))
    return splits


def splits_capped(most: int):
    def splits(units: int, max_len: int, sms: int = 132) -> int:
        return min(most, RULE(units, max_len, sms))
    return splits


ARMS = {
    "rule": {},
    "old rule": {(attention, "STREAM_CAPPED_WIDTH"): 0},
    "depth 2": {(attention, "STREAM_DEPTH"): {**attention.STREAM_DEPTH, 64: 2, 128: 2}},
    "splits x2": {(attention, "stream_splits"): splits_scaled(2)},
    "splits /2": {(attention, "stream_splits"): splits_scaled(0.5)},
    **{f"splits <= {n}": {(attention, "stream_splits"): splits_capped(n)} for n in (4, 8, 16)},
    "no cluster": {(attention, "stream_cluster_cap"): lambda d, stages: 1},
    "cluster <= 8": {(attention, "stream_cluster_cap"): lambda d, stages: min(8, CLUSTER_CAP(d, stages))},
    "early": {(attention, "stream_early"): lambda d: True},
    "no early": {(attention, "stream_early"): lambda d: False, (attention, "mma_early"): lambda d: False},
    "depth 2 early": {(attention, "STREAM_DEPTH"): {**attention.STREAM_DEPTH, 64: 2, 128: 2},
                      (attention, "stream_early"): lambda d: True},
    "spread": {(launch, "CLUSTER_POLICY"): launch.CLUSTER_POLICIES["spread"]},
    "balanced": {(launch, "CLUSTER_POLICY"): launch.CLUSTER_POLICIES["load-balancing"]},
}

if __name__ == "__main__":
    sys.exit(main(__doc__, ARMS))
