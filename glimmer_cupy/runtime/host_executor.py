"""Runs steps on the NumPy path: the decoder's reference ops over a float32 KV pool."""

from __future__ import annotations

import numpy as np

from ..model.decoder import Decoder
from ..model.step import StepBatch
from ..ops import sample_rows
from ..reference.matmul import dense


class HostExecutor:
    def __init__(self, decoder: Decoder, n_cells: int):
        cfg = decoder.cfg
        self.decoder = decoder
        self.n_cells = n_cells
        shape = (n_cells, cfg.n_kv_heads, cfg.head_dim)
        self.kv = [(np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in range(cfg.n_layers)]
        # decode every matrix now, as a GPU executor uploads its weights before the first step,
        # so that step timings measure steps
        w = decoder.w
        for lin in [w.head] + [m for l in w.layers for m in (l.qkv, l.wo, l.gate_up, l.down)]:
            for part in lin.parts:
                dense(part)

    def logits(self, step: StepBatch) -> np.ndarray:
        """(K, vocab) float32 logits of the step's logit rows."""
        return self.decoder.forward(step, self.kv)

    def sample(self, logits: np.ndarray, params, positions) -> tuple[np.ndarray, np.ndarray]:
        return sample_rows(logits, params, positions)

    def run_step(self, step: StepBatch, params, positions) -> tuple[np.ndarray, np.ndarray]:
        """Run a step and sample its logit rows (params, positions: one per logit row)."""
        logits = self.logits(step)
        if not len(step.logit_rows):
            return np.zeros(0, np.int32), np.zeros(0, np.int32)
        return self.sample(logits, params, positions)
