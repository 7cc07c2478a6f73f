"""Runs steps on the NumPy path: the decoder's reference ops over a float32 KV pool.

Steps run synchronously: launch() returns once the step is done, with a feed (runtime/pipeline.py)
resolved from the last step's tokens on the host, so generate()'s overlapped loop gives the same
tokens here as on the device. generate() does not overlap on this executor unless asked (overlap):
nothing runs while the host plans, and a step launched past a stop token would cost a forward.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..model.decoder import Decoder
from ..model.step import StepBatch
from ..ops import feed_tokens_, sample_rows
from ..reference.matmul import dense
from .pipeline import Ready, check_feed


class HostExecutor:
    overlap = False                      # generate()'s default

    def __init__(self, decoder: Decoder, n_cells: int):
        cfg = decoder.cfg
        self.decoder = decoder
        self.n_cells = n_cells
        shape = (n_cells, cfg.n_kv_heads, cfg.head_dim)
        self.kv = [(np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in range(cfg.n_layers)]
        self._last = np.zeros(0, np.int32)      # the tokens the last launch sampled (a feed takes them)
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
        return self.launch(step, params, positions).result()

    def launch(self, step: StepBatch, params, positions, feed=None) -> Ready:
        """run_step, with feed: per token row -1 (its id in step.tokens) or j (row j of the tokens
        the previous launch sampled)."""
        feed = check_feed(feed, step.n_tokens, len(self._last))
        if feed is not None:
            tokens = np.array(step.tokens, np.int32)
            feed_tokens_(tokens, feed, self._last)
            step = dataclasses.replace(step, tokens=tokens)
        logits = self.logits(step)
        if not len(step.logit_rows):
            self._last = np.zeros(0, np.int32)
            return Ready(self._last, np.zeros(0, np.int32))
        tokens, flags = self.sample(logits, params, positions)
        self._last = np.asarray(tokens, np.int32)
        return Ready(tokens, flags)
